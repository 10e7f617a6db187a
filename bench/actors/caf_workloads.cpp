// The same workloads on CAF 0.17 (scheduled event-based actors, CAF's default work-stealing
// scheduler limited to the same number of threads).
#include <vector>

#include <caf/all.hpp>

#include "bench/actors/workloads.hpp"

namespace tessera::bench {
namespace {

using ping_atom = caf::atom_constant<caf::atom("ping")>;
using pong_atom = caf::atom_constant<caf::atom("pong")>;
using go_atom = caf::atom_constant<caf::atom("go")>;
using link_atom = caf::atom_constant<caf::atom("link")>;

caf::actor_system_config& caf_config(caf::actor_system_config& cfg, unsigned threads) {
  cfg.set("scheduler.max-threads", static_cast<size_t>(threads));
  return cfg;
}

caf::behavior caf_ponger(caf::event_based_actor* self) {
  return {[=](ping_atom, std::uint64_t left) {
    self->send(caf::actor_cast<caf::actor>(self->current_sender()), pong_atom::value, left);
  }};
}

caf::behavior caf_pinger(caf::event_based_actor* self, caf::actor peer, done_signal* done) {
  return {
      [=](go_atom, std::uint64_t count) { self->send(peer, ping_atom::value, count); },
      [=](pong_atom, std::uint64_t left) {
        if (left <= 1) {
          done->notify();
          return;
        }
        self->send(peer, ping_atom::value, left - 1);
      },
  };
}

class caf_ping_pong_workload final : public workload {
 public:
  caf_ping_pong_workload(unsigned threads, std::uint64_t round_trips, bool detached)
      : sys_(caf_config(cfg_, threads)), round_trips_(round_trips) {
    if (detached) {
      // CAF 0.17 cannot pin a scheduled actor to a worker; a detached actor runs on a thread of
      // its own (blocking on its mailbox), the only way to put the two on different threads.
      ponger_ = sys_.spawn<caf::detached>(caf_ponger);
      pinger_ = sys_.spawn<caf::detached>(caf_pinger, ponger_, &done_);
    } else {
      ponger_ = sys_.spawn(caf_ponger);
      pinger_ = sys_.spawn(caf_pinger, ponger_, &done_);
    }
  }
  ~caf_ping_pong_workload() override {
    caf::anon_send_exit(pinger_, caf::exit_reason::kill);
    caf::anon_send_exit(ponger_, caf::exit_reason::kill);
  }
  void run() override {
    done_.reset();
    caf::anon_send(pinger_, go_atom::value, round_trips_);
    done_.wait();
  }

 private:
  done_signal done_;
  caf::actor_system_config cfg_;
  caf::actor_system sys_;
  caf::actor ponger_;
  caf::actor pinger_;
  std::uint64_t round_trips_;
};

struct sink_state {
  std::uint64_t seen = 0;
};

caf::behavior caf_sink(caf::stateful_actor<sink_state>* self, std::uint64_t expected,
                       done_signal* done) {
  return {[=](ping_atom, std::uint64_t) {
    if (++self->state.seen == expected) {
      self->state.seen = 0;
      done->notify();
    }
  }};
}

caf::behavior caf_source(caf::event_based_actor* self, caf::actor to) {
  return {[=](go_atom, std::uint64_t count) {
    for (std::uint64_t i = 0; i < count; ++i) self->send(to, ping_atom::value, i);
  }};
}

class caf_fan_in_workload final : public workload {
 public:
  caf_fan_in_workload(unsigned threads, unsigned senders, std::uint64_t per_sender)
      : sys_(caf_config(cfg_, threads)), per_sender_(per_sender) {
    auto s = sys_.spawn(caf_sink, senders * per_sender, &done_);
    for (unsigned i = 0; i < senders; ++i) sources_.push_back(sys_.spawn(caf_source, s));
  }
  void run() override {
    done_.reset();
    for (auto& s : sources_) caf::anon_send(s, go_atom::value, per_sender_);
    done_.wait();
  }

 private:
  done_signal done_;
  caf::actor_system_config cfg_;
  caf::actor_system sys_;
  std::vector<caf::actor> sources_;
  std::uint64_t per_sender_;
};

struct ring_state {
  caf::actor next;
};

caf::behavior caf_ring_member(caf::stateful_actor<ring_state>* self, done_signal* done) {
  return {
      [=](link_atom, caf::actor next) { self->state.next = std::move(next); },
      [=](ping_atom, std::uint64_t left) {
        if (left == 0) {
          done->notify();
          return;
        }
        self->send(self->state.next, ping_atom::value, left - 1);
      },
  };
}

class caf_ring_workload final : public workload {
 public:
  caf_ring_workload(unsigned threads, unsigned actors, std::uint64_t hops)
      : sys_(caf_config(cfg_, threads)), hops_(hops) {
    for (unsigned i = 0; i < actors; ++i) members_.push_back(sys_.spawn(caf_ring_member, &done_));
    for (unsigned i = 0; i < actors; ++i) {
      caf::anon_send(members_[i], link_atom::value, members_[(i + 1) % actors]);
    }
  }
  ~caf_ring_workload() override {
    for (auto& m : members_) caf::anon_send_exit(m, caf::exit_reason::kill);
  }
  void run() override {
    done_.reset();
    caf::anon_send(members_[0], ping_atom::value, hops_);
    done_.wait();
  }

 private:
  done_signal done_;
  caf::actor_system_config cfg_;
  caf::actor_system sys_;
  std::vector<caf::actor> members_;
  std::uint64_t hops_;
};

}  // namespace

std::unique_ptr<workload> caf_ping_pong(unsigned threads, std::uint64_t round_trips,
                                        bool detached) {
  return std::make_unique<caf_ping_pong_workload>(threads, round_trips, detached);
}
std::unique_ptr<workload> caf_fan_in(unsigned threads, unsigned senders, std::uint64_t per_sender) {
  return std::make_unique<caf_fan_in_workload>(threads, senders, per_sender);
}
std::unique_ptr<workload> caf_ring(unsigned threads, unsigned actors, std::uint64_t hops) {
  return std::make_unique<caf_ring_workload>(threads, actors, hops);
}

}  // namespace tessera::bench
