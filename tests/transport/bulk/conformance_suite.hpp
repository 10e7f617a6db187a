// The bulk-link conformance suite: the same tests for every backend (tcp, shm, rdma).
//
// How a backend runs it: compile conformance_suite.cpp into your test executable (it holds the
// TEST_P bodies and no instantiation), link tessera::transport, and instantiate the suite with your
// backend in a file of your own:
//
//   #include "tests/transport/bulk/conformance_suite.hpp"
//   INSTANTIATE_TEST_SUITE_P(rdma, bulk_conformance,
//                            ::testing::Values(tessera::transport::bulk::backend_kind::rdma),
//                            tessera::transport::bulk::testing::backend_name);
//
// Two-process tests exec the helper binary tessera_bulk_peer; its path comes from the compile
// definition TESSERA_BULK_PEER_PATH (set by tests/transport/bulk/CMakeLists.txt; add the same
// definition and a dependency on tessera_bulk_peer to your executable; support.cpp goes into both).
// A backend adjusts its link options (e.g. the rdma device) in testing::default_options()
// (support.cpp), which the peer process uses too.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/transport/bulk/support.hpp"
#include "transport/bulk/link.hpp"

namespace tessera::transport::bulk::testing {

/// Backend name for parametrised test names.
std::string backend_name(const ::testing::TestParamInfo<backend_kind>& info);

struct link_pair {
  std::unique_ptr<link> a;
  std::unique_ptr<link> b;
};

/// Prepares and connects two ends of a link in this process (b connects from a second thread).
result<link_pair> connect_pair(backend_kind kind, const link_options& a_options,
                               const link_options& b_options);

/// Waits (polling, up to `patience`) for the next completion. Fails the test on timeout.
completion next_completion(link& l);
/// Collects completions until one of `kind` arrives; returns it (the others are dropped).
completion wait_for_kind(link& l, completion_kind kind);
/// Collects completions until one of each wanted kind has arrived (in any order); returns them in
/// the order of `wanted`. Completions of other kinds are dropped. Fails the test on timeout/down.
std::vector<completion> collect(link& l, const std::vector<completion_kind>& wanted);
/// Drains completions until link_down; returns it. Fails the test when it does not come.
completion wait_for_down(link& l);

}  // namespace tessera::transport::bulk::testing

/// The suite. Parameter: the backend under test.
class bulk_conformance : public ::testing::TestWithParam<tessera::transport::bulk::backend_kind> {
 protected:
  tessera::transport::bulk::backend_kind kind() const { return GetParam(); }
  tessera::transport::bulk::link_options options() const {
    return tessera::transport::bulk::testing::default_options(kind());
  }
};
