// The rdma backend against real verbs: runs inside the Soft-RoCE VM (scripts/rdma-vm; ctest label
// rdma-vm). One-process tests connect two QPs over rxe0 from two threads; two-process tests exec
// this binary again as the peer (TESSERA_RDMA_CHILD=<mode>) and exchange params over pipes, as the
// control plane would. Waits are bounded by `vm_patience` and never assert on time.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "transport/bulk/link.hpp"
#include "transport/bulk/rdma.hpp"

namespace tessera::transport::bulk {
namespace {

using namespace std::chrono_literals;
constexpr auto vm_patience = 60s;  // qemu TCG on a loaded 2-core host

link_options vm_options() {
  link_options o;
  o.connect_timeout_ms = 30'000ms;
  o.peer_timeout_ms = 2'000ms;
  return o;
}

struct pair {
  std::unique_ptr<link> a;
  std::unique_ptr<link> b;
};

pair connect_pair(const link_options& ao, const link_options& bo) {
  auto sa = prepare_link(backend_kind::rdma, ao);
  auto sb = prepare_link(backend_kind::rdma, bo);
  EXPECT_TRUE(sa) << sa.error().describe();
  EXPECT_TRUE(sb) << sb.error().describe();
  if (!sa || !sb) return {};
  const connect_params pa = (*sa)->local_params();
  const connect_params pb = (*sb)->local_params();
  auto fb = std::async(std::launch::async, [&] { return (*sb)->connect(pa); });
  auto la = (*sa)->connect(pb);
  auto lb = fb.get();
  EXPECT_TRUE(la) << la.error().describe();
  EXPECT_TRUE(lb) << lb.error().describe();
  if (!la || !lb) return {};
  return {std::move(*la), std::move(*lb)};
}

completion next(link& l) {
  completion c;
  const auto deadline = std::chrono::steady_clock::now() + vm_patience;
  while (std::chrono::steady_clock::now() < deadline) {
    auto n = l.wait(std::span(&c, 1), 100ms);
    if (!n) {
      ADD_FAILURE() << "wait: " << n.error().describe();
      return c;
    }
    if (*n == 1) return c;
  }
  ADD_FAILURE() << "no completion within " << vm_patience.count() << " s";
  return c;
}

completion next_of(link& l, completion_kind kind) {
  for (int i = 0; i < 10'000; ++i) {
    completion c = next(l);
    if (c.kind == kind || c.kind == completion_kind::link_down) return c;
  }
  ADD_FAILURE() << "no " << to_string(kind);
  return {};
}

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
  return v;
}

TEST(rdma_vm, discovers_rxe_with_an_ipv4_mapped_roce_v2_gid) {
  auto devices = rdma::list_devices();
  ASSERT_TRUE(devices) << devices.error().describe();
  ASSERT_FALSE(devices->empty()) << "no RDMA device: is this running inside scripts/rdma-vm?";
  const auto& port = devices->front().ports.at(0);
  EXPECT_TRUE(port.active);
  EXPECT_TRUE(port.ethernet);
  auto index = rdma::pick_gid(port.gids, port.ethernet);
  ASSERT_TRUE(index) << index.error().describe();
  auto setup = prepare_link(backend_kind::rdma, vm_options());
  ASSERT_TRUE(setup) << setup.error().describe();
  const connect_params& p = (*setup)->local_params();
  EXPECT_EQ(rdma::format_gid(p.gid), "::ffff:10.0.2.15");
  EXPECT_NE(p.qpn, 0u);
  EXPECT_EQ(p.backend, static_cast<std::uint8_t>(backend_kind::rdma));
  EXPECT_TRUE(probe_capabilities().has_rdma);
}

// What a node puts in its capabilities (and `tessera status` shows): the rxe port with the
// IPv4-mapped RoCE v2 GID its links use.
TEST(rdma_vm, ports_are_described_with_the_gid_links_use) {
  const auto ports = describe_rdma_ports();
  ASSERT_FALSE(ports.empty());
  bool found = false;
  for (const auto& p : ports)
    if (p.find("/1 ::ffff:") != std::string::npos && p.find("(RoCE v2, GID index ") != std::string::npos)
      found = true;
  EXPECT_TRUE(found) << ports.front();
}

TEST(rdma_vm, malformed_or_foreign_params_are_refused) {
  auto setup = prepare_link(backend_kind::rdma, vm_options());
  ASSERT_TRUE(setup);
  connect_params bad = (*setup)->local_params();
  bad.backend = static_cast<std::uint8_t>(backend_kind::tcp);
  auto r = (*setup)->connect(bad);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::invalid_argument) << r.error().describe();

  auto setup2 = prepare_link(backend_kind::rdma, vm_options());
  ASSERT_TRUE(setup2);
  bad = (*setup2)->local_params();
  bad.gid.resize(4);
  r = (*setup2)->connect(bad);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::invalid_argument) << r.error().describe();
}

TEST(rdma_vm, a_peer_that_never_connects_times_out) {
  link_options o = vm_options();
  o.connect_timeout_ms = 1500ms;
  o.peer_timeout_ms = 500ms;  // each hello try gives up after ~0.5 s; the QP resets and retries
  auto a = prepare_link(backend_kind::rdma, o);
  auto b = prepare_link(backend_kind::rdma, o);  // exists (QP in INIT) but never connects
  ASSERT_TRUE(a && b);
  auto r = (*a)->connect((*b)->local_params());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::timeout) << r.error().describe();
}

TEST(rdma_vm, a_peer_with_another_nonce_is_unauthorized) {
  link_options o = vm_options();
  // B's own handshake cannot finish either (A drops out on the bad nonce): keep its wait short.
  o.connect_timeout_ms = 3000ms;
  auto sa = prepare_link(backend_kind::rdma, o);
  auto sb = prepare_link(backend_kind::rdma, o);
  ASSERT_TRUE(sa && sb);
  connect_params pb = (*sb)->local_params();
  pb.nonce ^= 1;  // what a process that never saw B's params would have to guess
  const connect_params pa = (*sa)->local_params();
  auto fb = std::async(std::launch::async, [&] { return (*sb)->connect(pa); });
  auto ra = (*sa)->connect(pb);
  ASSERT_FALSE(ra);
  EXPECT_EQ(ra.error().code, errc::unauthorized) << ra.error().describe();
  (void)fb.get();
}

TEST(rdma_vm, write_with_imm_lands_before_its_completion) {
  auto [a, b] = connect_pair(vm_options(), vm_options());
  ASSERT_TRUE(a && b);
  auto src = pattern(100'000, 1);
  std::vector<std::byte> dst(200'000);
  auto hs = a->register_buffer(src.data(), src.size());
  auto hd = b->register_buffer(dst.data(), dst.size());
  ASSERT_TRUE(hs && hd);
  auto rd = b->describe(*hd);
  ASSERT_TRUE(rd);
  ASSERT_TRUE(a->write_with_imm(*hs, 0, *rd, 4096, src.size(), 0xdeadbeef, 77));
  completion got = next(*b);
  ASSERT_EQ(got.kind, completion_kind::write_received) << to_string(got.kind);
  EXPECT_TRUE(got.ok());
  EXPECT_EQ(got.imm, 0xdeadbeefu);
  EXPECT_EQ(got.bytes, src.size());
  EXPECT_EQ(0, std::memcmp(dst.data() + 4096, src.data(), src.size()));
  completion done = next(*a);
  EXPECT_EQ(done.kind, completion_kind::write_done);
  EXPECT_EQ(done.wr_id, 77u);
  EXPECT_TRUE(done.ok());
}

TEST(rdma_vm, writes_beyond_the_device_message_limit_are_chunked) {
  auto [a, b] = connect_pair(vm_options(), vm_options());
  ASSERT_TRUE(a && b);
  const std::size_t n = 20u << 20;  // rxe: 8 MiB per message, so 3 chunks and a notice
  auto src_buf = allocate_buffer(n);
  auto dst_buf = allocate_buffer(n);
  ASSERT_TRUE(src_buf && dst_buf);
  auto p = pattern(n, 2);
  std::memcpy(src_buf->data(), p.data(), n);
  auto hs = a->register_buffer(*src_buf);
  auto hd = b->register_buffer(*dst_buf);
  ASSERT_TRUE(hs && hd);
  ASSERT_TRUE(a->write_with_imm(*hs, 0, *b->describe(*hd), 0, n, 42, 1));
  // A zero-byte write right behind it only carries its immediate, and arrives second.
  ASSERT_TRUE(a->write_with_imm(*hs, 0, *b->describe(*hd), 0, 0, 43, 2));
  completion first = next(*b);
  ASSERT_EQ(first.kind, completion_kind::write_received);
  EXPECT_EQ(first.imm, 42u);
  EXPECT_EQ(first.bytes, n);
  EXPECT_EQ(0, std::memcmp(dst_buf->data(), p.data(), n));
  completion second = next(*b);
  ASSERT_EQ(second.kind, completion_kind::write_received);
  EXPECT_EQ(second.imm, 43u);
  EXPECT_EQ(second.bytes, 0u);
  EXPECT_EQ(next(*a).wr_id, 1u);
  EXPECT_EQ(next(*a).wr_id, 2u);
}

TEST(rdma_vm, sends_and_writes_arrive_in_posting_order) {
  link_options o = vm_options();
  auto [a, b] = connect_pair(o, o);
  ASSERT_TRUE(a && b);
  std::vector<std::byte> src(64 * 1024), dst(64 * 1024);
  auto hs = a->register_buffer(src.data(), src.size());
  auto hd = b->register_buffer(dst.data(), dst.size());
  ASSERT_TRUE(hs && hd);
  const remote_buffer rd = *b->describe(*hd);
  constexpr int ops = 200;
  int posted = 0, received = 0, done = 0;
  while (received < ops) {
    while (posted < ops) {
      std::string msg = "message " + std::to_string(posted);
      auto r = posted % 3 == 0
                   ? a->write_with_imm(*hs, 0, rd, 0, 1000, static_cast<std::uint32_t>(posted), posted)
                   : a->send(std::as_bytes(std::span(msg)), posted);
      if (!r && r.error().code == errc::overloaded) break;  // bounded: poll, then post more
      ASSERT_TRUE(r) << r.error().describe();
      ++posted;
    }
    completion cs[16];
    done += static_cast<int>(a->poll(cs));
    auto w = b->wait(cs, 10ms);
    ASSERT_TRUE(w) << w.error().describe();
    const std::size_t n = *w;
    for (std::size_t i = 0; i < n; ++i, ++received) {
      ASSERT_TRUE(cs[i].ok());
      if (received % 3 == 0) {
        ASSERT_EQ(cs[i].kind, completion_kind::write_received);
        EXPECT_EQ(cs[i].imm, static_cast<std::uint32_t>(received));
      } else {
        ASSERT_EQ(cs[i].kind, completion_kind::send_received);
        std::string text(reinterpret_cast<const char*>(cs[i].data.data()), cs[i].data.size());
        EXPECT_EQ(text, "message " + std::to_string(received));
      }
    }
  }
  while (done < ops) done += next(*a).kind == completion_kind::link_down ? ops : 1;
  EXPECT_EQ(done, ops);
}

TEST(rdma_vm, bounds_refuse_before_anything_moves) {
  link_options o = vm_options();
  o.limits.max_outstanding = 4;
  o.limits.max_buffers = 2;
  o.limits.max_send_bytes = 1024;
  auto [a, b] = connect_pair(o, o);
  ASSERT_TRUE(a && b);
  std::vector<std::byte> src(4096), dst(4096);
  auto hs = a->register_buffer(src.data(), src.size());
  auto hd = b->register_buffer(dst.data(), dst.size());
  ASSERT_TRUE(hs && hd);
  const remote_buffer rd = *b->describe(*hd);
  auto r = a->write_with_imm(*hs, 1, rd, 0, 4096, 0, 0);  // local range past the end
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::invalid_argument);
  r = a->write_with_imm(*hs, 0, rd, 4000, 100, 0, 0);  // remote range past the end
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::invalid_argument);
  r = a->write_with_imm(buffer_handle{999}, 0, rd, 0, 1, 0, 0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::invalid_argument);
  std::vector<std::byte> big(1025);
  r = a->send(big, 0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::invalid_argument);
  // max_buffers: a sub-range reuses the region (same rkey) but still takes a handle slot.
  auto sub = a->register_buffer(src.data() + 100, 100);
  ASSERT_TRUE(sub);
  auto third = a->register_buffer(dst.data(), 10);
  ASSERT_FALSE(third);
  EXPECT_EQ(third.error().code, errc::no_capacity);
  EXPECT_EQ(a->describe(*sub)->rkey, a->describe(*hs)->rkey);
  EXPECT_EQ(a->describe(*sub)->addr, a->describe(*hs)->addr + 100);
  ASSERT_TRUE(a->deregister_buffer(*sub));
  EXPECT_FALSE(a->deregister_buffer(*sub));
  // max_outstanding: the fifth unpolled op is refused, nothing of it sent.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(a->send(std::span(big.data(), 8), i));
  r = a->send(std::span(big.data(), 8), 4);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::overloaded);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(next_of(*a, completion_kind::send_done).wr_id, unsigned(i));
  ASSERT_TRUE(a->send(std::span(big.data(), 8), 5));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(next(*b).kind, completion_kind::send_received);
}

TEST(rdma_vm, a_slow_receiver_applies_backpressure_without_loss) {
  link_options small = vm_options();
  small.limits.max_received = 4;  // 4 receives posted, 4 completions queued at most
  auto [a, b] = connect_pair(vm_options(), small);
  ASSERT_TRUE(a && b);
  constexpr int msgs = 40;
  int posted = 0, done = 0;
  while (posted < msgs) {  // the receiver does not poll yet: RNR NAKs make the sender retry
    std::uint32_t v = static_cast<std::uint32_t>(posted);
    auto r = a->send(std::as_bytes(std::span(&v, 1)), posted);
    if (!r) {
      ASSERT_EQ(r.error().code, errc::overloaded);
      ASSERT_EQ(next(*a).kind, completion_kind::send_done);
      ++done;
      continue;
    }
    ++posted;
  }
  for (int i = 0; i < msgs; ++i) {
    completion c = next(*b);
    ASSERT_EQ(c.kind, completion_kind::send_received);
    std::uint32_t v = 0;
    std::memcpy(&v, c.data.data(), 4);
    EXPECT_EQ(v, static_cast<std::uint32_t>(i));
  }
  while (done < msgs) {
    ASSERT_EQ(next(*a).kind, completion_kind::send_done);
    ++done;
  }
}

TEST(rdma_vm, writing_into_a_deregistered_buffer_takes_the_link_down) {
  link_options o = vm_options();
  o.peer_timeout_ms = 1000ms;
  auto [a, b] = connect_pair(o, o);
  ASSERT_TRUE(a && b);
  std::vector<std::byte> src(4096), dst(4096);
  auto hs = a->register_buffer(src.data(), src.size());
  auto hd = b->register_buffer(dst.data(), dst.size());
  ASSERT_TRUE(hs && hd);
  const remote_buffer stale = *b->describe(*hd);
  ASSERT_TRUE(b->deregister_buffer(*hd));
  ASSERT_TRUE(a->write_with_imm(*hs, 0, stale, 0, 4096, 1, 9));
  completion failed = next(*a);
  EXPECT_EQ(failed.kind, completion_kind::write_done);
  EXPECT_EQ(failed.wr_id, 9u);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.failure->code, errc::protocol) << failed.failure->describe();
  completion down = next(*a);
  ASSERT_EQ(down.kind, completion_kind::link_down);
  EXPECT_FALSE(a->is_up());
  auto r = a->send(std::span(src.data(), 1), 0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::closed);
  EXPECT_NE(r.error().message.find("remote access"), std::string::npos) << r.error().message;
  completion c;
  auto w = a->wait(std::span(&c, 1), 10ms);
  ASSERT_FALSE(w);
  EXPECT_EQ(w.error().code, errc::closed);
  // The receiving side learns too (its QP saw the violation, or its keepalive goes unanswered).
  EXPECT_EQ(next_of(*b, completion_kind::link_down).kind, completion_kind::link_down);
}

TEST(rdma_vm, close_reaches_the_peer_and_fails_pending_work) {
  auto [a, b] = connect_pair(vm_options(), vm_options());
  ASSERT_TRUE(a && b);
  a->close();
  a->close();  // idempotent
  completion local_down = next_of(*a, completion_kind::link_down);
  ASSERT_EQ(local_down.kind, completion_kind::link_down);
  completion down = next_of(*b, completion_kind::link_down);
  ASSERT_EQ(down.kind, completion_kind::link_down);
  ASSERT_FALSE(down.ok());
  EXPECT_EQ(down.failure->code, errc::closed) << down.failure->describe();
  auto r = b->send({}, 0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::closed);
}

// ---- two processes -------------------------------------------------------------------------

std::string hex(const std::vector<std::byte>& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (auto b : bytes) {
    s += digits[std::to_integer<int>(b) >> 4];
    s += digits[std::to_integer<int>(b) & 15];
  }
  return s;
}

std::vector<std::byte> unhex(const std::string& s) {
  std::vector<std::byte> out;
  for (std::size_t i = 0; i + 1 < s.size(); i += 2) {
    out.push_back(static_cast<std::byte>(std::stoi(s.substr(i, 2), nullptr, 16)));
  }
  return out;
}

bool write_line(int fd, const std::string& line) {
  std::string s = line + "\n";
  return ::write(fd, s.data(), s.size()) == static_cast<ssize_t>(s.size());
}

// Reads one line, waiting at most `vm_patience`; "" on EOF or timeout.
std::string read_line(int fd) {
  std::string s;
  const auto deadline = std::chrono::steady_clock::now() + vm_patience;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char ch = 0;
    if (::read(fd, &ch, 1) != 1) return "";
    if (ch == '\n') return s;
    s += ch;
  }
  return "";
}

std::string describe_line(const remote_buffer& r) {
  std::ostringstream os;
  os << r.id << ' ' << r.addr << ' ' << r.rkey << ' ' << r.size;
  return os.str();
}

remote_buffer parse_remote(const std::string& line) {
  remote_buffer r;
  std::istringstream is(line);
  is >> r.id >> r.addr >> r.rkey >> r.size;
  return r;
}

constexpr std::size_t child_write_bytes = 4u << 20;

// The peer process: fd 3 reads from the parent, fd 4 writes to it.
int child_main(const std::string& mode) {
  auto setup = prepare_link(backend_kind::rdma, vm_options());
  if (!setup) return 10;
  write_line(4, hex(encode((*setup)->local_params())));
  auto parent = decode_connect_params(unhex(read_line(3)));
  if (!parent) return 11;
  auto l = (*setup)->connect(*parent);
  if (!l) return 12;
  if (mode == "idle") {
    write_line(4, "ready");
    (void)read_line(3);  // the parent kills us while we sit here
    return 0;
  }
  // mode "writer": write a pattern into the parent's buffer, then say so with a send.
  const remote_buffer target = parse_remote(read_line(3));
  auto buf = allocate_buffer(child_write_bytes);
  if (!buf) return 13;
  auto p = pattern(child_write_bytes, 7);
  std::memcpy(buf->data(), p.data(), p.size());
  auto h = (*l)->register_buffer(*buf);
  if (!h) return 14;
  if (!(*l)->write_with_imm(*h, 0, target, 0, child_write_bytes, 0xc0ffee, 1)) return 15;
  const std::string text = "written";
  if (!(*l)->send(std::as_bytes(std::span(text)), 2)) return 16;
  for (int done = 0; done < 2;) {
    completion c;
    auto n = (*l)->wait(std::span(&c, 1), 1s);
    if (!n) return 17;
    if (*n == 1 && !c.ok()) return 18;
    if (*n == 1) ++done;
  }
  (void)read_line(3);  // the parent's "close" line
  (*l)->close();
  return 0;
}

struct child {
  pid_t pid = -1;
  int to = -1;    // parent -> child
  int from = -1;  // child -> parent
};

child spawn(const std::string& mode) {
  int down[2], up[2];
  if (::pipe(down) != 0 || ::pipe(up) != 0) return {};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(down[0], 3);
    ::dup2(up[1], 4);
    ::setenv("TESSERA_RDMA_CHILD", mode.c_str(), 1);
    ::execl("/proc/self/exe", "rdma_vm_peer", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(down[0]);
  ::close(up[1]);
  return {pid, down[1], up[0]};
}

int reap(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::unique_ptr<link> connect_to_child(child& c, const link_options& o) {
  auto setup = prepare_link(backend_kind::rdma, o);
  EXPECT_TRUE(setup) << setup.error().describe();
  if (!setup) return nullptr;
  write_line(c.to, hex(encode((*setup)->local_params())));
  auto theirs = decode_connect_params(unhex(read_line(c.from)));
  EXPECT_TRUE(theirs) << theirs.error().describe();
  if (!theirs) return nullptr;
  auto l = (*setup)->connect(*theirs);
  EXPECT_TRUE(l) << l.error().describe();
  return l ? std::move(*l) : nullptr;
}

/// An "idle" child (it posts its receives, says "ready" and never polls) linked with a 1 s
/// peer timeout; null after a failed expectation.
std::unique_ptr<link> connect_idle_child(child& c) {
  EXPECT_GT(c.pid, 0);
  if (c.pid <= 0) return nullptr;
  link_options o = vm_options();
  o.peer_timeout_ms = 1000ms;  // keepalive probe every 250 ms, ~1 s of retries
  auto l = connect_to_child(c, o);
  if (!l) return nullptr;
  EXPECT_EQ(read_line(c.from), "ready");
  return l;
}

TEST(rdma_vm_two_process, a_peer_process_writes_and_sends_over_rxe) {
  child c = spawn("writer");
  ASSERT_GT(c.pid, 0);
  auto l = connect_to_child(c, vm_options());
  ASSERT_TRUE(l);
  auto buf = allocate_buffer(child_write_bytes);
  ASSERT_TRUE(buf);
  auto h = l->register_buffer(*buf);
  ASSERT_TRUE(h);
  write_line(c.to, describe_line(*l->describe(*h)));
  completion w = next(*l);
  ASSERT_EQ(w.kind, completion_kind::write_received) << to_string(w.kind);
  EXPECT_EQ(w.imm, 0xc0ffeeu);
  EXPECT_EQ(w.bytes, child_write_bytes);
  auto p = pattern(child_write_bytes, 7);
  EXPECT_EQ(0, std::memcmp(buf->data(), p.data(), p.size()));
  completion s = next(*l);
  ASSERT_EQ(s.kind, completion_kind::send_received);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(s.data.data()), s.data.size()), "written");
  write_line(c.to, "close");
  completion down = next(*l);
  ASSERT_EQ(down.kind, completion_kind::link_down);
  EXPECT_EQ(down.failure->code, errc::closed) << down.failure->describe();
  EXPECT_EQ(reap(c.pid), 0);
}

TEST(rdma_vm_two_process, a_peer_killed_while_idle_is_detected_never_a_hang) {
  child c = spawn("idle");
  auto l = connect_idle_child(c);
  ASSERT_TRUE(l);
  ::kill(c.pid, SIGKILL);
  EXPECT_EQ(reap(c.pid), 128 + SIGKILL);
  // Nothing is posted: only the keepalive probe can notice.
  completion down = next(*l);
  ASSERT_EQ(down.kind, completion_kind::link_down);
  ASSERT_FALSE(down.ok());
  EXPECT_EQ(down.failure->code, errc::timeout) << down.failure->describe();
  EXPECT_FALSE(l->is_up());
}

// A peer alive but not reading (`tessera fault pause`: SIGSTOP; here also a process that never
// polls): its HCA answers every send past its posted receives with RNR NAKs, which rnr_retry 7
// retries without end, while it still acknowledges at link level. The link's own deadline ends
// it: the stuck send fails and the link goes down within peer_timeout_ms, never a hang.
TEST(rdma_vm_two_process, a_peer_that_stops_reading_fails_sends_within_the_peer_timeout) {
  child c = spawn("idle");  // posts its receives, then never polls
  auto l = connect_idle_child(c);
  ASSERT_TRUE(l);
  ASSERT_EQ(::kill(c.pid, SIGSTOP), 0);
  // More sends than the peer has receives posted (64 at most): the first ones complete, the
  // rest wait at the peer's empty receive queue.
  int ok = 0, failed = 0;
  std::optional<std::chrono::steady_clock::time_point> stuck_from;
  auto t_down = std::chrono::steady_clock::now();
  const std::string msg = "are you reading?";
  int posted = 0;
  for (;;) {
    // Post while there is room (max_outstanding), up to 100 in all.
    while (posted < 100 &&
           l->send(std::as_bytes(std::span(msg)), static_cast<std::uint64_t>(posted)))
      ++posted;
    completion got = next(*l);
    if (got.kind == completion_kind::link_down) {
      t_down = std::chrono::steady_clock::now();
      ASSERT_FALSE(got.ok());
      EXPECT_EQ(got.failure->code, errc::timeout) << got.failure->describe();
      EXPECT_NE(got.failure->message.find("does not read"), std::string::npos)
          << got.failure->describe();
      break;
    }
    ASSERT_EQ(got.kind, completion_kind::send_done);
    if (got.ok()) {
      ++ok;
      stuck_from = std::chrono::steady_clock::now();
    } else {
      ++failed;
    }
  }
  ASSERT_TRUE(stuck_from.has_value()) << "no send completed before the peer's queue ran dry";
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(t_down - *stuck_from).count();
  std::printf(
      "[rdma-vm] peer stopped reading: %d sends done, %d failed, link down %lld ms after "
      "the last completion (peer_timeout 1000 ms)\n",
      ok, failed, static_cast<long long>(ms));
  EXPECT_GT(failed, 0);
  EXPECT_LT(ms, 10'000) << "the deadline is peer_timeout_ms (1 s), plus the emulator's slowness";
  EXPECT_FALSE(l->is_up());
  ::kill(c.pid, SIGKILL);
  (void)reap(c.pid);
}

TEST(rdma_vm_two_process, an_operation_towards_a_dead_peer_fails) {
  child c = spawn("idle");
  auto l = connect_idle_child(c);
  ASSERT_TRUE(l);
  ::kill(c.pid, SIGKILL);
  reap(c.pid);
  const std::string msg = "anyone there?";
  ASSERT_TRUE(l->send(std::as_bytes(std::span(msg)), 5));
  completion failed = next(*l);
  EXPECT_EQ(failed.kind, completion_kind::send_done);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.failure->code, errc::timeout) << failed.failure->describe();
  EXPECT_EQ(next(*l).kind, completion_kind::link_down);
}

}  // namespace
}  // namespace tessera::transport::bulk

int main(int argc, char** argv) {
  if (const char* mode = std::getenv("TESSERA_RDMA_CHILD")) {
    return tessera::transport::bulk::child_main(mode);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
