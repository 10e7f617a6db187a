// Serving without processes: the client protocol codec and its bounds, intake (exactly one peer
// takes or answers each request), the leader's plan from a view (sticky epochs), the client's
// stream follower (re-publication, order, resumption, give-up), peer parsing.
#include <algorithm>
#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <zmq.hpp>

#include "mesh/serving/client.hpp"
#include "mesh/serving/connection_guard.hpp"
#include "mesh/serving/fair_share.hpp"
#include "mesh/serving/follower.hpp"
#include "mesh/serving/intake.hpp"
#include "mesh/serving/ledger.hpp"
#include "mesh/serving/planning.hpp"
#include "mesh/serving/protocol.hpp"

namespace tessera::mesh::serving {
namespace {

constexpr std::uint64_t mib = 1ULL << 20;

request valid_request(std::string id = "r1") {
  request r;
  r.id = std::move(id);
  r.model = "tiny";
  r.prompt = "hello";
  r.max_tokens = 8;
  return r;
}

// ------------------------------------------------------------------ protocol
TEST(ServingProtocol, MalformedBodiesAreErrorsNamingTheProblem) {
  for (std::string bad : {std::string(), std::string("\xc1"), std::string("\x93\x01\x02\x03"),
                          std::string("\x81\xa2id\xc3")}) {
    auto r = decode_request(bad);
    ASSERT_FALSE(r) << "accepted " << bad.size() << " bytes";
    EXPECT_EQ(r.error().code, errc::invalid_argument);
    EXPECT_NE(r.error().message.find("request"), std::string::npos) << r.error().message;
  }
  const std::string huge(max_message_bytes + 1, '\x90');
  auto r = decode_request(huge);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("exceeds"), std::string::npos) << r.error().message;
}

TEST(ServingProtocol, RoundTripAndUnknownKeysIgnored) {
  auto q = valid_request();
  q.resume = {5, 6, 7};
  q.attempt = 2;
  q.seed = 99;
  auto back = decode_request(encode(q));
  ASSERT_TRUE(back) << back.error().describe();
  EXPECT_EQ(back->id, "r1");
  EXPECT_EQ(back->resume, (std::vector<std::int32_t>{5, 6, 7}));
  EXPECT_EQ(back->attempt, 2u);
  EXPECT_EQ(back->seed, 99u);

  // A map with only some keys (and one this version does not know) decodes with defaults.
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(3);
  pk.pack(std::string("id"));
  pk.pack(std::string("x"));
  pk.pack(std::string("model"));
  pk.pack(std::string("m"));
  pk.pack(std::string("future_field"));
  pk.pack(42);
  auto partial = decode_request(std::string_view(buf.data(), buf.size()));
  ASSERT_TRUE(partial) << partial.error().describe();
  EXPECT_EQ(partial->id, "x");
  EXPECT_EQ(partial->max_tokens, 128u);
  EXPECT_TRUE(partial->prompt.empty());

  response t;
  t.kind = "token";
  t.id = "r1";
  t.index = 3;
  t.text = {'\xe2', '\x82'};  // half a UTF-8 sequence travels as bytes
  auto rt = decode_response(encode(t));
  ASSERT_TRUE(rt);
  EXPECT_EQ(rt->text, t.text);
  EXPECT_EQ(rt->index, 3u);
}

TEST(ServingProtocol, ValidationNamesTheField) {
  struct bad_case {
    std::function<void(request&)> mutate;
    std::string field;
  };
  const std::vector<bad_case> cases = {
      {[](request& r) { r.v = 7; }, "version"},
      {[](request& r) { r.id = ""; }, "'id'"},
      {[](request& r) { r.id = "a:b"; }, "'id'"},
      {[](request& r) { r.id = std::string(65, 'a'); }, "'id'"},
      {[](request& r) { r.model = ""; }, "'model'"},
      {[](request& r) { r.prompt = ""; }, "prompt"},
      {[](request& r) {
         r.messages = {{"user", "x"}};
       },
       "exactly one"},
      {[](request& r) {
         r.prompt.clear();
         r.messages = {{"robot", "x"}};
       },
       "role"},
      {[](request& r) { r.prompt = std::string(max_prompt_bytes + 1, 'a'); }, "bytes"},
      {[](request& r) { r.max_tokens = 0; }, "'max_tokens'"},
      {[](request& r) { r.max_tokens = max_tokens_limit + 1; }, "'max_tokens'"},
      {[](request& r) { r.resume = std::vector<std::int32_t>(9, 1); }, "'resume'"},
      {[](request& r) { r.resume = {-1}; }, "'resume'"},
      {[](request& r) { r.format = "xml"; }, "'format'"},
      {[](request& r) { r.format = "json_schema"; }, "'schema'"},  // a schema must come with it
      {[](request& r) { r.schema = "{}"; }, "'schema'"},           // and only with it
      {[](request& r) {
         r.format = "json_schema";
         r.schema = std::string(max_schema_bytes + 1, ' ');
       },
       "'schema'"},
      {[](request& r) { r.tool_choice = "always"; }, "'tool_choice'"},
      {[](request& r) { r.tool_choice = "function"; }, "'tool_name'"},  // a name must come with it
      {[](request& r) { r.tool_name = "f"; }, "'tool_name'"},           // and only with it
      {[](request& r) { r.tool_choice = "required"; }, "'tool_choice'"},  // tools and messages
      {[](request& r) {
         r.prompt.clear();
         r.messages = {{"user", "x"}};
         r.tools = R"([{"type":"function","function":{"name":"f"}}])";
         r.tool_choice = "required";
         r.format = "json_object";
       },
       "'format'"},
      {[](request& r) { r.temperature = 1e9f; }, "'temperature'"},
      {[](request& r) { r.top_p = 1.5f; }, "'top_p'"},
      {[](request& r) { r.top_k = -1; }, "'top_k'"},
      {[](request& r) { r.min_p = -0.1f; }, "'min_p'"},
      {[](request& r) { r.repeat_penalty = 0; }, "'repeat_penalty'"},
      {[](request& r) { r.attempt = max_attempt + 1; }, "'attempt'"},
  };
  ASSERT_TRUE(validate(valid_request()));
  for (const auto& c : cases) {
    auto r = valid_request();
    c.mutate(r);
    auto v = validate(r);
    ASSERT_FALSE(v) << c.field;
    EXPECT_NE(v.error().message.find(c.field), std::string::npos)
        << "expected '" << c.field << "' in: " << v.error().message;
  }
}

TEST(ServingProtocol, TopicsDoNotPrefixEachOther) {
  EXPECT_EQ(response_topic("ab"), "ab:");
  EXPECT_FALSE(response_topic("ab").starts_with(response_topic("a")));
}

// ------------------------------------------------------------------ intake
placement::model_spec spec(std::string name) {
  placement::model_spec s;
  s.name = std::move(name);
  s.n_layers = 4;
  s.n_heads = 8;
  s.n_kv_heads = 4;
  s.dim = 256;
  s.ffn_size = 768;
  s.n_vocab = 1000;
  s.bytes_per_layer = 4 * mib;
  s.bytes_embeddings = mib;
  s.bytes_output = mib;
  s.kv_bytes_per_token = 4 * 2 * 4 * 32 * 2;
  s.context_tokens = 512;
  return s;
}

placement::plan replicas_plan(const std::vector<member_id>& ids) {
  placement::plan_input in;
  for (auto id : ids)
    in.members.push_back({id, 2, 4096 * mib, 2048 * mib, {}});
  in.models.push_back(spec("tiny"));
  auto p = placement::compute_plan(in, nullptr, 1);
  EXPECT_TRUE(p) << p.error().describe();
  return *p;
}

TEST(ServingIntake, ExactlyOnePeerTakesEachRequest) {
  const std::vector<member_id> ids{11, 22, 33};
  const auto plan = replicas_plan(ids);
  ASSERT_EQ(plan.models.at(0).groups.size(), 3u);
  const std::vector<std::string> local{"tiny"};
  std::map<member_id, int> taken;
  for (int k = 0; k < 300; ++k) {
    auto r = valid_request("req-" + std::to_string(k));
    int accepts = 0;
    for (auto self : ids) {
      auto d = decide(r, &plan, ids, self, local);
      EXPECT_NE(d.action, intake_action::reject) << d.message;
      if (d.action == intake_action::accept) {
        ++accepts;
        ++taken[self];
      }
    }
    EXPECT_EQ(accepts, 1) << r.id;
  }
  // Rendezvous hashing spreads the load over every replica.
  for (auto id : ids)
    EXPECT_GT(taken[id], 50) << id;
}

// The one rule for serving without a leader: a group with a member the deciding peer does not
// count as live takes nothing. The survivors agree among themselves, each request still goes to
// one of them, the requests of live groups stay where they were (rendezvous: only the dead
// group's move), and a lone survivor with the weights takes everything.
TEST(ServingIntake, GroupsWithAMemberDownAreRoutedAround) {
  const std::vector<member_id> ids{11, 22, 33};
  const auto plan = replicas_plan(ids);
  const std::vector<std::string> local{"tiny"};
  const std::vector<member_id> survivors{11, 33};  // 22 declared dead
  int moved = 0;
  for (int k = 0; k < 300; ++k) {
    auto r = valid_request("req-" + std::to_string(k));
    member_id before = no_member, after = no_member;
    for (auto self : ids)
      if (decide(r, &plan, ids, self, local).action == intake_action::accept) before = self;
    int accepts = 0;
    for (auto self : survivors)
      if (decide(r, &plan, survivors, self, local).action == intake_action::accept) {
        ++accepts;
        after = self;
      }
    EXPECT_EQ(accepts, 1) << r.id;
    if (before != 22) {
      EXPECT_EQ(after, before) << r.id << ": a live group's request moved";
    }
    moved += before == 22 ? 1 : 0;
    const std::vector<member_id> alone{33};
    EXPECT_EQ(decide(r, &plan, alone, 33, local).action, intake_action::accept) << r.id;
  }
  EXPECT_GT(moved, 50);  // 22's share went to the survivors
}

TEST(ServingIntake, ExactlyOneResponderForErrors) {
  const std::vector<member_id> ids{11, 22, 33};
  const auto plan = replicas_plan(ids);
  const std::vector<std::string> local{"tiny"};
  for (int k = 0; k < 50; ++k) {
    auto unknown = valid_request("u" + std::to_string(k));
    unknown.model = "nope";
    auto invalid = valid_request("i" + std::to_string(k));
    invalid.max_tokens = 0;
    for (const auto& [r, code] : {std::pair{unknown, error_code::unknown_model},
                                  std::pair{invalid, error_code::invalid_request}}) {
      int rejects = 0;
      for (auto self : ids) {
        auto d = decide(r, &plan, ids, self, local);
        EXPECT_NE(d.action, intake_action::accept);
        if (d.action == intake_action::reject) {
          ++rejects;
          EXPECT_EQ(d.code, code);
          EXPECT_EQ(self, responder_for(r.id, ids));
        }
      }
      EXPECT_EQ(rejects, 1) << r.id;
    }
  }
  auto unknown = valid_request("named");
  unknown.model = "nope";
  auto d = decide(unknown, &plan, ids, responder_for("named", ids), local);
  EXPECT_NE(d.message.find("'nope'"), std::string::npos) << d.message;
  EXPECT_NE(d.message.find("tiny"), std::string::npos) << d.message;
}

TEST(ServingIntake, NoPlanOrNoIdMeansSilence) {
  const std::vector<member_id> ids{11, 22};
  for (auto self : ids) {
    EXPECT_EQ(decide(valid_request(), nullptr, ids, self, {}).action, intake_action::ignore);
    auto no_id = valid_request("");
    EXPECT_EQ(decide(no_id, nullptr, ids, self, {}).action, intake_action::ignore);
  }
}

// The cancel rule the engine and the simulator share: a cancel naming another peer's copy, or one
// for an earlier attempt than the one running, or for a stream not running here, changes nothing.
TEST(ServingIntake, ACancelEndsOnlyTheNamedPeersCopyOfTheAttemptOrAnEarlierOne) {
  request c = valid_request("x");
  c.cancel = true;
  c.attempt = 2;
  EXPECT_TRUE(cancel_applies(c, "aa", 2u));
  EXPECT_TRUE(cancel_applies(c, "aa", 1u));
  EXPECT_FALSE(cancel_applies(c, "aa", 3u)) << "a later attempt runs: the cancel is stale";
  EXPECT_FALSE(cancel_applies(c, "aa", std::nullopt)) << "nothing runs here";
  c.node = "bb";
  EXPECT_FALSE(cancel_applies(c, "aa", 2u)) << "meant for peer bb's duplicate";
  EXPECT_TRUE(cancel_applies(c, "bb", 2u));
}

// A peer list vouches for the live members only while the peer has a plan, itself first.
TEST(ServingIntake, APeerListNamesItselfThenTheLiveMembersItKnows) {
  const std::vector<member_id> live{11, 22, 33};
  auto hex = [](member_id id) { return id == 33 ? std::string() : fmt::format("h{}", id); };
  EXPECT_TRUE(peer_list_nodes(false, 11, "h11", live, hex).empty());
  EXPECT_EQ(peer_list_nodes(true, 11, "h11", live, hex), (std::vector<std::string>{"h11", "h22"}));
}

TEST(ServingIntake, NoCapacityAndMissingModelAreExplicit) {
  const std::vector<member_id> ids{11};
  placement::plan_input in;
  in.members.push_back({11, 2, 8 * mib, 4 * mib, {}});  // far too small
  in.models.push_back(spec("tiny"));
  auto p = placement::compute_plan(in, nullptr, 1);
  ASSERT_TRUE(p);
  auto d = decide(valid_request(), &*p, ids, 11, std::vector<std::string>{"tiny"});
  EXPECT_EQ(d.action, intake_action::reject);
  EXPECT_EQ(d.code, error_code::no_capacity);
  // A peer assigned a model it has not loaded says so instead of staying silent.
  const auto plan = replicas_plan(ids);
  auto m = decide(valid_request(), &plan, ids, 11, {});
  EXPECT_EQ(m.action, intake_action::reject);
  EXPECT_NE(m.message.find("has not loaded"), std::string::npos) << m.message;
  // Unless it is fetching the model's bytes: then it stays silent (the client re-publishes)...
  auto f = decide(valid_request(), &plan, ids, 11, {}, std::vector<std::string>{"tiny"});
  EXPECT_EQ(f.action, intake_action::ignore);
  // ...but a model without capacity is still refused by its responder, fetching or not.
  auto n = decide(valid_request(), &*p, ids, 11, {}, std::vector<std::string>{"tiny"});
  EXPECT_EQ(n.action, intake_action::reject);
  EXPECT_EQ(n.code, error_code::no_capacity);
}

// Two members that hold the model only together, one of them just joined (no links in the view
// yet): nobody refuses the request, the client re-publishes and the next plan serves it.
TEST(ServingIntake, NoGroupForWantOfLinksHoldsTheRequest) {
  const std::vector<member_id> ids{11, 22};
  placement::plan_input in;
  in.members.push_back({11, 2, 24 * mib, 14 * mib, {}});
  in.members.push_back({22, 2, 24 * mib, 14 * mib, {}});  // 28 MiB for ~19 MiB, neither alone
  in.models.push_back(spec("tiny"));
  auto p = placement::compute_plan(in, nullptr, 1);
  ASSERT_TRUE(p);
  ASSERT_TRUE(p->models.at(0).links_pending) << p->models.at(0).no_capacity;
  for (auto self : ids) {
    auto d = decide(valid_request(), &*p, ids, self, std::vector<std::string>{"tiny"});
    EXPECT_EQ(d.action, intake_action::ignore) << self << ": " << d.message;
  }
  for (member_id a : ids) {
    for (member_id b : ids) {
      if (a != b) in.links.push_back({a, b, 100, 1000, placement::link_backend::tcp});
    }
  }
  auto linked = placement::compute_plan(in, &*p, 1);
  ASSERT_TRUE(linked);
  ASSERT_EQ(linked->models.at(0).groups.size(), 1u) << linked->models.at(0).no_capacity;
  int accepts = 0;
  for (auto self : ids) {
    accepts +=
        decide(valid_request(), &*linked, ids, self, std::vector<std::string>{"tiny"}).action ==
        intake_action::accept;
  }
  EXPECT_EQ(accepts, 1);
}

// ------------------------------------------------------------------ plan from the view
topology::view view_of(std::vector<std::pair<member_id, bool>> members_with_model) {
  topology::view v;
  v.at = {1, 1};
  for (auto [id, has] : members_with_model) {
    topology::view_member m;
    m.id = id;
    m.status = 0;  // alive
    m.caps.cores = 2;
    m.caps.memory_total_mb = 4096;
    m.caps.memory_free_mb = 2048;
    if (has) m.caps.model_specs.push_back(spec("tiny"));
    v.members.push_back(m);
  }
  return v;
}

TEST(ServingPlanning, PlansOnlyOverHoldersAndKeepsItsEpoch) {
  auto v = view_of({{11, true}, {22, true}, {33, false}});
  auto p1 = plan_from_view(v, nullptr, 1);
  ASSERT_TRUE(p1) << p1.error().describe();
  ASSERT_EQ(p1->models.size(), 1u);
  EXPECT_EQ(p1->models[0].groups.size(), 2u);  // 33 does not hold the model
  for (const auto& g : p1->models[0].groups)
    for (const auto& r : g.ranks)
      EXPECT_NE(r.node, 33u);
  EXPECT_EQ(p1->epoch, (placement::plan_epoch{1, 1}));

  // A new leader (term 2) from the same view reproduces the plan's content (nothing moves) under
  // its own term, once: that epoch replaces any later plan of the old leader a follower may hold.
  auto p2 = plan_from_view(v, &*p1, 2);
  ASSERT_TRUE(p2);
  EXPECT_EQ(p2->epoch, (placement::plan_epoch{2, 2}));
  EXPECT_TRUE(placement::plan_equal_content(*p2, *p1));
  auto p2b = plan_from_view(v, &*p2, 2);  // then it is sticky within the term
  ASSERT_TRUE(p2b);
  EXPECT_EQ(*p2b, *p2);
  // A stale leader (an older term) never issues an epoch: it keeps what it has.
  auto stale = plan_from_view(v, &*p2, 1);
  ASSERT_TRUE(stale);
  EXPECT_EQ(*stale, *p2);

  // A holder dies: its group goes, the survivor's group stays, the version moves.
  v.members[1].status = 2;  // dead
  auto p3 = plan_from_view(v, &*p2, 2);
  ASSERT_TRUE(p3);
  ASSERT_EQ(p3->models[0].groups.size(), 1u);
  EXPECT_EQ(p3->models[0].groups[0].ranks[0].node, 11u);
  EXPECT_EQ(p3->epoch, (placement::plan_epoch{2, 3}));

  // Nobody holds it any more: the model leaves the plan (requests get unknown_model).
  v.members[0].status = 2;
  auto p4 = plan_from_view(v, &*p3, 2);
  ASSERT_TRUE(p4);
  EXPECT_TRUE(p4->models.empty());
}

// Model distribution: members that fetch models join the candidates of every model with a content
// id, unless they hold a file of that name with other content; holders of other content are not
// mixed with the first holder's.
TEST(ServingPlanning, FetchersJoinModelsOfKnownContentOnly) {
  auto v = view_of({{11, true}, {22, false}, {33, false}, {44, true}});
  for (auto& m : v.members)
    for (auto& s : m.caps.model_specs)
      s.content = "c1";
  v.members[1].caps.fetches_models = true;  // 22 fetches
  v.members[2].caps.fetches_models = true;  // 33 fetches but holds "tiny" of other content
  v.members[2].caps.model_specs.push_back(spec("tiny"));
  v.members[2].caps.model_specs.back().content = "c2";
  v.members[3].caps.model_specs[0].content = "c3";  // 44 holds other content
  auto p = plan_from_view(v, nullptr, 1);
  ASSERT_TRUE(p) << p.error().describe();
  ASSERT_EQ(p->models.size(), 1u);
  EXPECT_EQ(p->models[0].spec.content, "c1");
  std::set<member_id> planned;
  for (const auto& g : p->models[0].groups)
    for (const auto& r : g.ranks)
      planned.insert(r.node);
  EXPECT_EQ(planned, (std::set<member_id>{11, 22}));
  // Without a content id nothing is fetched.
  for (auto& m : v.members)
    for (auto& s : m.caps.model_specs)
      s.content.clear();
  auto q = plan_from_view(v, nullptr, 1);
  ASSERT_TRUE(q);
  planned.clear();
  for (const auto& g : q->models[0].groups)
    for (const auto& r : g.ranks)
      planned.insert(r.node);
  EXPECT_EQ(planned, (std::set<member_id>{11, 33, 44}));
}

// ------------------------------------------------------------------ client endpoints
// ------------------------------------------------------------------ duplicates (ledger)
TEST(ServingLedger, EachAttemptGeneratesOnceAndFinishedOnesRepeatTheirAnswer) {
  finished_ledger done(3);
  auto q = valid_request("a");
  q.attempt = 2;
  EXPECT_EQ(admit(q, std::nullopt, done), admission::fresh);
  EXPECT_EQ(admit(q, 2u, done), admission::running_duplicate);
  EXPECT_EQ(admit(q, 3u, done), admission::running_duplicate);  // an older re-publication
  EXPECT_EQ(admit(q, 1u, done), admission::supersedes);
  response fin;
  fin.kind = "done";
  fin.tokens = 4;
  done.remember("a", 2, fin);
  EXPECT_EQ(admit(q, std::nullopt, done), admission::finished_duplicate);
  EXPECT_EQ(done.find("a")->final_msg.tokens, 4u);
  q.attempt = 1;
  EXPECT_EQ(admit(q, std::nullopt, done), admission::stale);
  q.attempt = 3;
  EXPECT_EQ(admit(q, std::nullopt, done), admission::fresh);    // a resumption after an error
  EXPECT_EQ(admit(q, 3u, done), admission::running_duplicate);  // the running stream comes first
  // Bounded: the oldest id is forgotten first; remembering an id again does not reorder.
  done.remember("b", 0, fin);
  done.remember("c", 0, fin);
  done.remember("a", 3, fin);
  EXPECT_EQ(done.size(), 3u);
  done.remember("d", 0, fin);
  EXPECT_EQ(done.size(), 3u);
  EXPECT_EQ(done.find("a"), nullptr);
  EXPECT_NE(done.find("b"), nullptr);
  EXPECT_NE(done.find("d"), nullptr);
}

// ------------------------------------------------------------------ fair share
TEST(ServingFairShare, ANewcomerAtTheBoundTakesThePlaceOfTheClientHoldingTheMost) {
  client_counts c;
  c["hog"] = {8, 64};
  EXPECT_EQ(makes_way_for(c, "honest"), "hog");
  c["honest"] = {0, 71};  // holds more than the hog (the hog's 72 are not two more)
  EXPECT_EQ(makes_way_for(c, "honest"), std::nullopt);
  c["honest"] = {0, 70};
  EXPECT_EQ(makes_way_for(c, "honest"), "hog");
  // The hog itself never displaces its own; a client with nothing waiting cannot make way.
  EXPECT_EQ(makes_way_for(c, "hog"), std::nullopt);
  client_counts running_only;
  running_only["hog"] = {8, 0};
  EXPECT_EQ(makes_way_for(running_only, "honest"), std::nullopt);
  // Equal holders: the first by identity, whoever asks.
  client_counts two;
  two["b"] = {4, 6};
  two["a"] = {4, 6};
  EXPECT_EQ(makes_way_for(two, "c"), "a");
}

TEST(ServingFairShare, AFreeSlotGoesToTheClientRunningTheFewestInQueueOrderAmongEquals) {
  client_counts c;
  c["hog"] = {7, 3};
  c["honest"] = {1, 1};
  c["new"] = {0, 2};
  const std::vector<waiting_stream> w = {
      {"hog", true}, {"honest", true}, {"new", false}, {"hog", true}, {"new", true}};
  EXPECT_EQ(next_to_start(w, c), 4u);  // "new" runs none; its first stream cannot start yet
  const std::vector<waiting_stream> w2 = {{"hog", true}, {"honest", true}, {"honest", true}};
  EXPECT_EQ(next_to_start(w2, c), 1u);
  const std::vector<waiting_stream> none = {{"hog", false}};
  EXPECT_EQ(next_to_start(none, c), std::nullopt);
}

TEST(ServingFairShare, ARunningStreamMakesWayOnlyForAClientRunningTwoFewer) {
  client_counts c;
  c["hog"] = {8, 10};
  c["honest"] = {0, 1};
  EXPECT_EQ(preempted_for(c, "honest"), "hog");
  c["hog"] = {5, 10};
  c["honest"] = {3, 1};
  EXPECT_EQ(preempted_for(c, "honest"), "hog");
  c["hog"] = {4, 10};
  EXPECT_EQ(preempted_for(c, "honest"), std::nullopt);
  EXPECT_EQ(preempted_for(c, "hog"), std::nullopt);  // never for itself
}

// The three rules applied to one peer of 8 slots and a queue of 64, as the engine applies them:
// a client with 150 long streams holds every slot and the queue, then an honest client asks for
// 8. Each rule step converges — no slot is traded back and forth — to 4 and 4, and the honest
// client is never refused.
TEST(ServingFairShare, AHogAndAnHonestClientConvergeToEqualSlotsWithoutTrading) {
  constexpr std::uint32_t slots = 8, queue = 64;
  client_counts c;
  std::uint32_t refused_hog = 0;
  for (int k = 0; k < 150; ++k) {
    auto& h = c["hog"];
    if (h.total() >= slots + queue) {
      ++refused_hog;
      continue;
    }
    (h.running < slots ? h.running : h.waiting) += 1;
  }
  EXPECT_EQ(refused_hog, 150u - slots - queue);
  for (int k = 0; k < 8; ++k) {
    const auto way = makes_way_for(c, "honest");
    ASSERT_EQ(way, "hog") << k;
    --c["hog"].waiting;
    ++c["honest"].waiting;
  }
  int preemptions = 0;
  for (int round = 0; round < 100; ++round) {
    const auto from = preempted_for(c, "honest");
    if (!from) break;
    ASSERT_EQ(*from, "hog");
    --c["hog"].running;
    ++c["hog"].waiting;
    const std::vector<waiting_stream> w = {{"hog", true}, {"honest", true}};
    ASSERT_EQ(next_to_start(w, c), 1u);
    --c["honest"].waiting;
    ++c["honest"].running;
    ++preemptions;
  }
  EXPECT_EQ(preemptions, 4);
  EXPECT_EQ(c["hog"].running, 4u);
  EXPECT_EQ(c["honest"].running, 4u);
}

// ------------------------------------------------------------------ connection bounds
TEST(ServingConnections, OneAddressPerEndpointAndAllTogetherAreBounded) {
  connection_ledger l({.per_address = 2, .total = 5});
  EXPECT_TRUE(l.opened(0, 10, "10.0.0.1"));
  EXPECT_TRUE(l.opened(0, 11, "10.0.0.1"));
  EXPECT_FALSE(l.opened(0, 12, "10.0.0.1"));  // a third from one address on one endpoint
  EXPECT_TRUE(l.opened(1, 13, "10.0.0.1"));   // the other endpoint counts apart
  EXPECT_EQ(l.open(), 4u);                    // a refused one holds its descriptor until closed
  l.closed(0, 12);
  EXPECT_EQ(l.open_from(0, "10.0.0.1"), 2u);
  EXPECT_TRUE(l.opened(0, 14, "10.0.0.2"));
  EXPECT_TRUE(l.opened(1, 15, "10.0.0.3"));   // the fifth
  EXPECT_FALSE(l.opened(1, 17, "10.0.0.4"));  // a sixth in all
  l.closed(1, 17);
  l.closed(0, 10);
  EXPECT_TRUE(l.opened(0, 16, "10.0.0.1"));  // room again
  // A descriptor reported twice (its close unseen) counts once; unknown closes are ignored.
  EXPECT_TRUE(l.opened(0, 16, "10.0.0.1"));
  l.closed(0, 99);
  EXPECT_EQ(l.open(), 5u);
  // An endpoint whose socket closed takes its connections with it.
  l.forget(0);
  EXPECT_EQ(l.open(), 2u);
  EXPECT_EQ(l.open_from(0, "10.0.0.1"), 0u);
  EXPECT_EQ(l.open_from(1, "10.0.0.1"), 1u);
}

// libzmq sends a monitor's events with a blocking send from the context's I/O thread. The guard
// once closed its end of the monitor before stopping it: the next event of the watched socket —
// its connections ending as it closed — then had no reader, blocked that thread for good, and no
// socket of the context moved again (a response-port reset left every later request unread).
TEST(ServingConnections, ForgettingAWatchedSocketLeavesTheContextsIoThreadFree) {
  using namespace std::chrono_literals;
  // Leaked if the I/O thread is stuck: ending the context would wait for it forever.
  auto* ctx = new zmq::context_t(1);
  zmq::context_t client_ctx(1);
  {
    connection_guard g(*ctx, {}, "test");
    zmq::socket_t server(*ctx, zmq::socket_type::xpub);
    server.set(zmq::sockopt::linger, 0);
    g.watch(1, server);
    server.bind("tcp://127.0.0.1:*");
    const std::string ep = server.get(zmq::sockopt::last_endpoint);
    zmq::socket_t sub(client_ctx, zmq::socket_type::sub);
    sub.set(zmq::sockopt::linger, 0);
    sub.connect(ep);
    sub.set(zmq::sockopt::subscribe, "t");
    // The connection is up (its subscription arrived) and the guard counted it.
    zmq::pollitem_t in[] = {{server.handle(), 0, ZMQ_POLLIN, 0}};
    ASSERT_EQ(zmq::poll(in, 1, 5000ms), 1);
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (g.ledger().open() == 0 && std::chrono::steady_clock::now() < until) {
      g.drain(1);
      std::this_thread::sleep_for(10ms);
    }
    ASSERT_EQ(g.ledger().open(), 1u);

    g.forget(1);
    EXPECT_EQ(g.ledger().open(), 0u);
    sub.close();  // its connection ends while `server` is open: an event nobody reads
    std::this_thread::sleep_for(200ms);

    // The context's I/O thread still carries messages.
    zmq::socket_t pull(*ctx, zmq::socket_type::pull), push(*ctx, zmq::socket_type::push);
    pull.set(zmq::sockopt::linger, 0);
    push.set(zmq::sockopt::linger, 0);
    pull.bind("tcp://127.0.0.1:*");
    push.connect(pull.get(zmq::sockopt::last_endpoint));
    (void)push.send(zmq::str_buffer("still moving"), zmq::send_flags::dontwait);
    zmq::pollitem_t got[] = {{pull.handle(), 0, ZMQ_POLLIN, 0}};
    EXPECT_EQ(zmq::poll(got, 1, 5000ms), 1) << "the I/O thread is blocked on the monitor";
  }
  if (!::testing::Test::HasFailure()) delete ctx;
}

// ------------------------------------------------------------------ stream follower
constexpr std::uint64_t ms = 1000;  // the follower's clock is in microseconds

response msg(std::string_view kind, std::uint32_t attempt, std::string node = "a") {
  response m;
  m.kind = std::string(kind);
  m.id = "r1";
  m.attempt = attempt;
  m.node = std::move(node);
  return m;
}
response tok(std::uint32_t attempt, std::uint32_t index, std::int32_t id, std::string node = "a") {
  auto m = msg("token", attempt, std::move(node));
  m.index = index;
  m.token = id;
  m.text = {static_cast<char>('a' + id % 26)};
  return m;
}

TEST(StreamFollower, RepublishesWithBackoffUntilAccepted) {
  stream_follower f(valid_request(), {}, 0);
  EXPECT_EQ(f.first_publication().attempt, 0u);
  std::vector<std::uint64_t> at;
  for (std::uint64_t t = 0; t <= 2000 * ms; t += ms)
    if (f.on_tick(t).publish) at.push_back(t / ms);
  EXPECT_EQ(at, (std::vector<std::uint64_t>{25, 75, 175, 375, 775, 1275, 1775}));
  EXPECT_FALSE(f.on_response(msg("accepted", 0), 2000 * ms).publish);
  EXPECT_TRUE(f.accepted());
  EXPECT_FALSE(f.on_tick(2900 * ms).publish);  // accepted: no re-publication, not stalled yet
  EXPECT_EQ(f.wake_at_us(), 5000 * ms);        // stall bound from the last message
}

TEST(StreamFollower, TokensInOrderOnceAndGapsResumeWithWhatArrived) {
  stream_follower f(valid_request(), {}, 0);
  EXPECT_TRUE(f.on_response(tok(0, 0, 5), ms).token);
  EXPECT_FALSE(f.on_response(tok(0, 0, 5), 2 * ms).token);  // a duplicate
  EXPECT_FALSE(f.on_response(tok(1, 1, 6), 3 * ms).token);  // another attempt: dropped
  EXPECT_TRUE(f.on_response(tok(0, 1, 6), 4 * ms).token);
  auto s = f.on_response(tok(0, 3, 8), 5 * ms);  // index 2 missing
  EXPECT_FALSE(s.token);
  ASSERT_TRUE(s.publish);
  EXPECT_EQ(s.publish->attempt, 1u);
  EXPECT_EQ(s.publish->resume, (std::vector<std::int32_t>{5, 6}));
  EXPECT_FALSE(f.on_response(tok(0, 2, 7), 6 * ms).token);  // the old attempt is over
  EXPECT_TRUE(f.on_response(tok(1, 2, 7, "b"), 7 * ms).token);
  auto d = msg("done", 1, "b");
  d.tokens = 3;
  d.stop = "end_of_generation";
  auto e = f.on_response(d, 8 * ms);
  ASSERT_TRUE(e.done);
  ASSERT_TRUE(*e.done) << e.done->error().describe();
  EXPECT_EQ((*e.done)->tokens, (std::vector<std::int32_t>{5, 6, 7}));
  EXPECT_EQ((*e.done)->text, "fgh");
  EXPECT_EQ((*e.done)->nodes, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ((*e.done)->attempts, 2u);
  EXPECT_TRUE(f.finished());
  EXPECT_FALSE(f.on_tick(10'000 * ms).done);  // finished: nothing more, ever
}

// The serving peer declared dead: a peer list that no longer names it resumes the stream as soon
// as that peer has been silent for gone_stall_ms (700 ms; a dead peer is silent since it died),
// not after 3 s. Lists without node ids (a peer with no view yet), lists that name it, and lists
// before any peer accepted change nothing; nor does one omitting a peer that still streams to us
// (a partition between the peers only). The longest wait between two tokens is what the client
// reports as the failover's cost.
TEST(StreamFollower, APeerListWithoutTheServingPeerResumesOnceItIsSilent) {
  stream_follower f(valid_request(), {}, 0);
  auto peers = msg("peers", 0, "c");
  peers.id.clear();
  peers.nodes = {"c", "b"};
  EXPECT_FALSE(f.on_peers(peers, ms).publish);  // nothing accepted yet
  (void)f.on_response(msg("accepted", 0, "a"), 2 * ms);
  (void)f.on_response(tok(0, 0, 5, "a"), 3 * ms);
  auto no_view = peers;
  no_view.nodes.clear();
  EXPECT_FALSE(f.on_peers(no_view, 4 * ms).publish);
  auto with_a = peers;
  with_a.nodes = {"c", "a", "b"};
  EXPECT_FALSE(f.on_peers(with_a, 5 * ms).publish);
  EXPECT_FALSE(f.on_peers(peers, 600 * ms).publish);  // gone from c's view, silent 597 ms
  EXPECT_EQ(f.wake_at_us(), 703 * ms);
  auto s = f.on_tick(703 * ms);
  ASSERT_TRUE(s.publish);
  EXPECT_EQ(s.publish->attempt, 1u);
  EXPECT_EQ(s.publish->resume, (std::vector<std::int32_t>{5}));
  EXPECT_FALSE(f.on_peers(peers, 704 * ms).publish);  // the new attempt has no serving peer yet
  (void)f.on_response(msg("accepted", 1, "b"), 750 * ms);
  EXPECT_FALSE(f.on_peers(peers, 760 * ms).publish);  // b is listed
  EXPECT_TRUE(f.on_response(tok(1, 1, 6, "b"), 800 * ms).token);
  auto d = msg("done", 1, "b");
  d.tokens = 2;
  auto e = f.on_response(d, 810 * ms);
  ASSERT_TRUE(e.done && *e.done);
  EXPECT_EQ((*e.done)->attempts, 2u);
  EXPECT_DOUBLE_EQ((*e.done)->longest_gap_s, 0.797);  // index 0 at 3 ms, index 1 at 800 ms

  // Cut off from the list's sender but streaming to us: the stream stays.
  stream_follower g(valid_request(), {}, 0);
  (void)g.on_response(msg("accepted", 0, "a"), ms);
  for (std::uint32_t i = 0; i < 200; ++i) {
    EXPECT_TRUE(g.on_response(tok(0, i, 5, "a"), (10 + 10 * i) * ms).token);
    EXPECT_FALSE(g.on_peers(peers, (15 + 10 * i) * ms).publish);
    EXPECT_FALSE(g.on_tick((16 + 10 * i) * ms).publish);
  }
}

// Two peers accept one attempt (their views differ): the client keeps the first and tells the
// other, by node id, to stop; nothing more from that one counts, not even an error.
TEST(StreamFollower, ASecondPeerServingTheSameAttemptIsCancelledByName) {
  stream_follower f(valid_request(), {}, 0);
  (void)f.on_response(msg("accepted", 0, "a"), ms);
  auto s = f.on_response(msg("accepted", 0, "c"), 2 * ms);
  ASSERT_TRUE(s.publish);
  EXPECT_TRUE(s.publish->cancel);
  EXPECT_EQ(s.publish->node, "c");
  EXPECT_EQ(s.publish->attempt, 0u);
  EXPECT_FALSE(f.on_response(tok(0, 0, 5, "c"), 3 * ms).token);  // cut: ignored
  auto err = msg("error", 0, "c");
  err.code = std::string(error_code::cancelled);
  EXPECT_FALSE(f.on_response(err, 4 * ms).done);
  EXPECT_TRUE(f.on_response(tok(0, 0, 5, "a"), 5 * ms).token);
  auto d = msg("done", 0, "a");
  d.tokens = 1;
  auto e = f.on_response(d, 6 * ms);
  ASSERT_TRUE(e.done && *e.done);
  EXPECT_EQ((*e.done)->nodes, (std::vector<std::string>{"a"}));
}

// A stranger who knows the id cancels the attempt and publishes attempt + 1 with max_tokens 2:
// the peer streams that forged request to the victim's topic and ends it at "max_tokens". The
// victim asked for 8: it fails, naming what happened, instead of exiting 0 with 2 tokens.
TEST(StreamFollower, AStreamEndedAtSomeoneElsesMaxTokensIsAnErrorNotASuccess) {
  stream_follower f(valid_request(), {}, 0);
  EXPECT_TRUE(f.on_response(tok(0, 0, 5), ms).token);
  EXPECT_TRUE(f.on_response(tok(0, 1, 6), 2 * ms).token);
  auto d = msg("done", 0);
  d.tokens = 2;
  d.stop = "max_tokens";
  auto e = f.on_response(d, 3 * ms);
  ASSERT_TRUE(e.done);
  ASSERT_FALSE(*e.done);
  EXPECT_EQ(e.done->error().code, errc::protocol);
  EXPECT_NE(e.done->error().message.find("after 2 of the 8 tokens"), std::string::npos)
      << e.done->error().message;
}

TEST(StreamFollower, SilenceShortDoneAndUnavailableResumeOtherErrorsEnd) {
  stream_follower f(valid_request(), {}, 0);
  (void)f.on_response(tok(0, 0, 1), ms);
  EXPECT_FALSE(f.on_tick(3000 * ms).publish);
  auto s = f.on_tick(3001 * ms);  // 3 s of silence after the last token
  ASSERT_TRUE(s.publish);
  EXPECT_EQ(s.publish->attempt, 1u);
  auto d = msg("done", 1);
  d.tokens = 5;  // claims more than arrived
  s = f.on_response(d, 3002 * ms);
  ASSERT_TRUE(s.publish);
  EXPECT_EQ(s.publish->attempt, 2u);
  auto u = msg("error", 2);
  u.code = std::string(error_code::unavailable);
  s = f.on_response(u, 3003 * ms);
  ASSERT_TRUE(s.publish);
  EXPECT_EQ(s.publish->attempt, 3u);
  EXPECT_EQ(s.publish->resume, std::vector<std::int32_t>{1});
  auto x = msg("error", 3);
  x.code = std::string(error_code::no_capacity);
  x.message = "model 'tiny': no group fits";
  s = f.on_response(x, 3004 * ms);
  ASSERT_TRUE(s.done);
  ASSERT_FALSE(*s.done);
  EXPECT_EQ(s.done->error().code, errc::no_capacity);
  EXPECT_NE(s.done->error().message.find("no group fits"), std::string::npos);
}

TEST(StreamFollower, GivesUpAfterItsAttemptsOrItsDeadlineAndCancelTellsThePeer) {
  follower_options o;
  o.max_attempts = 2;
  o.deadline_ms = 10'000;
  {
    stream_follower f(valid_request(), o, 0);
    auto u = msg("error", 0);
    u.code = std::string(error_code::unavailable);
    ASSERT_TRUE(f.on_response(u, ms).publish);
    u.attempt = 1;
    auto s = f.on_response(u, 2 * ms);
    ASSERT_TRUE(s.done);
    EXPECT_EQ(s.done->error().code, errc::timeout);
    EXPECT_NE(s.done->error().message.find("2 attempts"), std::string::npos);
  }
  {
    stream_follower f(valid_request(), o, 0);
    follower_step s;
    for (std::uint64_t t = 0; t <= 10'000 * ms && !s.done; t += 100 * ms)
      s = f.on_tick(t);
    ASSERT_TRUE(s.done);
    EXPECT_EQ(s.done->error().code, errc::timeout);
    EXPECT_NE(s.done->error().message.find("no peer accepted it"), std::string::npos);
  }
  {
    stream_follower f(valid_request(), o, 0);
    (void)f.on_response(tok(0, 0, 1), ms);
    auto s = f.cancel(2 * ms);
    ASSERT_TRUE(s.publish);
    EXPECT_TRUE(s.publish->cancel);
    EXPECT_EQ(s.publish->id, "r1");
    ASSERT_TRUE(s.done);
    EXPECT_EQ(s.done->error().code, errc::cancelled);
  }
}

TEST(ServingClient, PeerSyntax) {
  auto a = parse_peer("127.0.0.1:7402");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->request_port, 7402);
  EXPECT_EQ(a->response_port, 7403);
  auto b = parse_peer("host:9000:9100");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->response_port, 9100);
  for (const char* bad :
       {"", "host", ":7402", "host:", "host:0", "host:70000", "host:1:x", "host:65535"})
    EXPECT_FALSE(parse_peer(bad)) << bad;
}

}  // namespace
}  // namespace tessera::mesh::serving

namespace tessera::mesh::serving {
namespace {

// One garbage frame used to take every peer down: msgpack-c believed an array32 header claiming
// 4 billion elements and allocated them (ASan: out-of-memory). Now the limits follow the input.
TEST(ProtocolHostile, AHeaderClaimingBillionsOfElementsIsRefusedWithoutAllocatingThem) {
  const std::string huge_array("\x81\xa2id\xdd\xff\xff\xff\xff", 9);  // {"id": array32(2^32-1)}
  const std::string huge_map("\xdf\xff\xff\xff\xff", 5);              // map32(2^32-1)
  const std::string huge_str("\x81\xa2id\xdb\xff\xff\xff\xf0", 9);    // {"id": str32(~4 GiB)}
  std::string deep(1000, '\x91');                                     // 1000 nested arrays
  deep += '\xc0';
  for (const auto& bytes : {huge_array, huge_map, huge_str, deep}) {
    auto r = decode_request(bytes);
    ASSERT_FALSE(r.has_value());
    EXPECT_NE(r.error().message.find("request"), std::string::npos) << r.error().message;
    EXPECT_FALSE(decode_response(bytes).has_value());
  }
  // Nothing valid is refused: a request with a long resume list still decodes.
  request ok;
  ok.id = "long-resume";
  ok.model = "m";
  ok.prompt = "p";
  ok.resume.assign(4000, 7);
  auto back = decode_request(encode(ok));
  ASSERT_TRUE(back.has_value()) << back.error().message;
  EXPECT_EQ(back->resume.size(), 4000u);
}

}  // namespace
}  // namespace tessera::mesh::serving
