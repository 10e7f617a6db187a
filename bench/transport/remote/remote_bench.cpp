// Remote actor throughput and round trip between two processes on loopback (CURVE on), beside the
// raw control plane (control_node::send of the same size, no actors) between the same two nodes.
//   tessera_remote_bench [messages per rep] [round trips per rep] [reps]
// The parent is node 1; it starts itself again as node 2 (`--peer <endpoint>`).
#include <unistd.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "transport/remote/control_router.hpp"

namespace {
using namespace tessera;
using namespace tessera::transport;
using clk = std::chrono::steady_clock;

constexpr const char* kSecret = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
constexpr std::uint16_t kRawPing = 100, kRawPong = 101, kRawOneWay = 102, kRawExpect = 103,
                        kRawDone = 104;

struct ping {
  TESSERA_MESSAGE("bench.remote.ping");
  std::uint64_t seq = 0;
  MSGPACK_DEFINE(seq);
};
struct pong {
  TESSERA_MESSAGE("bench.remote.pong");
  std::uint64_t seq = 0;
  MSGPACK_DEFINE(seq);
};
struct count_q {
  TESSERA_MESSAGE("bench.remote.count_q");
  int unused = 0;
  MSGPACK_DEFINE(unused);
};
struct count_r {
  TESSERA_MESSAGE("bench.remote.count_r");
  std::uint64_t n = 0;
  MSGPACK_DEFINE(n);
};

class sink final : public actors::actor {
 public:
  sink() {
    on<ping>([this](ping&) { ++n_; });
    on<count_q>([this](count_q&) { return count_r{n_}; });
  }

 private:
  std::uint64_t n_ = 0;
};
class echo final : public actors::actor {
 public:
  echo() {
    on<ping>([](ping& p) { return pong{p.seq}; });
  }
};
/// Sends `n` requests one after another; fulfils `done` with the elapsed time.
class pinger final : public actors::actor {
 public:
  pinger(actors::actor_ref target, std::uint64_t n, std::promise<double>* done)
      : target_(target), n_(n), done_(done) {}
  void on_start() override {
    start_ = clk::now();
    next();
  }

 private:
  void next() {
    if (i_ == n_) {
      done_->set_value(std::chrono::duration<double>(clk::now() - start_).count());
      quit();
      return;
    }
    auto r = request<pong>(target_, ping{i_++}, std::chrono::seconds(30), [this](result<pong> p) {
      if (!p) {
        std::fprintf(stderr, "request failed: %s\n", p.error().describe().c_str());
        std::exit(1);
      }
      next();
    });
    if (!r) {
      std::fprintf(stderr, "request refused: %s\n", r.error().describe().c_str());
      std::exit(1);
    }
  }
  actors::actor_ref target_;
  std::uint64_t n_, i_ = 0;
  std::promise<double>* done_;
  clk::time_point start_;
};

std::string pack_u64(std::uint64_t v) {
  msgpack::sbuffer b;
  msgpack::pack(b, v);
  return {b.data(), b.size()};
}
std::uint64_t unpack_u64(const std::string& s) {
  return msgpack::unpack(s.data(), s.size())->as<std::uint64_t>();
}
std::span<const std::byte> bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

control::node_config node_cfg(const std::string& id) {
  control::node_config c;
  c.node_id = id;
  auto secret = control::parse_cluster_secret(kSecret, "bench");
  c.keys = *control::derive_cluster_keys(*secret);
  c.send_queue_capacity = 4096;
  c.timing.dead_after_ms = 10000;  // a loaded machine must not declare the peer dead mid-run
  return c;
}

void must(const result<void>& r, const char* what) {
  if (!r) {
    std::fprintf(stderr, "%s: %s\n", what, r.error().describe().c_str());
    std::exit(1);
  }
}

/// Sends through the control node, retrying while the queue is full (back-pressure).
void send_retry(control::control_node& n, const char* peer, std::uint16_t type,
                const std::string& body) {
  for (;;) {
    auto r = n.send(peer, type, bytes(body));
    if (r) return;
    if (r.error().code != errc::overloaded) must(r, "raw send");
    std::this_thread::yield();
  }
}

int run_peer(const std::string& parent_endpoint) {
  actors::config cfg;
  cfg.node = 2;
  cfg.workers = 1;
  actors::actor_system sys(cfg);
  std::atomic<control::control_node*> ctl{nullptr};
  std::uint64_t raw_count = 0, raw_expect = 0;
  control::node_handlers extra;
  extra.on_message = [&](control::inbound_message&& m) {
    auto* c = ctl.load();
    if (c == nullptr) return;
    if (m.type == kRawPing) {
      (void)c->send(m.sender, kRawPong, bytes(m.body));
    } else if (m.type == kRawExpect) {
      raw_expect = unpack_u64(m.body);
      raw_count = 0;
    } else if (m.type == kRawOneWay && ++raw_count == raw_expect) {
      (void)c->send(m.sender, kRawDone, bytes(pack_u64(raw_count)));
    }
  };
  auto rn = transport::remote::remote_node::start(sys, node_cfg("node-2"), {}, extra);
  if (!rn) return 1;
  ctl.store(&(*rn)->control());
  must((*rn)->add_node(1, "node-1", parent_endpoint), "add node 1");
  // The sink's mailbox holds a whole run: a full mailbox would refuse (count) remote messages,
  // and this benchmark measures the transport, not the drop rate.
  actors::spawn_options big;
  big.data_capacity = 1u << 21;
  auto s = sys.spawn_with<sink>(big);
  auto e = sys.spawn<echo>();
  std::printf("ready %s %llu %llu\n", (*rn)->endpoint().c_str(),
              static_cast<unsigned long long>(s->id()), static_cast<unsigned long long>(e->id()));
  std::fflush(stdout);
  char buf[16];
  while (std::fgets(buf, sizeof buf, stdin) != nullptr) {
  }
  sys.shutdown();
  (*rn)->stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--peer") return run_peer(argv[2]);
  const std::uint64_t messages =
      std::min<std::uint64_t>(argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 200000, 1u << 20);
  const std::uint64_t trips = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 20000;
  const int reps = std::max(1, argc > 3 ? std::atoi(argv[3]) : 5);

  actors::config cfg;
  cfg.node = 1;
  cfg.workers = 1;
  actors::actor_system sys(cfg);
  std::atomic<std::uint64_t> pongs{0};
  std::atomic<bool> raw_done{false};
  control::node_handlers extra;
  extra.on_message = [&](control::inbound_message&& m) {
    if (m.type == kRawPong) pongs.fetch_add(1, std::memory_order_release);
    if (m.type == kRawDone) raw_done.store(true, std::memory_order_release);
  };
  std::atomic<bool> peer_up{false};
  extra.on_peer_event = [&](const control::peer_event& e) {
    if (e.kind == control::peer_event_kind::up) peer_up = true;
  };
  auto rn = transport::remote::remote_node::start(sys, node_cfg("node-1"), {}, extra);
  must(rn ? ok() : result<void>(rn.error()), "start node 1");
  auto& ctl = (*rn)->control();

  int in[2], out[2];
  if (::pipe(in) != 0 || ::pipe(out) != 0) return 1;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::close(in[1]);
    ::close(out[0]);
    ::execl("/proc/self/exe", argv[0], "--peer", (*rn)->endpoint().c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  std::FILE* child = ::fdopen(out[0], "r");
  char line[512];
  char ep[256];
  unsigned long long sink_id = 0, echo_id = 0;
  if (std::fgets(line, sizeof line, child) == nullptr ||
      std::sscanf(line, "ready %255s %llu %llu", ep, &sink_id, &echo_id) != 3) {
    std::fprintf(stderr, "peer did not start\n");
    return 1;
  }
  must((*rn)->add_node(2, "node-2", ep), "add node 2");
  while (!peer_up) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const actors::actor_ref sink_ref(2, sink_id), echo_ref(2, echo_id);
  // Warm-up: both directions connected, allocators warm.
  for (int i = 0; i < 1000; ++i) must(sys.ask<pong>(echo_ref, ping{1}, std::chrono::seconds(30)) ? ok() : result<void>(error{errc::timeout, "warm-up"}), "warm-up");

  const std::string body8 = pack_u64(0x0123456789abcdefull);  // the same body size as ping{seq}

  // Phases run interleaved in each repetition; medians over repetitions, and the median of the
  // per-repetition ratios (the machine's load moves between repetitions, less within one).
  std::vector<double> raw_rtt, actor_rtt, rtt_ratio, raw_rate, actor_rate, rate_ratio;
  std::uint64_t refused = 0, sunk = 0;
  for (int rep = 0; rep < reps; ++rep) {
    // 1. Raw control plane round trip: main thread sends, node 2's I/O thread echoes from its
    // callback, the main thread polls (yielding) for the pong.
    const std::uint64_t base = pongs.load();
    auto t0 = clk::now();
    for (std::uint64_t i = 0; i < trips; ++i) {
      send_retry(ctl, "node-2", kRawPing, body8);
      while (pongs.load(std::memory_order_acquire) <= base + i) std::this_thread::yield();
    }
    raw_rtt.push_back(std::chrono::duration<double, std::micro>(clk::now() - t0).count() / trips);

    // 2. Remote actor round trip (an actor on node 1 requesting from an actor on node 2).
    std::promise<double> done;
    auto fut = done.get_future();
    must(sys.spawn<pinger>(echo_ref, trips, &done) ? ok() : result<void>(error{errc::internal, "spawn"}), "spawn pinger");
    actor_rtt.push_back(fut.get() * 1e6 / trips);
    rtt_ratio.push_back(actor_rtt.back() / raw_rtt.back());

    // 3. Raw control plane one-way throughput.
    raw_done.store(false);
    send_retry(ctl, "node-2", kRawExpect, pack_u64(messages));
    t0 = clk::now();
    for (std::uint64_t i = 0; i < messages; ++i) send_retry(ctl, "node-2", kRawOneWay, body8);
    while (!raw_done.load(std::memory_order_acquire)) std::this_thread::yield();
    raw_rate.push_back(messages / std::chrono::duration<double>(clk::now() - t0).count());

    // 4. Remote actor one-way throughput (sends from outside any actor, retried when overloaded).
    t0 = clk::now();
    for (std::uint64_t i = 0; i < messages; ++i) {
      for (;;) {
        auto r = sys.send(sink_ref, ping{i});
        if (r) break;
        if (r.error().code != errc::overloaded) must(r, "actor send");
        ++refused;
        std::this_thread::yield();
      }
    }
    sunk += messages;
    for (;;) {
      auto c = sys.ask<count_r>(sink_ref, count_q{}, std::chrono::seconds(30));
      must(c ? ok() : result<void>(c.error()), "count");
      if (c->n >= sunk) break;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    actor_rate.push_back(messages / std::chrono::duration<double>(clk::now() - t0).count());
    rate_ratio.push_back(actor_rate.back() / raw_rate.back());
    std::printf("  rep %d: rtt raw %.1f us actor %.1f us; one-way raw %.0f actor %.0f msg/s\n", rep,
                raw_rtt.back(), actor_rtt.back(), raw_rate.back(), actor_rate.back());
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("remote actors, 2 processes, loopback, CURVE on, 1 worker per system, %d reps\n", reps);
  std::printf("  round trip   raw control %.1f us   actor request/response %.1f us   ratio %.2fx  (%llu trips/rep)\n",
              median(raw_rtt), median(actor_rtt), median(rtt_ratio), static_cast<unsigned long long>(trips));
  std::printf("  one-way      raw control %.0f msg/s   actor send %.0f msg/s   ratio %.2fx  (%llu msgs/rep, %llu overloaded retries)\n",
              median(raw_rate), median(actor_rate), median(rate_ratio),
              static_cast<unsigned long long>(messages), static_cast<unsigned long long>(refused));
  ::close(in[1]);
  ::waitpid(pid, nullptr, 0);
  sys.shutdown();
  (*rn)->stop();
  return 0;
}
