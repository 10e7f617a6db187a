#include <cstdio>
#include <cstdlib>
#include <vector>

#include "actors/system.hpp"
#include "bench/actors/workloads.hpp"

#include "actors/actor_cell.hpp"

namespace tessera::bench {
namespace {
using namespace tessera::actors;

struct ping {
  TESSERA_MESSAGE("tessera.bench.ping");
  std::uint64_t left = 0;
  MSGPACK_DEFINE(left);
};
struct pong {
  TESSERA_MESSAGE("tessera.bench.pong");
  std::uint64_t left = 0;
  MSGPACK_DEFINE(left);
};
struct go {
  TESSERA_MESSAGE("tessera.bench.go");
  std::uint64_t count = 0;
  MSGPACK_DEFINE(count);
};
struct link {
  TESSERA_MESSAGE("tessera.bench.link");
  actor_ref to;
  MSGPACK_DEFINE(to);
};

config bench_config(unsigned threads) {
  config c;
  c.workers = threads;
  return c;
}

class ponger : public actor {
 public:
  ponger() {
    on<ping>([this](ping& p) { (void)send(current_sender(), pong{p.left}); });
  }
};

class pinger : public actor {
 public:
  pinger(actor_ref peer, done_signal& done) : peer_(std::move(peer)), done_(done) {
    on<go>([this](go& g) { (void)send(peer_, ping{g.count}); });
    on<pong>([this](pong& p) {
      if (p.left <= 1) {
        done_.notify();
        return;
      }
      (void)send(peer_, ping{p.left - 1});
    });
  }

 private:
  actor_ref peer_;
  done_signal& done_;
};

class ping_pong_workload final : public workload {
 public:
  ping_pong_workload(unsigned threads, std::uint64_t round_trips, bool pinned)
      : sys_(bench_config(threads)), round_trips_(round_trips) {
    spawn_options a, b;
    if (pinned) {
      a.worker = 0;
      b.worker = 1;
    }
    auto po = sys_.spawn(std::make_unique<ponger>(), b);
    pinger_ = *sys_.spawn(std::make_unique<pinger>(*po, done_), a);
  }
  void run() override {
    done_.reset();
    (void)sys_.send(pinger_, go{round_trips_});
    done_.wait();
  }

 private:
  done_signal done_;
  actor_system sys_;
  actor_ref pinger_;
  std::uint64_t round_trips_;
};

class sink : public actor {
 public:
  sink(std::uint64_t& expected, done_signal& done) : expected_(expected), done_(done) {
    on<ping>([this](ping&) {
      if (++seen_ == expected_) {
        seen_ = 0;
        done_.notify();
      }
    });
  }

 private:
  std::uint64_t seen_ = 0;
  std::uint64_t& expected_;
  done_signal& done_;
};

class source : public actor {
 public:
  explicit source(actor_ref to) : to_(std::move(to)) {
    on<go>([this](go& g) {
      for (std::uint64_t i = 0; i < g.count; ++i) {
        // The sink's mailbox holds a whole batch: a refusal is a runtime bug, and the sink
        // would wait forever for the lost message.
        if (auto r = send(to_, ping{i}); !r) {
          std::fprintf(stderr, "fan-in: send %llu refused: %s\n",
                       static_cast<unsigned long long>(i), r.error().describe().c_str());
          std::abort();
        }
      }
    });
  }

 private:
  actor_ref to_;
};

class fan_in_workload final : public workload {
 public:
  fan_in_workload(unsigned threads, unsigned senders, std::uint64_t per_sender)
      : expected_(senders * per_sender), sys_(bench_config(threads)), per_sender_(per_sender) {
    spawn_options big;
    // CAF's mailboxes are unbounded; size ours to the batch, plus the slots other workers' open
    // send batches may hold reserved and unused at the end (fewer than one batch each).
    big.data_capacity = expected_ + 1 + std::size_t{actor_cell::send_batch_limit} * threads;
    auto s = sys_.spawn(std::make_unique<sink>(expected_, done_), big);
    for (unsigned i = 0; i < senders; ++i) sources_.push_back(*sys_.spawn<source>(*s));
  }
  void run() override {
    done_.reset();
    for (auto& s : sources_) (void)sys_.send(s, go{per_sender_});
    done_.wait();
  }

 private:
  std::uint64_t expected_;
  done_signal done_;
  actor_system sys_;
  std::vector<actor_ref> sources_;
  std::uint64_t per_sender_;
};

class ring_member : public actor {
 public:
  explicit ring_member(done_signal& done) : done_(done) {
    on<link>([this](link& l) { next_ = l.to; });
    on<ping>([this](ping& p) {
      if (p.left == 0) {
        done_.notify();
        return;
      }
      (void)send(next_, ping{p.left - 1});
    });
  }

 private:
  actor_ref next_;
  done_signal& done_;
};

class ring_workload final : public workload {
 public:
  ring_workload(unsigned threads, unsigned actors, std::uint64_t hops)
      : sys_(bench_config(threads)), hops_(hops) {
    for (unsigned i = 0; i < actors; ++i) members_.push_back(*sys_.spawn<ring_member>(done_));
    for (unsigned i = 0; i < actors; ++i) {
      (void)sys_.send(members_[i], link{members_[(i + 1) % actors]});
    }
  }
  void run() override {
    done_.reset();
    (void)sys_.send(members_[0], ping{hops_});
    done_.wait();
  }

 private:
  done_signal done_;
  actor_system sys_;
  std::vector<actor_ref> members_;
  std::uint64_t hops_;
};

}  // namespace

std::unique_ptr<workload> tessera_ping_pong(unsigned threads, std::uint64_t round_trips,
                                            bool pinned) {
  return std::make_unique<ping_pong_workload>(threads, round_trips, pinned);
}
std::unique_ptr<workload> tessera_fan_in(unsigned threads, unsigned senders,
                                         std::uint64_t per_sender) {
  return std::make_unique<fan_in_workload>(threads, senders, per_sender);
}
std::unique_ptr<workload> tessera_ring(unsigned threads, unsigned actors, std::uint64_t hops) {
  return std::make_unique<ring_workload>(threads, actors, hops);
}

}  // namespace tessera::bench
