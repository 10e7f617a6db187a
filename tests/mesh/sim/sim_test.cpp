#include <cstdio>
#include <gtest/gtest.h>

#include "mesh/sim/checkers.hpp"
#include "mesh/sim/mesh_node.hpp"

namespace tessera::mesh::sim {
namespace {

TEST(SimSmoke, ColdStartConverges) {
  for (std::size_t n : {1, 3, 5}) {
    auto w = make_mesh_world(42, n, cluster_options(n));
    election_checker check(*w, 1000);
    w->set_observer([&] { check.observe(); });
    for (node_id id : w->ids()) w->start(id);
    auto t = run_until_converged(*w, 10'000);
    ASSERT_TRUE(t.has_value()) << describe(*w) << " " << converged(*w).value_or("");
    std::printf("n=%zu converged after %llu ms\n", n, static_cast<unsigned long long>(*t));
    EXPECT_TRUE(check.violations().empty());
  }
}

}  // namespace
}  // namespace tessera::mesh::sim
