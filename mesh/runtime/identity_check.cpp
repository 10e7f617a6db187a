#include "mesh/runtime/identity_check.hpp"

#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <msgpack.hpp>
#include <nlohmann/json.hpp>

namespace tessera::mesh::runtime {

identity_reading read_identity_answer(const std::string& document, const node_instance& self,
                                      const std::string& hex, const std::string& endpoint,
                                      const std::string& data_dir) {
  identity_reading out;
  const auto j = nlohmann::json::parse(document, nullptr, false);
  if (!j.is_object()) return out;
  try {
    const auto& n = j.at("node");
    if (n.at("id").get<std::string>() == hex && n.contains("instance_nonce")) {
      node_instance heard;
      heard.id = self.id;
      heard.control_endpoint = n.at("endpoint").get<std::string>();
      heard.started_unix_ms = n.at("started_unix_ms").get<std::int64_t>();
      heard.nonce = std::stoull(n.at("instance_nonce").get<std::string>(), nullptr, 16);
      if (judge_identity(self, heard) == identity_verdict::we_must_refuse)
        out.refuse = fmt::format(
            "node id {} is already running at {} and started before us: this data directory is "
            "a copy of that node's (cloned machine or restored backup); remove {}/node.id or pass "
            "--reset-identity to give this node a new identity",
            hex, heard.control_endpoint, data_dir);
      return out;
    }
    // Someone else: does it know a member with our id at another endpoint?
    for (const auto& m : j.at("membership")) {
      if (m.at("id").get<std::string>() != hex) continue;
      const auto st = m.at("status").get<std::string>();
      const auto ep = m.at("address").get<std::string>();
      if ((st == "alive" || st == "suspect") && ep != endpoint && ep.rfind("tcp://", 0) == 0)
        out.more_targets.push_back(ep.substr(6));
    }
  } catch (const std::exception&) {
    // A document without the fields (another version, a broken node) says nothing.
  }
  return out;
}

namespace {

struct identity_round {
  TESSERA_MESSAGE("tessera.node.identity_round");
  std::uint32_t index = 0;  // into options.rounds; == its size: the answers' wait is over
  MSGPACK_DEFINE(index);
};

struct identity_answer {
  TESSERA_MESSAGE("tessera.node.identity_answer");
  std::string document;
  MSGPACK_DEFINE(document);
};

class identity_check_actor final : public actors::actor {
 public:
  explicit identity_check_actor(identity_check_options o) : opt_(std::move(o)) {}

  void on_start() override {
    on<identity_round>([this](identity_round& r) { round(r.index); });
    on<identity_answer>([this](identity_answer& a) { answer(a.document); });
    for (const auto& s : opt_.seeds) {
      if (targets_.size() >= kIdentitySeedsAsked) break;
      targets_.push_back(s.rfind("tcp://", 0) == 0 ? s.substr(6) : s);
    }
    if (targets_.empty() || opt_.rounds.empty()) {
      quit();  // nobody to ask: a first node, or one found only by discovery
      return;
    }
    schedule(0);
  }

  void on_stop(const actors::exit_reason&) override {
    if (client_) client_->stop();
  }

 private:
  void schedule(std::uint32_t index) {
    const auto at = index < opt_.rounds.size() ? opt_.rounds[index] : last_at_ + opt_.answer_wait;
    const auto in = at > last_at_ ? at - last_at_ : std::chrono::milliseconds(0);
    last_at_ = at;
    (void)after(in, identity_round{index});
  }

  void round(std::uint32_t index) {
    if (index >= opt_.rounds.size()) {
      quit();  // the last round's answers had their time
      return;
    }
    if (!client_ && !start_client()) return;
    for (const auto& t : targets_)
      ask(t);
    schedule(index + 1);
  }

  bool start_client() {
    actors::actor_system* sys = &system();
    const actors::actor_ref me = self();
    auto c = status_client::start(opt_.client, [sys, me](const std::string&, std::string doc) {
      // On the client's I/O thread: a full mailbox loses this answer; the next round asks again.
      (void)sys->send(me, identity_answer{std::move(doc)});
    });
    if (!c) {
      spdlog::warn("node {}: the duplicate-identity check cannot start its status client: {}",
                   opt_.hex, c.error().describe());
      quit();
      return false;
    }
    client_ = std::move(c).value();
    return true;
  }

  void ask(const std::string& target) {
    if ("tcp://" + target == opt_.endpoint) return;
    if (!asked_.contains(target) && asked_.size() >= kIdentityNodesAsked) return;
    asked_.insert(target);
    if (auto r = client_->ask(target); !r)
      spdlog::debug("node {}: identity check: cannot ask {}: {}", opt_.hex, target,
                    r.error().describe());
  }

  void answer(const std::string& document) {
    auto reading =
        read_identity_answer(document, opt_.self, opt_.hex, opt_.endpoint, opt_.data_dir);
    if (reading.refuse) {
      if (opt_.refuse) opt_.refuse(*reading.refuse);
      quit();
      return;
    }
    for (auto& t : reading.more_targets) {
      if (asked_.contains(t) || asked_.size() >= kIdentityNodesAsked) continue;
      targets_.push_back(t);  // asked again in the next round too
      if (client_) ask(t);
    }
  }

  identity_check_options opt_;
  std::unique_ptr<status_client> client_;
  std::vector<std::string> targets_;  // asked every round
  std::set<std::string> asked_;       // at most kIdentityNodesAsked
  std::chrono::milliseconds last_at_{0};
};

}  // namespace

std::unique_ptr<actors::actor> make_identity_check(identity_check_options options) {
  return std::make_unique<identity_check_actor>(std::move(options));
}

}  // namespace tessera::mesh::runtime
