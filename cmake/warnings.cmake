# Project-wide warning flags, applied per target with tessera_target_warnings(). Third-party headers
# come in as SYSTEM includes so -Werror only judges our own code.
function(tessera_target_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wshadow=local -Wnon-virtual-dtor
                                           -Wno-missing-field-initializers)
  if(TESSERA_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
