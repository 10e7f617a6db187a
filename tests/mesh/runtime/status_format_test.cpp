// `tessera status` as a person reads it: format_status over a status document.
#include <string>

#include <gtest/gtest.h>

#include "mesh/runtime/runtime.hpp"

namespace tessera::mesh::runtime {
namespace {

std::string doc(const std::string& rdma_devices, const std::string& extra_serving = "") {
  return R"({"node": {"id": "0123456789abcdef0123456789abcdef", "endpoint": "tcp://127.0.0.1:7400",
             "role": "leader", "term": 2, "leader": "0123456789abcdef0123456789abcdef"},
    "view": {"epoch": {"term": 2, "version": 5}, "leader": "0123456789abcdef0123456789abcdef",
      "members": [{"id": "0123456789abcdef0123456789abcdef", "status": "alive",
                   "address": "tcp://10.0.2.15:7400", "cores": 4, "memory_total_mb": 8000,
                   "memory_free_mb": 6000, "has_rdma": true, "rdma_devices": )" +
         rdma_devices + R"(, "models": ["tiny.gguf"]}],
      "links": []},
    "serving": {"models": [{"name": "tiny", "weights": "loading", "weights_loaded_bytes": 30,
                            "weights_bytes": 120}],
                "request_port": 7402, "response_port": 7403, "streams": [], "accepted": 4,
                "completed": 3, "tokens": 99, "rejected": 0, "malformed": 0, "passes": 40,
                "pass_streams": 130)" + extra_serving + R"(}})";
}

TEST(StatusFormat, RdmaPortsAndTheirGidsAreShown) {
  auto text = format_status(doc(R"j(["rxe0/1 ::ffff:10.0.2.15 (RoCE v2, GID index 1)"])j"));
  ASSERT_TRUE(text) << text.error().describe();
  EXPECT_NE(text->find("rdma port rxe0/1 ::ffff:10.0.2.15 (RoCE v2, GID index 1)"),
            std::string::npos)
      << *text;
  auto none = format_status(doc("[]"));
  ASSERT_TRUE(none) << none.error().describe();
  EXPECT_EQ(none->find("rdma port"), std::string::npos) << *none;
}

// The serving line: a model's weights loading (with progress) and the mean batch of its passes.
TEST(StatusFormat, ServingShowsWeightsLoadingAndTheMeanBatch) {
  auto text = format_status(doc("[]"));
  ASSERT_TRUE(text) << text.error().describe();
  EXPECT_NE(text->find("serving models tiny (loading 25%)"), std::string::npos) << *text;
  EXPECT_NE(text->find("mean batch 3.25"), std::string::npos) << *text;
}

// Whether the client endpoints require the cluster's client access key (--client-auth).
TEST(StatusFormat, ClientAuthenticationIsShown) {
  auto open = format_status(doc("[]"));
  ASSERT_TRUE(open) << open.error().describe();
  EXPECT_NE(open->find("clients open (no --client-auth)"), std::string::npos) << *open;
  auto authed = format_status(
      doc("[]", R"(, "client_auth": {"required": true, "admitted": 7, "refused": 2})"));
  ASSERT_TRUE(authed) << authed.error().describe();
  EXPECT_NE(authed->find("clients authenticated (--client-auth): admitted 7  refused 2"),
            std::string::npos)
      << *authed;
  EXPECT_EQ(authed->find("clients open"), std::string::npos) << *authed;
}

// The client ports' connection bounds and the fair share among clients (issue 32).
TEST(StatusFormat, ClientConnectionsAndFairShareAreShown) {
  auto text = format_status(doc("[]", R"(, "connections": {"open": 128, "refused": 472,
      "per_address_bound": 256, "bound": 128},
    "fair_share": {"connections": 9, "made_way": 2, "preempted": 5})"));
  ASSERT_TRUE(text) << text.error().describe();
  EXPECT_NE(text->find("clients connections 128 open (bound 128, 256 per address)  refused 472  "
                       "fair share: 5 paused, 2 made way"),
            std::string::npos)
      << *text;
  auto older = format_status(doc("[]"));  // a peer that sends neither
  ASSERT_TRUE(older) << older.error().describe();
  EXPECT_EQ(older->find("clients connections"), std::string::npos) << *older;
}

// Model distribution: a fetch in progress (with its holder), a failed one (with why), and what a
// holder served.
TEST(StatusFormat, FetchesAndSharingAreShown) {
  auto text = format_status(doc("[]", R"(, "fetches": [
      {"model": "big", "state": "fetching", "from": "fedcba9876543210fedcba9876543210",
       "bytes_done": 3145728, "bytes_total": 12582912},
      {"model": "other", "state": "failed", "from": "", "bytes_done": 0, "bytes_total": 0,
       "error": "no live peer holds its content"}],
    "share": {"sessions": 2, "chunks": 22, "bytes": 23068672})"));
  ASSERT_TRUE(text) << text.error().describe();
  EXPECT_NE(text->find("fetch   big                  fetching 3/12 MiB (25%) from "
                       "fedcba9876543210fedcba9876543210"),
            std::string::npos)
      << *text;
  EXPECT_NE(text->find("other                failed 0/0 MiB (0%): no live peer holds its content"),
            std::string::npos)
      << *text;
  EXPECT_NE(text->find("shared  2 fetch(es) served, 22 MiB in 22 chunks"), std::string::npos)
      << *text;
  auto none = format_status(doc("[]"));
  ASSERT_TRUE(none);
  EXPECT_EQ(none->find("fetch "), std::string::npos) << *none;
}

}  // namespace
}  // namespace tessera::mesh::runtime
