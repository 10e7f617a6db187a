# Every dependency is a Debian package installed by scripts/bootstrap.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(msgpack CONFIG REQUIRED) # Debian ships it as msgpackc-cxx
find_package(cppzmq REQUIRED)
find_package(nlohmann_json REQUIRED)
pkg_check_modules(IBVERBS REQUIRED IMPORTED_TARGET libibverbs)
pkg_check_modules(AVAHI REQUIRED IMPORTED_TARGET avahi-client)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
if(TESSERA_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
if(TESSERA_BUILD_BENCH)
  find_package(benchmark REQUIRED)
  # CAF 0.17 (Debian libcaf-dev) is only a comparison peer for the actor benchmarks.
  find_library(CAF_CORE_LIB caf_core)
endif()

# msgpack-cxx without Boost: we only use its core pack/unpack.
add_library(tessera_msgpack INTERFACE)
target_link_libraries(tessera_msgpack INTERFACE msgpackc-cxx)
target_compile_definitions(tessera_msgpack INTERFACE MSGPACK_NO_BOOST)
