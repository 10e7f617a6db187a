# Optimisation levels in the sanitizer builds (the asan and tsan presets: CI, scripts/test).
#
# Their default is -Og (CMakePresets.json): with ASan+UBSan instrumentation the compiler's time goes
# almost all into optimising and generating code (mesh/runtime's batch: 80% of 132 s at -O1, parsing
# 11%), and -Og takes 35-45% less of it per batch (-O0 no less than -Og: ASan then instruments
# every load and store). Code the tests run hot keeps more optimisation, because the suite is
# CPU-bound on 2 cores and every second a test computes is CI time:
#   -O2  inference/kernels: every serving, chaos and example test runs peers that decode tokens
#        (in ASan builds the SIMD kernel files are also left uninstrumented: see that CMakeLists);
#   -O1  the protocol state machines and the actor runtime that the simulator's many-seed tests
#        run (-Og made those tests 24% slower);
#   -O0  test code and the tessera executable's commands: glue.
# Sanitizer checks stay on everywhere else; release builds are untouched.
function(tessera_sanitizer_build_opt target level)
  if(TESSERA_SANITIZE AND CMAKE_BUILD_TYPE STREQUAL "Debug")
    target_compile_options(${target} PRIVATE ${level})
  endif()
endfunction()

# Test code (everything under tests/ but the kernel tests' instrumented kernel copies): -O0, and in
# the ASan+UBSan build without UBSan's null, alignment and vptr checks. Those three were two thirds
# of the compile time a test batch spends on sanitizers (tessera_actors_tests' batch: 52 s with all
# checks, 34 s without the three, 26 s with no sanitizer), and test files are ~45% of the build.
# What stays: ASan everywhere, UBSan's other checks (overflow, shift, bounds, enum, bool, return,
# ...) in test code, and all of UBSan in the code under test. The one loss beyond the tests' own
# code: an inline library function that a test calls out of line may keep the test file's copy
# (the linker keeps the first), which lacks the three checks; a null dereference there still
# faults and ASan reports it with a stack.
function(tessera_sanitizer_test_code target)
  tessera_sanitizer_build_opt(${target} -O0)
  if(TESSERA_SANITIZE MATCHES "undefined" AND CMAKE_BUILD_TYPE STREQUAL "Debug")
    target_compile_options(${target} PRIVATE -fno-sanitize=null,alignment,vptr)
  endif()
endfunction()
