# libFuzzer targets. GCC has no libFuzzer, so each fuzz target is compiled by Debian's clang in a
# custom command of its own (not through the GCC toolchain of the rest of the build) and registered
# as a ctest test that fuzzes for a bounded time. A crash, a sanitizer report or a leak fails it.
#
#   tessera_add_fuzz_target(NAME SOURCES a.cpp b.cpp ... [SECONDS 20] [LINK -lfmt ...]
#                           [DEFINES X=1 ...] [CORPUS dir])
#
# SOURCES are every translation unit the target needs (the fuzz entry with LLVMFuzzerTestOneInput
# plus the library sources under test), relative to the calling CMakeLists.txt or absolute.
find_program(TESSERA_CLANGXX NAMES clang++-14 clang++)

function(tessera_add_fuzz_target name)
  cmake_parse_arguments(ARG "" "SECONDS;CORPUS" "SOURCES;LINK;DEFINES" ${ARGN})
  if(NOT TESSERA_CLANGXX)
    message(FATAL_ERROR "fuzz target ${name}: clang++ not found (scripts/bootstrap installs clang)")
  endif()
  if(NOT ARG_SECONDS)
    set(ARG_SECONDS 20)
  endif()
  set(srcs)
  foreach(s ${ARG_SOURCES})
    get_filename_component(abs ${s} ABSOLUTE BASE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
    list(APPEND srcs ${abs})
  endforeach()
  # Every target links Debian's shared spdlog and fmt (LINK -lspdlog -lfmt); without these defines
  # spdlog's headers compile its whole implementation into each file that logs (actors/base/base.cpp:
  # 33 s of clang per target, 3 s with them).
  set(defs -DSPDLOG_COMPILED_LIB -DSPDLOG_SHARED_LIB -DSPDLOG_FMT_EXTERNAL -DFMT_SHARED)
  foreach(d ${ARG_DEFINES})
    list(APPEND defs -D${d})
  endforeach()
  set(out ${CMAKE_CURRENT_BINARY_DIR}/${name})
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${TESSERA_CLANGXX} -std=c++20 -gline-tables-only -O1 -fsanitize=fuzzer,address,undefined
            -fno-sanitize-recover=all -I${PROJECT_SOURCE_DIR} ${defs} ${srcs} -o ${out}
            ${ARG_LINK}
    DEPENDS ${srcs}
    COMMENT "clang++ libFuzzer target ${name}"
    VERBATIM)
  add_custom_target(${name}_build ALL DEPENDS ${out})
  set(corpus ${CMAKE_CURRENT_BINARY_DIR}/${name}_corpus)
  set(seed_args)
  if(ARG_CORPUS)
    get_filename_component(seed ${ARG_CORPUS} ABSOLUTE BASE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
    set(seed_args ${seed})
  endif()
  # The working corpus lives in the build tree so a run never writes into the sources.
  add_test(NAME fuzz.${name}
           COMMAND ${CMAKE_COMMAND} -E env ASAN_OPTIONS=detect_leaks=1
                   ${out} -max_total_time=${ARG_SECONDS} -rss_limit_mb=2048 -timeout=10
                   ${corpus} ${seed_args})
  set_tests_properties(fuzz.${name} PROPERTIES LABELS "unit;fuzz"
                       FIXTURES_REQUIRED ${name}_corpus_dir)
  add_test(NAME fuzz.${name}.corpus_dir COMMAND ${CMAKE_COMMAND} -E make_directory ${corpus})
  set_tests_properties(fuzz.${name}.corpus_dir PROPERTIES FIXTURES_SETUP ${name}_corpus_dir
                       LABELS "unit;fuzz")
endfunction()
