# Project-wide warning flags, applied per target with tessera_target_warnings(). Third-party headers
# come in as SYSTEM includes so -Werror only judges our own code.
function(tessera_target_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wshadow=local -Wnon-virtual-dtor
                                           -Wno-missing-field-initializers)
  # GCC 12 at -O3 reports std::string concatenation inside libstdc++ as overlapping memcpy
  # (GCC bug 105329, a false positive): Release builds of the tests stopped on it.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -Wno-restrict)
  endif()
  # A unity build (the sanitizer presets: CI) includes each .cpp into a batch file. Two GCC 12
  # warnings then misfire: a class a .cpp defines with a member of a type from that .cpp's anonymous
  # namespace no longer sits in "the main file", so it is flagged as if a header did (each .cpp is
  # still compiled once); and with more of msgpack inlined into one function, msgpack::zone's own
  # operator new/delete pair (malloc/free) is reported as mismatched. The release preset keeps
  # both warnings (with -Werror), and ASan checks every new/free pairing at run time.
  get_target_property(unity ${target} UNITY_BUILD)
  if(unity AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -Wno-subobject-linkage -Wno-mismatched-new-delete)
  endif()
  if(TESSERA_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# Adds every immediate sub-folder of the current source folder that has a CMakeLists.txt, in name
# order. Lets a module grow sub-concepts (transport/control, transport/bulk, ...) without a shared
# list that every change must edit.
function(tessera_add_subdirs)
  file(GLOB children LIST_DIRECTORIES true ${CMAKE_CURRENT_SOURCE_DIR}/*)
  list(SORT children)
  foreach(dir ${children})
    if(IS_DIRECTORY ${dir} AND EXISTS ${dir}/CMakeLists.txt)
      add_subdirectory(${dir})
    endif()
  endforeach()
endfunction()

# A module made of sub-libraries: tessera::<module> is an INTERFACE target that links every
# tessera_<module>_<sub> library its sub-folders define.
function(tessera_module module)
  add_library(tessera_${module} INTERFACE)
  add_library(tessera::${module} ALIAS tessera_${module})
  tessera_add_subdirs()
  file(GLOB children LIST_DIRECTORIES true ${CMAKE_CURRENT_SOURCE_DIR}/*)
  foreach(dir ${children})
    get_filename_component(sub ${dir} NAME)
    if(TARGET tessera_${module}_${sub})
      target_link_libraries(tessera_${module} INTERFACE tessera_${module}_${sub})
    endif()
  endforeach()
endfunction()
