// Election scenarios in the style of etcd raft's testdata: each file in testdata/ is a readable
// sequence of steps and expectations, run on the deterministic simulator (mesh/sim) with the real
// membership + election state machines and msgpack on the wire.
//
// Commands (one per line, '#' starts a comment):
//   cluster N [serving] [start A B ..] [seed S]  nodes 1..N (all started unless `start` lists
//                                      some); `serving`: every node holds a small model, and
//                                      the plan checker watches the leader's plans
//   start X | crash X | restart X | pause X | resume X | leave X
//   bump-durable-term X K             add K to X's stored term (X must be down)
//   partition A B | C D | ...          clean partition;  oneway A -> B;  bridge A B | X | C D
//   heal                               remove every partition / one-way block
//   fault <command>                    a `tessera fault` command (docs/FAULTS.md; nodes are
//                                      named 1..N): partitions, drop/delay/... rules, clocks
//   run MS                             advance simulated time
//   converge MS                        run until one leader, all agreeing (fails after MS)
//   mark                               remember terms, the leader and the election count
//   repeat N ... end                   repeat the enclosed lines
//   expect leader X                    X leads; every up node that X can reach follows X
//   expect leader-in A B ..            exactly one of these leads, and they all follow it
//   expect no-leader A B ..            none of these leads or follows anyone
//   expect role X follower|pre_candidate|candidate|leader
//   expect term-unchanged A B ..       term equals the term at `mark`
//   expect term-increased A            term above the term at `mark`
//   expect leader-unchanged            the leader at `mark` is the leader now
//   expect elections-since-mark N      nodes that became leader since `mark` (churn)
//   expect members X = A B ..          X's member config
//   expect committed X                 X's config is committed
//   expect sees X Y alive|suspect|dead|left   X's membership view of Y
//   expect no-violations               the history checkers found nothing
//   expect plan-converged              every up node holds the leader's plan, and it serves
//   expect plan-unchanged              the leader's plan epoch is the one at `mark`
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "mesh/sim/checkers.hpp"
#include "mesh/sim/mesh_node.hpp"
#include "transport/faults/fault_policy.hpp"

namespace tessera::mesh::sim {
namespace {

struct line {
  int number = 0;
  std::vector<std::string> words;
};

std::vector<line> read_script(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<line> out;
  std::string text;
  int n = 0;
  while (std::getline(in, text)) {
    ++n;
    if (auto hash = text.find('#'); hash != std::string::npos) text.resize(hash);
    std::istringstream ws(text);
    line l{n, {}};
    for (std::string w; ws >> w;)
      l.words.push_back(w);
    if (!l.words.empty()) out.push_back(std::move(l));
  }
  return out;
}

class scenario {
 public:
  explicit scenario(std::string name) : name_(std::move(name)) {}

  void run(const std::vector<line>& lines) { run_block(lines, 0, lines.size()); }

 private:
  void run_block(const std::vector<line>& lines, std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end && !::testing::Test::HasFatalFailure(); ++i) {
      const line& l = lines[i];
      if (l.words[0] == "repeat") {
        std::size_t depth = 1, j = i + 1;
        for (; j < end; ++j) {
          if (lines[j].words[0] == "repeat") ++depth;
          if (lines[j].words[0] == "end" && --depth == 0) break;
        }
        ASSERT_LT(j, end) << where(l) << "repeat without end";
        for (int k = 0; k < std::stoi(l.words.at(1)); ++k)
          run_block(lines, i + 1, j);
        i = j;
        continue;
      }
      exec(l);
    }
  }

  std::string where(const line& l) const {
    return fmt::format("{}:{}: `{}`: ", name_, l.number, fmt::join(l.words, " "));
  }

  static member_id id(const std::string& s) { return std::stoull(s); }

  std::vector<member_id> ids(const line& l, std::size_t from, std::size_t to = ~std::size_t{0}) {
    std::vector<member_id> v;
    for (std::size_t i = from; i < l.words.size() && i < to; ++i)
      v.push_back(id(l.words[i]));
    return v;
  }

  // Splits the words from `from` on "|" into groups of ids.
  std::vector<std::vector<member_id>> groups(const line& l, std::size_t from) {
    std::vector<std::vector<member_id>> g(1);
    for (std::size_t i = from; i < l.words.size(); ++i) {
      if (l.words[i] == "|") {
        g.emplace_back();
      } else {
        g.back().push_back(id(l.words[i]));
      }
    }
    return g;
  }

  const mesh_node& node(const line& l, member_id x) {
    const mesh_node* n = mesh_node_of(*w_, x);
    if (!n) ADD_FAILURE() << where(l) << "node " << x << " is down";
    TESSERA_ASSERT(n != nullptr, "scenario: node {} is down", x);
    return *n;
  }

  member_id current_leader() const {
    for (member_id x : w_->ids()) {
      const mesh_node* n = mesh_node_of(*w_, x);
      if (n && n->election().role() == election_role::leader) return x;
    }
    return no_member;
  }

  void exec(const line& l) {
    const auto& c = l.words[0];
    if (c == "cluster") return make_cluster(l);
    ASSERT_TRUE(w_) << where(l) << "no cluster yet";
    if (c == "start" || c == "restart") return w_->start(id(l.words.at(1)));
    if (c == "crash") return w_->crash(id(l.words.at(1)));
    if (c == "pause") return w_->pause(id(l.words.at(1)));
    if (c == "resume") return w_->resume(id(l.words.at(1)));
    if (c == "leave") {
      return w_->invoke(id(l.words.at(1)), [](sim_node& n, node_context& ctx) {
        dynamic_cast<mesh_node&>(n).leave(ctx);
      });
    }
    if (c == "bump-durable-term") return bump_term(l);
    if (c == "partition") return w_->partition(groups(l, 1));
    if (c == "oneway") return w_->block(id(l.words.at(1)), id(l.words.at(3)));
    if (c == "bridge") {
      auto g = groups(l, 1);
      ASSERT_EQ(g.size(), 3u) << where(l) << "bridge wants A.. | X | B..";
      return w_->bridge(g[0], g[1].at(0), g[2]);
    }
    if (c == "heal") return w_->heal();
    if (c == "fault") {
      std::vector<std::string> rest(l.words.begin() + 1, l.words.end());
      auto cmd = transport::faults::parse_fault_command(fmt::format("{}", fmt::join(rest, " ")));
      ASSERT_TRUE(cmd.has_value()) << where(l) << cmd.error().describe();
      auto r = w_->apply_fault(*cmd);
      ASSERT_TRUE(r.has_value()) << where(l) << r.error().describe();
      return;
    }
    if (c == "run") return w_->run_for(std::stoull(l.words.at(1)));
    if (c == "converge") {
      auto t = run_until_converged(*w_, std::stoull(l.words.at(1)));
      EXPECT_TRUE(t.has_value()) << where(l) << converged(*w_).value_or("") << " | "
                                 << describe(*w_);
      return;
    }
    if (c == "mark") return mark();
    if (c == "expect") return expect(l);
    ADD_FAILURE() << where(l) << "unknown command";
  }

  void make_cluster(const line& l) {
    const std::size_t n = std::stoull(l.words.at(1));
    std::uint64_t seed = 1;
    std::vector<member_id> start;
    bool listing = false;
    for (std::size_t i = 2; i < l.words.size(); ++i) {
      if (l.words[i] == "serving") {
        serving_ = true;
        listing = false;
      } else if (l.words[i] == "seed") {
        seed = std::stoull(l.words.at(++i));
        listing = false;
      } else if (l.words[i] == "start") {
        listing = true;
      } else if (listing) {
        start.push_back(id(l.words[i]));
      }
    }
    w_ = make_mesh_world(seed, n, serving_ ? serving_cluster_options(n) : cluster_options(n));
    check_ = std::make_unique<election_checker>(*w_, 800);
    plans_ = std::make_unique<plan_checker>(*w_);
    w_->set_observer([this] {
      check_->observe();
      if (serving_) plans_->observe();
      for (member_id x : w_->ids()) {
        const mesh_node* nd = mesh_node_of(*w_, x);
        const bool leads = nd && nd->election().role() == election_role::leader;
        if (leads && !was_leader_[x]) ++elections_;
        was_leader_[x] = leads;
      }
    });
    if (start.empty()) start = w_->ids();
    for (member_id x : start)
      w_->start(x);
  }

  void bump_term(const line& l) {
    const member_id x = id(l.words.at(1));
    ASSERT_FALSE(w_->is_up(x)) << where(l) << "node must be down";
    auto d = decode<durable_election_state>(w_->durable_of(x));
    ASSERT_TRUE(d.has_value()) << where(l) << "no durable state";
    d->term += std::stoull(l.words.at(2));
    d->voted_for = no_member;
    w_->durable_of(x) = encode(*d);
  }

  void mark() {
    mark_terms_.clear();
    for (member_id x : w_->ids()) {
      const mesh_node* n = mesh_node_of(*w_, x);
      if (n) mark_terms_[x] = n->election().term();
    }
    mark_leader_ = current_leader();
    elections_ = 0;
    mark_plan_ = {};
    if (const mesh_node* n = mesh_node_of(*w_, mark_leader_); n && n->plan())
      mark_plan_ = {n->plan()->epoch.term, n->plan()->epoch.version};
  }

  void expect(const line& l) {
    const std::string what = l.words.at(1);
    const std::string state = describe(*w_);
    if (what == "leader") {
      const member_id x = id(l.words.at(2));
      EXPECT_EQ(node(l, x).election().role(), election_role::leader) << where(l) << state;
      for (member_id y : w_->ids()) {
        const mesh_node* n = mesh_node_of(*w_, y);
        if (!n || !w_->can_deliver(x, y) || !w_->can_deliver(y, x) || w_->is_paused(y)) continue;
        EXPECT_EQ(n->election().leader(), x) << where(l) << "node " << y << " | " << state;
        EXPECT_EQ(n->election().term(), node(l, x).election().term())
            << where(l) << "node " << y << " | " << state;
      }
    } else if (what == "leader-in") {
      auto set = ids(l, 2);
      std::vector<member_id> leaders;
      for (member_id x : set)
        if (node(l, x).election().role() == election_role::leader) leaders.push_back(x);
      ASSERT_EQ(leaders.size(), 1u) << where(l) << state;
      for (member_id x : set)
        EXPECT_EQ(node(l, x).election().leader(), leaders[0])
            << where(l) << "node " << x << " | " << state;
    } else if (what == "no-leader") {
      for (member_id x : ids(l, 2)) {
        EXPECT_NE(node(l, x).election().role(), election_role::leader) << where(l) << state;
        EXPECT_EQ(node(l, x).election().leader(), no_member)
            << where(l) << "node " << x << " | " << state;
      }
    } else if (what == "role") {
      EXPECT_STREQ(to_string(node(l, id(l.words.at(2))).election().role()), l.words.at(3).c_str())
          << where(l) << state;
    } else if (what == "term-unchanged") {
      for (member_id x : ids(l, 2))
        EXPECT_EQ(node(l, x).election().term(), mark_terms_[x])
            << where(l) << "node " << x << " | " << state;
    } else if (what == "term-increased") {
      for (member_id x : ids(l, 2))
        EXPECT_GT(node(l, x).election().term(), mark_terms_[x])
            << where(l) << "node " << x << " | " << state;
    } else if (what == "leader-unchanged") {
      EXPECT_NE(mark_leader_, no_member) << where(l) << "no leader at mark";
      EXPECT_EQ(current_leader(), mark_leader_) << where(l) << state;
    } else if (what == "elections-since-mark") {
      EXPECT_EQ(elections_, std::stoull(l.words.at(2))) << where(l) << state;
    } else if (what == "members") {
      EXPECT_EQ(node(l, id(l.words.at(2))).election().config().members, ids(l, 4))
          << where(l) << state;
    } else if (what == "committed") {
      const auto& e = node(l, id(l.words.at(2))).election();
      EXPECT_EQ(e.commit_version(), e.config().version) << where(l) << state;
    } else if (what == "sees") {
      auto s = node(l, id(l.words.at(2))).membership().status_of(id(l.words.at(3)));
      ASSERT_TRUE(s.has_value()) << where(l) << "unknown member";
      EXPECT_STREQ(to_string(*s), l.words.at(4).c_str()) << where(l);
    } else if (what == "no-violations") {
      EXPECT_TRUE(check_->violations().empty())
          << where(l) << fmt::format("{}", fmt::join(check_->violations(), "; "));
      EXPECT_TRUE(plans_->violations().empty())
          << where(l) << fmt::format("{}", fmt::join(plans_->violations(), "; "));
    } else if (what == "plan-converged") {
      ASSERT_TRUE(serving_) << where(l) << "needs `cluster N serving`";
      auto why = plans_converged(*w_);
      EXPECT_FALSE(why.has_value()) << where(l) << why.value_or("") << " | " << state;
    } else if (what == "plan-unchanged") {
      const mesh_node* n = mesh_node_of(*w_, current_leader());
      ASSERT_TRUE(n && n->plan()) << where(l) << "no leader with a plan | " << state;
      EXPECT_EQ(std::make_pair(n->plan()->epoch.term, n->plan()->epoch.version), mark_plan_)
          << where(l) << state;
    } else {
      ADD_FAILURE() << where(l) << "unknown expectation";
    }
  }

  std::string name_;
  std::unique_ptr<world> w_;
  std::unique_ptr<election_checker> check_;
  std::unique_ptr<plan_checker> plans_;
  bool serving_ = false;
  std::pair<std::uint64_t, std::uint64_t> mark_plan_{};
  std::map<member_id, std::uint64_t> mark_terms_;
  std::map<member_id, bool> was_leader_;
  member_id mark_leader_ = no_member;
  std::uint64_t elections_ = 0;
};

class ElectionScenario : public ::testing::TestWithParam<std::string> {};

TEST_P(ElectionScenario, Runs) {
  const std::filesystem::path path =
      std::filesystem::path(TESSERA_ELECTION_TESTDATA) / (GetParam() + ".txt");
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  auto lines = read_script(path);
  ASSERT_FALSE(lines.empty()) << path;
  scenario s(GetParam());
  s.run(lines);
}

INSTANTIATE_TEST_SUITE_P(Testdata, ElectionScenario,
                         ::testing::Values("prevote", "check_quorum", "leader_isolated",
                                           "rejoin_higher_term", "flapping", "leader_crash",
                                           "graceful_leave", "join", "bridge", "oneway",
                                           "cold_start_partition", "pause_leader",
                                           "restart_durable", "fault_language", "bridge_plan"),
                         [](const auto& param_info) { return param_info.param; });

// The interpreter must be able to fail: a wrong expectation is reported, not ignored.
TEST(ElectionScenarioInterpreter, WrongExpectationFails) {
  scenario s("inline");
  std::vector<line> lines = {
      {1, {"cluster", "3"}}, {2, {"converge", "3000"}}, {3, {"expect", "role", "3", "leader"}}};
  EXPECT_NONFATAL_FAILURE(s.run(lines), "expect role 3 leader");
}

}  // namespace
}  // namespace tessera::mesh::sim
