// Control-plane round trip and throughput between two processes on tcp loopback, against a raw
// libzmq DEALER/ROUTER ping-pong written here, with and without CURVE. Modes are interleaved
// within each repetition; figures are medians (and best) over the repetitions.
//
//   tessera_control_bench [--reps 7] [--rt 2000] [--msgs 200000]
//
// The echo side runs in a child process (this binary re-executed with --serve MODE). Node round
// trips are measured the way protocol code sees them: the next ping is sent from the inbound
// callback on the node's I/O thread ("callback"), and, for reference, from an application thread
// that waits for each pong ("app thread"). "raw pair" is the raw ping-pong over the nodes' socket
// pattern, one DEALER->ROUTER connection per direction (control_node.hpp), so that node/raw
// splits into what that pattern costs (raw pair/raw) and what the node adds on it.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <msgpack.hpp>
#include <spdlog/spdlog.h>
#include <zmq.hpp>

#include "actors/base/log.hpp"
#include "transport/control/control_node.hpp"

using namespace tessera::transport::control;
using clk = std::chrono::steady_clock;

namespace {

constexpr std::uint16_t kPing = 64, kCount = 65, kPong = 66;
constexpr std::size_t kPayload = 64;

cluster_keys bench_keys() {
  cluster_secret s;
  s.bytes.fill(0x42);
  return *derive_cluster_keys(s);
}

std::string body_of(std::int64_t v) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_array(2);
  pk.pack(v);
  pk.pack_bin(kPayload - 12);
  pk.pack_bin_body(std::string(kPayload - 12, 'x').data(), kPayload - 12);
  return {buf.data(), buf.size()};
}

std::int64_t value_of(const std::string& body) {
  auto h = msgpack::unpack(body.data(), body.size());
  return h.get().via.array.ptr[0].as<std::int64_t>();
}

node_config bench_config(const std::string& id, bool curve) {
  node_config c;
  c.node_id = id;
  if (curve) c.keys = bench_keys();
  c.timing.heartbeat_interval_ms = 200;
  c.timing.dead_after_ms = 60000;
  c.send_queue_capacity = 4096;
  return c;
}

// ---- child side ----

int serve_raw(bool curve) {
  zmq::context_t ctx;
  zmq::socket_t r(ctx, zmq::socket_type::router);
  r.set(zmq::sockopt::linger, 0);
  r.set(zmq::sockopt::rcvhwm, 0);
  if (curve) {
    auto k = bench_keys();
    r.set(zmq::sockopt::curve_server, 1);
    r.set(zmq::sockopt::curve_secretkey, zmq::const_buffer(k.server.secret_key.data(), 32));
  }
  r.bind("tcp://127.0.0.1:*");
  std::printf("%s\n", r.get(zmq::sockopt::last_endpoint).c_str());
  std::fflush(stdout);
  std::uint64_t counted = 0;
  for (;;) {
    zmq::message_t id, m;
    if (!r.recv(id) || !r.recv(m)) return 1;
    const char kind = static_cast<const char*>(m.data())[0];
    if (kind == 'P') {
      r.send(id, zmq::send_flags::sndmore);
      r.send(m, zmq::send_flags::none);
    } else if (kind == 'C') {
      ++counted;
    } else if (kind == 'F') {
      r.send(id, zmq::send_flags::sndmore);
      r.send(zmq::buffer(&counted, sizeof counted), zmq::send_flags::none);
      counted = 0;
    } else if (kind == 'Q') {
      return 0;
    }
  }
}

// The raw ping-pong over two connections: pings arrive on our ROUTER, pongs leave on a DEALER
// connected to the parent's ROUTER at `back`.
int serve_raw_pair(const std::string& back) {
  zmq::context_t ctx;
  zmq::socket_t in(ctx, zmq::socket_type::router);
  in.set(zmq::sockopt::linger, 0);
  in.bind("tcp://127.0.0.1:*");
  zmq::socket_t out(ctx, zmq::socket_type::dealer);
  out.set(zmq::sockopt::linger, 0);
  out.set(zmq::sockopt::routing_id, "echo");
  out.connect(back);
  std::printf("%s\n", in.get(zmq::sockopt::last_endpoint).c_str());
  std::fflush(stdout);
  for (;;) {
    zmq::message_t id, m;
    if (!in.recv(id) || !in.recv(m)) return 1;
    if (static_cast<const char*>(m.data())[0] == 'Q') return 0;
    out.send(m, zmq::send_flags::none);
  }
}

int serve_node(bool curve) {
  control_node* self = nullptr;
  std::int64_t counted = 0;
  std::promise<void> quit;
  node_handlers h;
  h.on_message = [&](inbound_message&& m) {
    if (m.type == kPing) {
      (void)self->send(m.sender, kPong, as_bytes(m.body));
    } else if (m.type == kCount) {
      const auto v = value_of(m.body);
      if (v >= 0) {
        ++counted;
      } else if (v == -1) {
        (void)self->send(m.sender, kPong, as_bytes(body_of(counted)));
        counted = 0;
      } else {
        quit.set_value();
      }
    }
  };
  auto n = control_node::start(bench_config("echo", curve), h);
  if (!n) return 1;
  self = n->get();
  std::printf("%s\n", (*n)->endpoint().c_str());
  std::fflush(stdout);
  quit.get_future().wait();
  return 0;
}

// ---- parent side ----

struct child {
  pid_t pid = -1;
  std::string endpoint;
};

child spawn(const char* mode, const std::string& arg = {}) {
  int out[2];
  if (::pipe(out) != 0) std::abort();
  child c;
  c.pid = ::fork();
  if (c.pid == 0) {
    ::dup2(out[1], 1);
    ::close(out[0]);
    ::execl("/proc/self/exe", "tessera_control_bench", "--serve", mode,
            arg.empty() ? nullptr : arg.c_str(), nullptr);
    ::_exit(127);
  }
  ::close(out[1]);
  FILE* f = ::fdopen(out[0], "r");
  char buf[256] = {};
  if (std::fgets(buf, sizeof buf, f) == nullptr) std::abort();
  std::fclose(f);
  c.endpoint = buf;
  while (!c.endpoint.empty() && c.endpoint.back() == '\n') c.endpoint.pop_back();
  return c;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

class raw_client {
 public:
  raw_client(const std::string& ep, bool curve) : s_(ctx_, zmq::socket_type::dealer) {
    s_.set(zmq::sockopt::linger, 0);
    s_.set(zmq::sockopt::sndhwm, 0);
    if (curve) {
      auto k = bench_keys();
      s_.set(zmq::sockopt::curve_serverkey, zmq::const_buffer(k.server.public_key.data(), 32));
      s_.set(zmq::sockopt::curve_publickey, zmq::const_buffer(k.client.public_key.data(), 32));
      s_.set(zmq::sockopt::curve_secretkey, zmq::const_buffer(k.client.secret_key.data(), 32));
    }
    s_.connect(ep);
    round_trips(100);
  }
  double round_trips(int n) {  // µs per round trip
    std::string msg(kPayload, 'P');
    auto t0 = clk::now();
    for (int i = 0; i < n; ++i) {
      s_.send(zmq::buffer(msg), zmq::send_flags::none);
      zmq::message_t m;
      (void)s_.recv(m);
    }
    return std::chrono::duration<double, std::micro>(clk::now() - t0).count() / n;
  }
  double throughput(int n) {  // messages per second
    std::string msg(kPayload, 'C');
    auto t0 = clk::now();
    for (int i = 0; i < n; ++i) s_.send(zmq::buffer(msg), zmq::send_flags::none);
    s_.send(zmq::str_buffer("F"), zmq::send_flags::none);
    zmq::message_t m;
    (void)s_.recv(m);
    std::uint64_t got = 0;
    std::memcpy(&got, m.data(), sizeof got);
    if (got != static_cast<std::uint64_t>(n)) std::abort();
    return n / std::chrono::duration<double>(clk::now() - t0).count();
  }
  void quit() { s_.send(zmq::str_buffer("Q"), zmq::send_flags::none); }

 private:
  zmq::context_t ctx_;
  zmq::socket_t s_;
};

// The parent's half of "raw pair": pings leave on a DEALER, pongs come back to our ROUTER.
class raw_pair_client {
 public:
  raw_pair_client() : in_(ctx_, zmq::socket_type::router), out_(ctx_, zmq::socket_type::dealer) {
    in_.set(zmq::sockopt::linger, 0);
    in_.bind("tcp://127.0.0.1:*");
    out_.set(zmq::sockopt::linger, 0);
    out_.set(zmq::sockopt::routing_id, "pinger");
  }
  std::string endpoint() { return in_.get(zmq::sockopt::last_endpoint); }
  void connect(const std::string& ep) {
    out_.connect(ep);
    round_trips(100);
  }
  double round_trips(int n) {  // µs per round trip
    std::string msg(kPayload, 'P');
    auto t0 = clk::now();
    for (int i = 0; i < n; ++i) {
      out_.send(zmq::buffer(msg), zmq::send_flags::none);
      zmq::message_t id, m;
      (void)in_.recv(id);
      (void)in_.recv(m);
    }
    return std::chrono::duration<double, std::micro>(clk::now() - t0).count() / n;
  }
  void quit() { out_.send(zmq::str_buffer("Q"), zmq::send_flags::none); }

 private:
  zmq::context_t ctx_;
  zmq::socket_t in_;
  zmq::socket_t out_;
};

class node_client {
 public:
  node_client(const std::string& ep, bool curve) {
    node_handlers h;
    h.on_message = [this](inbound_message&& m) { on_pong(std::move(m)); };
    h.on_peer_event = [this](const peer_event& e) {
      if (e.kind == peer_event_kind::up) up_.set_value();
    };
    node_ = std::move(*control_node::start(bench_config("pinger", curve), h));
    if (!node_->add_peer("echo", ep)) std::abort();
    // The echo learns us from our heartbeat; we see it up once its heartbeats reach us.
    up_.get_future().wait();
    round_trips_callback(100);
  }
  double round_trips_callback(int n) {
    std::promise<void> done;
    auto fut = done.get_future();
    {
      std::lock_guard lock(mu_);
      remaining_ = n;
      chain_ = true;
      done_ = &done;
    }
    auto t0 = clk::now();
    send_ping();
    fut.wait();
    return std::chrono::duration<double, std::micro>(clk::now() - t0).count() / n;
  }
  double round_trips_app_thread(int n) {
    {
      std::lock_guard lock(mu_);
      chain_ = false;
    }
    auto t0 = clk::now();
    for (int i = 0; i < n; ++i) {
      std::unique_lock lock(mu_);
      pongs_ = 0;
      lock.unlock();
      send_ping();
      lock.lock();
      cv_.wait(lock, [&] { return pongs_ > 0; });
    }
    return std::chrono::duration<double, std::micro>(clk::now() - t0).count() / n;
  }
  double throughput(int n) {
    {
      std::lock_guard lock(mu_);
      chain_ = false;
      pongs_ = 0;
    }
    auto t0 = clk::now();
    for (int i = 0; i < n; ++i) send_retrying(kCount, body_of(i));
    send_retrying(kCount, body_of(-1));
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return pongs_ > 0; });
    if (last_value_ != n) std::abort();
    return n / std::chrono::duration<double>(clk::now() - t0).count();
  }
  void quit() { send_retrying(kCount, body_of(-2)); }
  control_stats stats() const { return node_->stats(); }

 private:
  void send_retrying(std::uint16_t type, const std::string& body) {
    // A full queue is the designed backpressure: yield and retry.
    while (!node_->send("echo", type, as_bytes(body))) std::this_thread::yield();
  }
  // The same 64-byte body every time, as the raw client sends one buffer: what is timed is the
  // transport, not building a message (body_of() allocates three times).
  void send_ping() { send_retrying(kPing, ping_body_); }
  void on_pong(inbound_message&& m) {
    std::unique_lock lock(mu_);
    if (chain_) {
      if (--remaining_ > 0) {
        lock.unlock();
        send_ping();
      } else {
        done_->set_value();
      }
      return;
    }
    last_value_ = value_of(m.body);
    ++pongs_;
    cv_.notify_one();
  }

  const std::string ping_body_ = body_of(0);
  std::unique_ptr<control_node> node_;
  std::promise<void> up_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool chain_ = false;
  int remaining_ = 0;
  int pongs_ = 0;
  std::int64_t last_value_ = 0;
  std::promise<void>* done_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  int reps = 7, rt = 2000, msgs = 200000;
  for (int i = 1; i + 1 < argc; i += 2) {  // (--serve MODE [ARG] ends the loop)
    std::string a = argv[i];
    if (a == "--serve") {
      // Logs to stderr: stdout is a pipe the parent closes after reading the endpoint.
      (void)tessera::log::init("warn");
      std::string m = argv[i + 1];
      if (m == "raw") return serve_raw(false);
      if (m == "raw-curve") return serve_raw(true);
      if (m == "node") return serve_node(false);
      if (m == "node-curve") return serve_node(true);
      if (m == "raw-pair" && i + 2 < argc) return serve_raw_pair(argv[i + 2]);
      return 2;
    }
    if (a == "--reps") reps = std::atoi(argv[i + 1]);
    if (a == "--rt") rt = std::atoi(argv[i + 1]);
    if (a == "--msgs") msgs = std::atoi(argv[i + 1]);
  }
  (void)tessera::log::init("warn");
  auto c_raw = spawn("raw"), c_raw_curve = spawn("raw-curve"), c_node = spawn("node"),
       c_node_curve = spawn("node-curve");
  raw_client raw(c_raw.endpoint, false), raw_curve(c_raw_curve.endpoint, true);
  raw_pair_client raw_pair;
  auto c_raw_pair = spawn("raw-pair", raw_pair.endpoint());
  raw_pair.connect(c_raw_pair.endpoint);
  node_client node(c_node.endpoint, false), node_curve(c_node_curve.endpoint, true);

  std::map<std::string, std::vector<double>> r;
  for (int rep = 0; rep < reps; ++rep) {
    r["rt raw"].push_back(raw.round_trips(rt));
    r["rt raw pair"].push_back(raw_pair.round_trips(rt));
    r["rt node"].push_back(node.round_trips_callback(rt));
    r["rt raw curve"].push_back(raw_curve.round_trips(rt));
    r["rt node curve"].push_back(node_curve.round_trips_callback(rt));
    r["rt node app-thread"].push_back(node.round_trips_app_thread(rt));
    r["rt node curve app-thread"].push_back(node_curve.round_trips_app_thread(rt));
    r["tput raw"].push_back(raw.throughput(msgs));
    r["tput node"].push_back(node.throughput(msgs));
    r["tput raw curve"].push_back(raw_curve.throughput(msgs));
    r["tput node curve"].push_back(node_curve.throughput(msgs));
  }
  std::printf("control plane, tcp loopback, 2 processes, %d reps x %d round trips, %d B payload\n",
              reps, rt, static_cast<int>(kPayload));
  std::printf("%-28s %12s %12s\n", "round trip", "median us", "best us");
  for (const char* k : {"rt raw", "rt raw pair", "rt node", "rt raw curve", "rt node curve",
                        "rt node app-thread", "rt node curve app-thread"}) {
    std::printf("%-28s %12.1f %12.1f\n", k, median(r[k]), *std::min_element(r[k].begin(), r[k].end()));
  }
  // Median over repetitions of a's time / b's time in the same repetition.
  auto ratio = [&](const char* a, const char* b) {
    std::vector<double> v;
    for (int i = 0; i < reps; ++i) v.push_back(r[a][i] / r[b][i]);
    return median(v);
  };
  std::printf("ratio node/raw (median of per-rep ratios): plain %.2fx, curve %.2fx\n",
              ratio("rt node", "rt raw"), ratio("rt node curve", "rt raw curve"));
  std::printf("raw pair/raw %.2fx, node/raw pair %.2fx (medians of per-rep ratios)\n",
              ratio("rt raw pair", "rt raw"), ratio("rt node", "rt raw pair"));
  std::printf("%-28s %12s %12s   (%d messages one way, then one reply)\n", "throughput",
              "median msg/s", "best msg/s", msgs);
  for (const char* k : {"tput raw", "tput node", "tput raw curve", "tput node curve"}) {
    std::printf("%-28s %12.0f %12.0f\n", k, median(r[k]), *std::max_element(r[k].begin(), r[k].end()));
  }
  auto s = node.stats();
  std::printf("node stats: sent %llu, received %llu, queue-full retries %llu\n",
              static_cast<unsigned long long>(s.frames_sent),
              static_cast<unsigned long long>(s.frames_received),
              static_cast<unsigned long long>(s.send_queue_full));
  raw.quit();
  raw_pair.quit();
  raw_curve.quit();
  node.quit();
  node_curve.quit();
  for (pid_t p : {c_raw.pid, c_raw_pair.pid, c_raw_curve.pid, c_node.pid, c_node_curve.pid}) {
    ::waitpid(p, nullptr, 0);
  }
  return 0;
}
