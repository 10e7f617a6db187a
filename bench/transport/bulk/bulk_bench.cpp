// Bulk-plane benchmark, two processes (fork), each figure a ratio against its floor measured in
// the same run, interleaved, median of --reps repetitions:
//   * throughput 4 KiB .. 64 MiB: tcp backend vs a raw TCP socket stream (same 40-byte header per
//     message, blocking send / recv MSG_WAITALL into one buffer); shm backend vs memcpy of the
//     same size between two buffers in one process and, to tell our overhead from the machine's,
//     vs a bare hand-off ring laid out as the link's, between two pinned threads
//     (ring_floor_throughput below); and, for the gain of the fence-free post path, vs the same
//     shm link with link_options::shm_fence_free off (a fence in every post); and the shm link
//     posting lists of --post-list writes with link::post_writes() (one post per list, reaped
//     after each list) vs the same memcpy, as two trials and, paired, as blocks of lists
//     alternating with blocks of memcpys inside one trial (backend_throughput's `paired`);
//   * round trip of a 64-byte send (ping-pong): tcp and shm backends, raw TCP for reference.
// Targets (issue 3): tcp >= 0.8x raw TCP, shm >= 0.7x memcpy.
//
//   tessera_bulk_bench [--reps N] [--max-mib M | --max-kib K] [--reap-every R] [--post-list L]
//                      [--netns NS_A,NS_B --addresses ADDR_A,ADDR_B]
//
// --max-*: the largest size (default 64 MiB). --reap-every R: the writer of a throughput trial
// polls its completions after every R-th post (default 1: after each), and whenever a post is
// refused at the outstanding bound; R > 1 is a streaming writer that reaps in batches, as
// perftest's ib_write_bw does with its completion moderation.
//
// --netns: the two processes as two hosts, so that the tcp figures are over a network device
// (veth, a bridge) rather than loopback: the parent enters network namespace NS_A
// (/var/run/netns/NS_A) and every child NS_B, right after the fork, before either makes a socket.
// The tcp backend binds 0.0.0.0 and advertises the side's ADDR (numeric IPv4); the raw TCP floor
// listens on 0.0.0.0 in NS_A and its child dials ADDR_A. Only the tcp backend and raw TCP are
// measured (throughput and round trip): shm needs both processes on one host, and its floors are
// in-process. bench/transport/bulk/netns_run makes the namespaces, runs this, and removes them.
//
// Buffers are memfd shared memory (bulk::allocate_buffer), touched before timing (warm-up writes),
// so no page faults are timed.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "transport/bulk/link.hpp"

namespace bulk = tessera::transport::bulk;
using clock_type = std::chrono::steady_clock;

namespace {

int reap_every = 1;  // --reap-every
int post_list = 16;  // --post-list: writes per post_writes() in the list trial

// --netns / --addresses. Unset: both processes on loopback, as before the mode existed.
struct netns_hosts {
  std::string parent_ns, child_ns;
  std::string parent_address, child_address;
  int child_ns_fd = -1;  // opened up front, so a missing NS_B is reported before any fork
};
std::optional<netns_hosts> hosts;
bool in_child_ns = false;  // this process is a child that entered NS_B: it advertises ADDR_B

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "tessera_bulk_bench: %s\n", what.c_str());
  std::exit(1);
}

template <class T>
T must(tessera::result<T> r, const char* what) {
  if (!r) die(std::string(what) + ": " + r.error().describe());
  return std::move(*r);
}

void must_ok(tessera::result<void> r, const char* what) {
  if (!r) die(std::string(what) + ": " + r.error().describe());
}

// `ip netns add` names a namespace by a file under /var/run/netns; opening it is the lookup.
int open_netns(const std::string& name) {
  const std::string path = "/var/run/netns/" + name;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) die("network namespace '" + name + "': " + path + ": " + std::strerror(errno));
  return fd;
}

void enter_netns(int fd, const std::string& name) {
  if (::setns(fd, CLONE_NEWNET) != 0) {
    die("cannot enter network namespace '" + name + "' (setns): " + std::strerror(errno));
  }
}

// Every forked child calls this first: with --netns it moves to NS_B before it makes a socket.
void enter_child_netns() {
  if (!hosts) return;
  enter_netns(hosts->child_ns_fd, hosts->child_ns);
  in_child_ns = true;
}

struct pipe_pair {
  int to_child[2];
  int to_parent[2];
};

void write_blob(int fd, const std::vector<std::byte>& b) {
  const std::uint32_t n = static_cast<std::uint32_t>(b.size());
  if (::write(fd, &n, 4) != 4 || ::write(fd, b.data(), n) != static_cast<ssize_t>(n)) die("pipe");
}

std::vector<std::byte> read_blob(int fd) {
  std::uint32_t n = 0;
  if (::read(fd, &n, 4) != 4 || n > 4096) die("pipe read");
  std::vector<std::byte> b(n);
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, b.data() + got, n - got);
    if (r <= 0) die("pipe read");
    got += static_cast<std::size_t>(r);
  }
  return b;
}

bulk::link_options bench_options(bool fenced = false) {
  bulk::link_options o;
  o.shm_fence_free = !fenced;
  o.limits.max_outstanding = 256;
  o.limits.max_received = 64;
  o.limits.max_write_bytes = 1ull << 30;
  // Between namespaces, as a node on a host: every interface, and the address the peer can reach.
  if (hosts) {
    bulk::link_addresses{"0.0.0.0", in_child_ns ? hosts->child_address : hosts->parent_address}
        .apply_to(o);
  }
  return o;
}

// Both processes: exchange params over the pipes and connect.
std::unique_ptr<bulk::link> connect_over_pipes(bulk::backend_kind kind, int out_fd, int in_fd,
                                               bool fenced = false) {
  auto setup = must(bulk::prepare_link(kind, bench_options(fenced)), "prepare_link");
  write_blob(out_fd, bulk::encode(setup->local_params()));
  auto remote = must(bulk::decode_connect_params(read_blob(in_fd)), "decode params");
  return must(setup->connect(remote), "connect");
}

// Takes completions one at a time so none of the wanted kind is dropped with a batch.
bulk::completion wait_kind(bulk::link& l, bulk::completion_kind kind) {
  bulk::completion c[1];
  for (;;) {
    auto n = must(l.wait(c, std::chrono::seconds(30)), "wait");
    if (n == 0) die("timed out waiting for a completion");
    for (std::size_t i = 0; i < n; ++i) {
      if (c[i].kind == bulk::completion_kind::link_down) die("link down");
      if (c[i].kind == kind) return std::move(c[i]);
    }
  }
}

// Child of a throughput trial: owns the target buffer; acks after the warm-up and after the run.
[[noreturn]] void throughput_child(bulk::backend_kind kind, bool fenced, std::size_t size,
                                   int warm, int iters, int in_fd, int out_fd) {
  auto l = connect_over_pipes(kind, out_fd, in_fd, fenced);
  auto buf = must(bulk::allocate_buffer(size), "allocate");
  auto h = must(l->register_buffer(buf), "register");
  const auto d = must(l->describe(h), "describe");
  const std::vector<std::byte> desc{reinterpret_cast<const std::byte*>(&d),
                                    reinterpret_cast<const std::byte*>(&d) + sizeof d};
  must_ok(l->send(desc, 0), "send descriptor");
  for (int phase : {warm, iters}) {
    // In batches, as a receiver that streams does. Besides the writes, only the completions of
    // our own sends (the descriptor, acks) come, and the parent sends nothing until our ack: a
    // batch never takes more than this phase's writes.
    bulk::completion c[64];
    for (int i = 0; i < phase;) {
      const std::size_t room = static_cast<std::size_t>(std::min(64, phase - i));
      auto n = must(l->wait(std::span(c, room), std::chrono::seconds(30)), "wait");
      if (n == 0) die("timed out waiting for writes");
      for (std::size_t k = 0; k < n; ++k) {
        if (c[k].kind == bulk::completion_kind::write_received) {
          ++i;
        } else if (c[k].kind != bulk::completion_kind::send_done) {
          die("expected writes");
        }
      }
    }
    const std::byte ack[1] = {std::byte{1}};
    must_ok(l->send(ack, 1), "ack");
  }
  (void)wait_kind(*l, bulk::completion_kind::send_received);  // the parent's bye
  std::_Exit(0);
}

pid_t fork_child(pipe_pair& p) {
  std::fflush(stdout);
  if (::pipe(p.to_child) != 0 || ::pipe(p.to_parent) != 0) die("pipe");
  const pid_t pid = ::fork();
  if (pid < 0) die("fork");
  if (pid == 0) enter_child_netns();
  return pid;
}

void close_parent_side(pipe_pair& p, pid_t pid) {
  ::close(p.to_child[1]);
  ::close(p.to_parent[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) die("peer process failed");
}

// Writes per block of a paired trial (backend_throughput's `paired`): about 1 MiB (256 writes, 16
// lists, ~25 us at 4 KiB), and at least 16 blocks per trial. Short next to the host's clock
// changes (they last seconds), and, up to 1 MiB writes, shorter than the receiver's spin before it
// sleeps (link_options::spin_us, 50 us): with 1024 writes per block the receiver slept through
// every memcpy block, its membarrier() interrupting that block and its wake-up the next list block.
int paired_block_writes(std::size_t size, int iters) {
  const int by_bytes = static_cast<int>(std::max<std::size_t>(1, (std::size_t{1} << 20) / size));
  return std::max(1, std::min(by_bytes, iters / 16));
}

// GB/s of the bulk backend `kind` writing `size` bytes `iters` times into the other process.
// `fenced`: the shm link with link_options::shm_fence_free off (a fence in every post and poll).
// `list` > 1: the writes go out in post_writes() lists of that many, reaped after each list.
// `paired` (with `list` > 1): instead of one timed run, blocks of paired_block_writes() writes
// alternate with as many memcpys of `size` bytes between two private buffers, each block timed;
// each pair's memcpy time / list time goes into *paired, and the GB/s returned is 0. This host's
// clock moves between a fast and a slow mode from one second to the next (memcpy at 4 KiB
// 43-73 GB/s), and trials measured apart can land in different modes; a pair is measured within
// ~50 us at 4 KiB, so its ratio is our overhead, not the host's mode.
double backend_throughput(bulk::backend_kind kind, std::size_t size, int iters,
                          bool fenced = false, int list = 1,
                          std::vector<double>* paired = nullptr) {
  const int warm = 2;
  pipe_pair p{};
  const pid_t pid = fork_child(p);
  if (pid == 0) {
    ::close(p.to_child[1]);
    ::close(p.to_parent[0]);
    throughput_child(kind, fenced, size, warm, iters, p.to_child[0], p.to_parent[1]);
  }
  ::close(p.to_child[0]);
  ::close(p.to_parent[1]);
  double gbps = 0;
  {
    auto l = connect_over_pipes(kind, p.to_child[1], p.to_parent[0], fenced);
    auto src = must(bulk::allocate_buffer(size), "allocate");
    std::memset(src.data(), 0x5a, src.size());
    auto h = must(l->register_buffer(src), "register");
    auto desc = wait_kind(*l, bulk::completion_kind::send_received);
    bulk::remote_buffer remote;
    std::memcpy(&remote, desc.data.data(), sizeof remote);
    // The child's ack may arrive in any batch of completions we reap while posting.
    int acks = 0;
    auto reap = [&](std::size_t n, bulk::completion* c) {
      for (std::size_t k = 0; k < n; ++k) {
        if (c[k].kind == bulk::completion_kind::link_down) die("link down");
        acks += c[k].kind == bulk::completion_kind::send_received;
      }
    };
    // Built once; each list only renumbers its immediates, as a caller that streams into one
    // target reuses its list.
    std::vector<bulk::write_request> batch(static_cast<std::size_t>(list),
                                           bulk::write_request{h, 0, remote, 0, size, 0, 0});
    // `ack`: wait for the child's ack after the n writes (the end of a phase).
    auto run_lists = [&](int n, bool ack = true) {
      const int want = acks + 1;
      bulk::completion c[64];
      for (int i = 0; i < n; i += list) {
        const auto k = static_cast<std::size_t>(std::min(list, n - i));
        for (std::size_t j = 0; j < k; ++j) batch[j].imm = static_cast<std::uint32_t>(i + j);
        for (;;) {
          auto r = l->post_writes(std::span(batch).first(k));
          if (r) break;
          if (r.error().code != tessera::errc::overloaded) die(r.error().describe());
          reap(must(l->wait(c, std::chrono::milliseconds(1)), "wait"), c);
        }
        reap(l->poll(c), c);
      }
      while (ack && acks < want) reap(must(l->wait(c, std::chrono::seconds(30)), "wait"), c);
    };
    auto run = [&](int n) {
      if (list > 1) return run_lists(n);
      const int want = acks + 1;
      bulk::completion c[64];
      for (int i = 0; i < n; ++i) {
        for (;;) {
          auto r = l->write_with_imm(h, 0, remote, 0, size, static_cast<std::uint32_t>(i), 0);
          if (r) break;
          if (r.error().code != tessera::errc::overloaded) die(r.error().describe());
          reap(must(l->wait(c, std::chrono::milliseconds(1)), "wait"), c);
        }
        if ((i + 1) % reap_every == 0) reap(l->poll(c), c);
      }
      while (acks < want) reap(must(l->wait(c, std::chrono::seconds(30)), "wait"), c);
    };
    run(warm);
    if (paired != nullptr && list > 1) {
      auto from = must(bulk::allocate_buffer(size), "allocate");
      auto to = must(bulk::allocate_buffer(size), "allocate");
      std::memset(from.data(), 0x5a, from.size());
      std::memcpy(to.data(), from.data(), size);
      const int block = paired_block_writes(size, iters);
      for (int done = 0; done < iters; done += block) {
        const int n = std::min(block, iters - done);
        const auto l0 = clock_type::now();
        run_lists(n, done + n >= iters);  // the last block waits for the child's ack
        const auto l1 = clock_type::now();
        for (int i = 0; i < n; ++i) {
          std::memcpy(to.data(), from.data(), size);
          asm volatile("" : : "r"(to.data()) : "memory");
        }
        const auto m1 = clock_type::now();
        if (done + n < iters) paired->push_back((m1 - l1) / std::chrono::duration<double>(l1 - l0));
      }
    } else {
      const auto t0 = clock_type::now();
      run(iters);
      const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
      gbps = static_cast<double>(size) * iters / s / 1e9;
    }
    const std::byte bye[1] = {std::byte{0}};
    must_ok(l->send(bye, 2), "bye");
    bulk::completion c[8];
    (void)l->wait(c, std::chrono::seconds(5));
  }
  close_parent_side(p, pid);
  return gbps;
}

// --- raw TCP floor ------------------------------------------------------------------------------

// Listens on loopback, or with --netns on every interface (as the tcp backend binds there).
int tcp_listen(std::uint16_t& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(hosts ? INADDR_ANY : INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd, 1) != 0) die("listen");
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}

// Dials the listener: on loopback, or with --netns at ADDR_A (the listener is the parent).
int tcp_connect(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (hosts) ::inet_pton(AF_INET, hosts->parent_address.c_str(), &a.sin_addr);  // checked in main
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("connect");
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

void read_exact(int fd, void* p, std::size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::recv(fd, c, n, MSG_WAITALL);
    if (r <= 0) die("raw tcp recv");
    c += r;
    n -= static_cast<std::size_t>(r);
  }
}

void write_exact(int fd, const void* header, std::size_t hn, const void* p, std::size_t n) {
  struct iovec iov[2] = {{const_cast<void*>(header), hn}, {const_cast<void*>(p), n}};
  int cnt = n > 0 ? 2 : 1;
  struct iovec* v = iov;
  while (cnt > 0) {
    msghdr m{};
    m.msg_iov = v;
    m.msg_iovlen = static_cast<std::size_t>(cnt);
    ssize_t w = ::sendmsg(fd, &m, MSG_NOSIGNAL);
    if (w < 0) die("raw tcp send");
    while (cnt > 0 && static_cast<std::size_t>(w) >= v->iov_len) {
      w -= static_cast<ssize_t>(v->iov_len);
      ++v;
      --cnt;
    }
    if (cnt > 0) {
      v->iov_base = static_cast<char*>(v->iov_base) + w;
      v->iov_len -= static_cast<std::size_t>(w);
    }
  }
}

double raw_tcp_throughput(std::size_t size, int iters) {
  const int warm = 2;
  std::uint16_t port = 0;
  const int lfd = tcp_listen(port);
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid == 0) {
    enter_child_netns();
    const int fd = tcp_connect(port);
    auto buf = must(bulk::allocate_buffer(size), "allocate");
    for (int phase : {warm, iters}) {
      for (int i = 0; i < phase; ++i) {
        char header[40];
        read_exact(fd, header, sizeof header);
        read_exact(fd, buf.data(), size);
      }
      const char ack = 1;
      if (::send(fd, &ack, 1, 0) != 1) die("ack");
    }
    std::_Exit(0);
  }
  const int fd = ::accept(lfd, nullptr, nullptr);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  auto src = must(bulk::allocate_buffer(size), "allocate");
  std::memset(src.data(), 0x5a, src.size());
  auto run = [&](int n) {
    char header[40] = {};
    for (int i = 0; i < n; ++i) write_exact(fd, header, sizeof header, src.data(), size);
    char ack = 0;
    read_exact(fd, &ack, 1);
  };
  run(warm);
  const auto t0 = clock_type::now();
  run(iters);
  const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  ::close(fd);
  ::close(lfd);
  ::waitpid(pid, nullptr, 0);
  return static_cast<double>(size) * iters / s / 1e9;
}

double memcpy_throughput(std::size_t size, int iters) {
  auto src = must(bulk::allocate_buffer(size), "allocate");
  auto dst = must(bulk::allocate_buffer(size), "allocate");
  std::memset(src.data(), 0x5a, src.size());
  for (int i = 0; i < 2; ++i) std::memcpy(dst.data(), src.data(), size);
  const auto t0 = clock_type::now();
  for (int i = 0; i < iters; ++i) {
    std::memcpy(dst.data(), src.data(), size);
    asm volatile("" : : "r"(dst.data()) : "memory");
  }
  const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  return static_cast<double>(size) * iters / s / 1e9;
}

// --- hand-off floor ----------------------------------------------------------------------------

// Two CPUs this process may run on, if it has two.
std::optional<std::pair<int, int>> two_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return std::nullopt;
  int first = -1;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    if (first < 0) {
      first = c;
    } else {
      return std::pair{first, c};
    }
  }
  return std::nullopt;
}

void pin_this_thread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (::pthread_setaffinity_np(::pthread_self(), sizeof set, &set) != 0) die("pin thread");
}

// A bare one-copy hand-off of `size`-byte messages between two cores, with nothing of ours in it:
// two threads pinned to two CPUs and a 64-slot ring (the depth the benchmark's links have) laid
// out as the shm link's (inbox format 2): the writer copies the message into the target buffer,
// fills the slot and stores the slot's sequence number last (release); the reader spins on the
// next slot's sequence number (acquire), takes every slot that is ready, reads its immediate and
// hands the slots back through a tail index, which the writer reads only when the ring looks
// full. No locks, completions, liveness checks or sleeping; what is left between this and memcpy
// is the one cache line per message that moves to the reader's core and back. (Until 2026-11-25
// this floor published through a shared head index, two lines per message, as the link did before
// format 2; RESULTS says which floor each run had.) Pinned because unpinned, a new thread often
// starts on the writer's CPU and the figure swings 10x. 0 when the process has only one CPU.
double ring_floor_throughput(std::size_t size, int iters) {
  const auto cpus = two_cpus();
  if (!cpus) return 0;
  constexpr std::uint64_t depth = 64;
  struct alignas(64) slot {
    std::atomic<std::uint64_t> seq{0};  // index + 1 once published
    std::uint32_t kind = 0;
    std::uint32_t imm = 0;
    std::uint64_t bytes = 0;
  };
  struct alignas(64) index {
    std::atomic<std::uint64_t> value{0};
  };
  auto src = must(bulk::allocate_buffer(size), "allocate");
  auto dst = must(bulk::allocate_buffer(size), "allocate");
  std::memset(src.data(), 0x5a, src.size());
  std::memset(dst.data(), 0, dst.size());
  std::vector<slot> ring(depth);
  index tail;
  const std::uint64_t warm = 2 * depth;  // messages before the clock starts
  const std::uint64_t total = warm + static_cast<std::uint64_t>(iters);
  std::uint64_t checksum = 0;
  cpu_set_t saved;
  if (::pthread_getaffinity_np(::pthread_self(), sizeof saved, &saved) != 0) die("affinity");
  pin_this_thread(cpus->first);
  std::thread reader([&] {
    pin_this_thread(cpus->second);
    for (std::uint64_t t = 0; t < total;) {
      const std::uint64_t first = t;
      while (t < total && ring[t % depth].seq.load(std::memory_order_acquire) == t + 1) {
        checksum += ring[t % depth].imm;
        ++t;
      }
      if (t == first) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
        continue;
      }
      tail.value.store(t, std::memory_order_release);
    }
  });
  clock_type::time_point t0;
  std::uint64_t tail_seen = 0;
  for (std::uint64_t i = 0; i < total; ++i) {
    if (i == warm) t0 = clock_type::now();
    while (i - tail_seen >= depth)
      tail_seen = tail.value.load(std::memory_order_acquire);
    std::memcpy(dst.data(), src.data(), size);
    slot& s = ring[i % depth];
    s.kind = 1;
    s.imm = static_cast<std::uint32_t>(i);
    s.bytes = size;
    s.seq.store(i + 1, std::memory_order_release);
  }
  reader.join();
  const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  ::pthread_setaffinity_np(::pthread_self(), sizeof saved, &saved);
  // total < 2^32 (iters is an int of at most 65536): every immediate is i itself.
  if (checksum != total * (total - 1) / 2) die("ring floor: the reader saw wrong immediates");
  return static_cast<double>(size) * iters / s / 1e9;
}

// --- latency ------------------------------------------------------------------------------------

struct latency {
  double p50_us;
  double p99_us;
};

latency summarize(std::vector<double>& us) {
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[us.size() * 99 / 100]};
}

latency backend_rtt(bulk::backend_kind kind, int rounds) {
  pipe_pair p{};
  const pid_t pid = fork_child(p);
  const int warm = 200;
  if (pid == 0) {
    ::close(p.to_child[1]);
    ::close(p.to_parent[0]);
    auto l = connect_over_pipes(kind, p.to_parent[1], p.to_child[0]);
    bulk::completion c[8];
    for (int i = 0; i < warm + rounds;) {
      auto n = must(l->wait(c, std::chrono::seconds(30)), "wait");
      if (n == 0) die("echo timeout");
      for (std::size_t k = 0; k < n; ++k) {
        if (c[k].kind == bulk::completion_kind::send_received) {
          must_ok(l->send(c[k].data, 0), "echo");
          ++i;
        }
      }
    }
    (void)wait_kind(*l, bulk::completion_kind::send_received);
    std::_Exit(0);
  }
  ::close(p.to_child[0]);
  ::close(p.to_parent[1]);
  std::vector<double> us;
  {
    auto l = connect_over_pipes(kind, p.to_child[1], p.to_parent[0]);
    std::vector<std::byte> m(64, std::byte{7});
    for (int i = 0; i < warm + rounds; ++i) {
      const auto t0 = clock_type::now();
      must_ok(l->send(m, 0), "ping");
      (void)wait_kind(*l, bulk::completion_kind::send_received);
      if (i >= warm) {
        us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
      }
      bulk::completion c[8];
      (void)l->poll(c);
    }
    must_ok(l->send(m, 1), "bye");
    bulk::completion c[8];
    (void)l->wait(c, std::chrono::seconds(5));
  }
  close_parent_side(p, pid);
  return summarize(us);
}

latency raw_tcp_rtt(int rounds) {
  std::uint16_t port = 0;
  const int lfd = tcp_listen(port);
  const int warm = 200;
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid == 0) {
    enter_child_netns();
    const int fd = tcp_connect(port);
    char buf[64];
    for (int i = 0; i < warm + rounds; ++i) {
      read_exact(fd, buf, sizeof buf);
      if (::send(fd, buf, sizeof buf, 0) != sizeof buf) die("echo");
    }
    std::_Exit(0);
  }
  const int fd = ::accept(lfd, nullptr, nullptr);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<double> us;
  char buf[64] = {};
  for (int i = 0; i < warm + rounds; ++i) {
    const auto t0 = clock_type::now();
    if (::send(fd, buf, sizeof buf, 0) != sizeof buf) die("ping");
    read_exact(fd, buf, sizeof buf);
    if (i >= warm) {
      us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
    }
  }
  ::close(fd);
  ::close(lfd);
  ::waitpid(pid, nullptr, 0);
  return summarize(us);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double best(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

// "A,B" into its two parts, both non-empty; nullopt otherwise.
std::optional<std::pair<std::string, std::string>> split_pair(const std::string& s) {
  const auto comma = s.find(',');
  if (comma == std::string::npos || s.find(',', comma + 1) != std::string::npos) return {};
  std::pair<std::string, std::string> p{s.substr(0, comma), s.substr(comma + 1)};
  if (p.first.empty() || p.second.empty()) return {};
  return p;
}

// The --netns run: the tcp columns of the default tables, the same trials and sizes, with the
// two processes in two namespaces.
void run_between_namespaces(int reps, std::size_t max_bytes) {
  std::printf(
      "Bulk throughput between network namespaces: parent in %s (%s), child in %s (%s); "
      "two processes, median of %d interleaved repetitions (best in brackets), GB/s; the "
      "writer reaps its completions after every %d post(s)\n\n",
      hosts->parent_ns.c_str(), hosts->parent_address.c_str(), hosts->child_ns.c_str(),
      hosts->child_address.c_str(), reps, reap_every);
  std::printf(
      "shm backend, memcpy, ring floor and shm list: skipped (shm needs both processes on "
      "one host)\n\n");
  std::printf("| size | tcp backend | raw TCP | tcp/raw |\n|---|---|---|---|\n");
  for (std::size_t size = 4096; size <= max_bytes; size *= 4) {
    // As in the default run: about 256 MiB per measurement, at least 4 messages.
    const int iters = static_cast<int>(std::clamp<std::size_t>((256u << 20) / size, 4, 65536));
    std::vector<double> tcp, raw;
    for (int r = 0; r < reps; ++r) {
      tcp.push_back(backend_throughput(bulk::backend_kind::tcp, size, iters));
      raw.push_back(raw_tcp_throughput(size, iters));
    }
    const std::string label = size >= (1u << 20) ? std::to_string(size >> 20) + " MiB"
                                                 : std::to_string(size >> 10) + " KiB";
    std::printf("| %s | %.2f (%.2f) | %.2f (%.2f) | %.2fx |\n", label.c_str(), median(tcp),
                best(tcp), median(raw), best(raw), median(tcp) / median(raw));
    std::fflush(stdout);
  }
  std::printf(
      "\nRound trip of a 64-byte send between the namespaces, two processes, 2000 rounds "
      "per repetition, median of per-repetition p50 (p99 in brackets), us\n\n");
  std::printf("| tcp backend | raw TCP | tcp/raw |\n|---|---|---|\n");
  std::vector<double> t50, t99, r50, r99;
  for (int r = 0; r < reps; ++r) {
    auto t = backend_rtt(bulk::backend_kind::tcp, 2000);
    auto w = raw_tcp_rtt(2000);
    t50.push_back(t.p50_us);
    t99.push_back(t.p99_us);
    r50.push_back(w.p50_us);
    r99.push_back(w.p99_us);
  }
  std::printf("| %.1f (%.1f) | %.1f (%.1f) | %.2fx |\n", median(t50), median(t99), median(r50),
              median(r99), median(t50) / median(r50));
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 7;
  std::size_t max_bytes = std::size_t{64} << 20;
  std::string netns_arg, addresses_arg;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--reps") reps = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--max-mib")
      max_bytes = static_cast<std::size_t>(std::max(0, std::atoi(argv[i + 1]))) << 20;
    else if (a == "--max-kib")
      max_bytes = static_cast<std::size_t>(std::max(0, std::atoi(argv[i + 1]))) << 10;
    else if (a == "--reap-every")
      reap_every = std::clamp(std::atoi(argv[i + 1]), 1, 64);
    else if (a == "--post-list")
      post_list = std::clamp(std::atoi(argv[i + 1]), 2, 64);
    else if (a == "--netns")
      netns_arg = argv[i + 1];
    else if (a == "--addresses")
      addresses_arg = argv[i + 1];
    else
      die("usage: tessera_bulk_bench [--reps N] [--max-mib M | --max-kib K] [--reap-every R] "
          "[--post-list L] [--netns NS_A,NS_B --addresses ADDR_A,ADDR_B]");
  }
  if (!netns_arg.empty() || !addresses_arg.empty()) {
    const auto ns = split_pair(netns_arg);
    const auto addr = split_pair(addresses_arg);
    if (!ns || !addr) die("--netns NS_A,NS_B and --addresses ADDR_A,ADDR_B go together");
    for (const auto& a : {addr->first, addr->second}) {
      in_addr scratch{};
      if (::inet_pton(AF_INET, a.c_str(), &scratch) != 1) {
        die("--addresses: '" + a + "' is not a numeric IPv4 address");
      }
    }
    hosts = netns_hosts{ns->first, ns->second, addr->first, addr->second};
    const int parent_fd = open_netns(hosts->parent_ns);
    hosts->child_ns_fd = open_netns(hosts->child_ns);
    // Before any socket: every one this process makes (listeners, links) is in NS_A.
    enter_netns(parent_fd, hosts->parent_ns);
    ::close(parent_fd);
    run_between_namespaces(reps, max_bytes);
    return 0;
  }
  std::printf("Bulk throughput, two processes, median of %d interleaved repetitions (best in "
              "brackets), GB/s; the writer reaps its completions after every %d post(s); shm "
              "list: post_writes() of %d writes, reaped after each list; paired: median (p10) "
              "over all repetitions of memcpy time / list time, blocks of lists alternating with "
              "as many memcpys in one trial\n\n",
              reps, reap_every, post_list);
  std::printf(
      "| size | tcp backend | raw TCP | tcp/raw | shm backend | memcpy | shm/memcpy | "
      "ring floor | floor/memcpy | shm/floor | shm fenced | shm/fenced | shm list | "
      "list/memcpy | list/memcpy paired (p10) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (std::size_t size = 4096; size <= max_bytes; size *= 4) {
    // About 256 MiB per measurement (at least 4 messages): 65536 at 4 KiB, so the shortest timed
    // run lasts ~7 ms, not the 2 ms that 20000 took, which one host hiccup could halve.
    const int iters = static_cast<int>(std::clamp<std::size_t>((256u << 20) / size, 4, 65536));
    std::vector<double> tcp, raw, shm, mem, bare, fenced, listed, pairs;
    for (int r = 0; r < reps; ++r) {
      tcp.push_back(backend_throughput(bulk::backend_kind::tcp, size, iters));
      raw.push_back(raw_tcp_throughput(size, iters));
      shm.push_back(backend_throughput(bulk::backend_kind::shm, size, iters));
      mem.push_back(memcpy_throughput(size, iters));
      bare.push_back(ring_floor_throughput(size, iters));
      fenced.push_back(backend_throughput(bulk::backend_kind::shm, size, iters, true));
      listed.push_back(backend_throughput(bulk::backend_kind::shm, size, iters, false, post_list));
      (void)backend_throughput(bulk::backend_kind::shm, size, iters, false, post_list, &pairs);
    }
    std::sort(pairs.begin(), pairs.end());
    const std::string label =
        size >= (1u << 20) ? std::to_string(size >> 20) + " MiB" : std::to_string(size >> 10) + " KiB";
    std::printf(
        "| %s | %.2f (%.2f) | %.2f (%.2f) | %.2fx | %.2f (%.2f) | %.2f (%.2f) | %.2fx | %.2f "
        "(%.2f) "
        "| %.2fx | %.2fx | %.2f (%.2f) | %.2fx | %.2f (%.2f) | %.2fx | %.2fx (%.2fx) |\n",
        label.c_str(), median(tcp), best(tcp), median(raw), best(raw), median(tcp) / median(raw),
        median(shm), best(shm), median(mem), best(mem), median(shm) / median(mem), median(bare),
        best(bare), median(bare) / median(mem),
        median(bare) > 0 ? median(shm) / median(bare) : 0.0, median(fenced), best(fenced),
        median(shm) / median(fenced), median(listed), best(listed),
        median(listed) / median(mem), pairs.empty() ? 0.0 : pairs[pairs.size() / 2],
        pairs.empty() ? 0.0 : pairs[pairs.size() / 10]);
    std::fflush(stdout);
  }
  std::printf("\nRound trip of a 64-byte send, two processes, 2000 rounds per repetition, median "
              "of per-repetition p50 (p99 in brackets), us\n\n");
  std::printf("| tcp backend | raw TCP | tcp/raw | shm backend |\n|---|---|---|---|\n");
  std::vector<double> t50, t99, r50, r99, s50, s99;
  for (int r = 0; r < reps; ++r) {
    auto t = backend_rtt(bulk::backend_kind::tcp, 2000);
    auto w = raw_tcp_rtt(2000);
    auto s = backend_rtt(bulk::backend_kind::shm, 2000);
    t50.push_back(t.p50_us);
    t99.push_back(t.p99_us);
    r50.push_back(w.p50_us);
    r99.push_back(w.p99_us);
    s50.push_back(s.p50_us);
    s99.push_back(s.p99_us);
  }
  std::printf("| %.1f (%.1f) | %.1f (%.1f) | %.2fx | %.2f (%.1f) |\n", median(t50), median(t99),
              median(r50), median(r99), median(t50) / median(r50), median(s50), median(s99));
  return 0;
}
