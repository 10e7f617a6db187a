// The rdma bulk backend against perftest, run inside the Soft-RoCE VM by bench/transport/rdma/run.
//
//   tessera_bench_rdma bw        SIZE ITERS [DEPTH]  one-way write_with_imm bandwidth, MiB/s
//                                                   (the receiver busy-polls its completions)
//   tessera_bench_rdma bw-events SIZE ITERS [DEPTH]  the same; the receiver sleeps in wait()
//   tessera_bench_rdma lat       SIZE ITERS          write_with_imm ping-pong; half round trip, us
//
// Why two receivers: perftest's receiving side (ib_send_bw's server, the perftest tool whose
// receiver sees each message) busy-polls its CQ by default and sleeps on completion events only
// with -e. `bw` is that default; `bw-events` is the -e flavour, and shows what a link's wait()
// costs per message. ib_write_bw's receiver sees nothing at all (plain RDMA WRITEs).
//
// Two processes like ib_write_bw / ib_write_lat: the benchmark forks before touching verbs; the
// two ends exchange connect_params over pipes (as the control plane would) and connect over rxe0.
// Prints one line: "<mode> size=<bytes> iters=<n> value=<number> unit=<unit>".
// RDMA_BENCH_SPIN_US overrides link_options::spin_us (how long wait() spins before blocking).
#include <sys/wait.h>
#include <x86intrin.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "transport/bulk/link.hpp"

namespace bulk = tessera::transport::bulk;
using clock_type = std::chrono::steady_clock;

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "tessera_bench_rdma: %s\n", what.c_str());
  std::exit(1);
}

void write_all(int fd, const void* data, std::size_t n) {
  if (::write(fd, data, n) != static_cast<ssize_t>(n)) fail("pipe write");
}
void read_all(int fd, void* data, std::size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::read(fd, p, n);
    if (r <= 0) fail("pipe read (peer gone)");
    p += r;
    n -= static_cast<std::size_t>(r);
  }
}

void send_blob(int fd, const std::vector<std::byte>& blob) {
  std::uint32_t n = static_cast<std::uint32_t>(blob.size());
  write_all(fd, &n, 4);
  write_all(fd, blob.data(), n);
}
std::vector<std::byte> recv_blob(int fd) {
  std::uint32_t n = 0;
  read_all(fd, &n, 4);
  if (n > 4096) fail("oversized blob");
  std::vector<std::byte> b(n);
  read_all(fd, b.data(), n);
  return b;
}

struct end {
  std::unique_ptr<bulk::link> link;
  bulk::shared_buffer buffer;
  bulk::buffer_handle handle;
  bulk::remote_buffer peer;
};

// Connects this process's end; `in`/`out` are the pipe to the other process.
end open_end(int in, int out, std::size_t bytes, std::uint32_t depth) {
  bulk::link_options o;
  o.limits.max_outstanding = depth;
  o.limits.max_received = std::max<std::uint32_t>(depth, 64);
  if (const char* spin = std::getenv("RDMA_BENCH_SPIN_US")) o.spin_us = static_cast<std::uint32_t>(std::atoi(spin));
  o.connect_timeout_ms = std::chrono::milliseconds(60'000);
  auto setup = bulk::prepare_link(bulk::backend_kind::rdma, o);
  if (!setup) fail(setup.error().describe());
  send_blob(out, bulk::encode((*setup)->local_params()));
  auto remote = bulk::decode_connect_params(recv_blob(in));
  if (!remote) fail(remote.error().describe());
  auto l = (*setup)->connect(*remote);
  if (!l) fail(l.error().describe());
  end e;
  e.link = std::move(*l);
  auto buf = bulk::allocate_buffer(std::max<std::size_t>(bytes, 1));
  if (!buf) fail(buf.error().describe());
  e.buffer = std::move(*buf);
  auto h = e.link->register_buffer(e.buffer);
  if (!h) fail(h.error().describe());
  e.handle = *h;
  auto desc = e.link->describe(*h);
  if (!desc) fail(desc.error().describe());
  write_all(out, &*desc, sizeof(bulk::remote_buffer));
  read_all(in, &e.peer, sizeof(bulk::remote_buffer));
  return e;
}

bulk::completion next(bulk::link& l) {
  bulk::completion c;
  for (;;) {
    if (l.poll(std::span(&c, 1)) == 1) break;
  }
  if (!c.ok()) fail(c.failure->describe());
  return c;
}

void sync_pipes(int in, int out) {
  char b = 'x';
  write_all(out, &b, 1);
  read_all(in, &b, 1);
}

// Writer posts `iters` writes keeping `depth` in flight; the receiver counts arrivals, busy-polling
// (`events` false) or sleeping in wait() (`events` true).
double run_bw(bool writer, int in, int out, std::size_t size, int iters, std::uint32_t depth,
              bool events) {
  end e = open_end(in, out, size, depth);
  sync_pipes(in, out);
  const auto start = clock_type::now();
  if (writer) {
    int posted = 0, done = 0;
    bulk::completion cs[64];
    while (done < iters) {
      while (posted < iters && posted - done < static_cast<int>(depth)) {
        auto r = e.link->write_with_imm(e.handle, 0, e.peer, 0, size, static_cast<std::uint32_t>(posted),
                                        static_cast<std::uint64_t>(posted));
        if (!r) fail(r.error().describe());
        ++posted;
      }
      std::size_t n = e.link->poll(cs);
      for (std::size_t i = 0; i < n; ++i) {
        if (!cs[i].ok()) fail(cs[i].failure->describe());
      }
      done += static_cast<int>(n);
    }
  } else {
    bulk::completion cs[64];
    for (int got = 0; got < iters;) {
      std::size_t n = 0;
      if (events) {
        // wait() spins for link_options::spin_us (RDMA_BENCH_SPIN_US), then sleeps on the
        // completion channel.
        auto w = e.link->wait(cs, std::chrono::seconds(1));
        if (!w) fail(w.error().describe());
        n = *w;
      } else {
        n = e.link->poll(cs);
      }
      for (std::size_t i = 0; i < n; ++i) {
        if (!cs[i].ok()) fail(cs[i].failure->describe());
      }
      got += static_cast<int>(n);
    }
  }
  const double s = std::chrono::duration<double>(clock_type::now() - start).count();
  sync_pipes(in, out);
  return static_cast<double>(size) * iters / s / (1024.0 * 1024.0);
}

// Ping-pong: the initiator writes, the responder answers each arrival with a write back.
double run_lat(bool initiator, int in, int out, std::size_t size, int iters) {
  end e = open_end(in, out, size, 4);
  sync_pipes(in, out);
  // Per-iteration times from the TSC (as perftest's get_cycles), scaled by the whole run's
  // steady_clock time: in the VM the clock is an emulated HPET whose reads cost microseconds.
  std::vector<std::uint64_t> cycles;
  cycles.reserve(static_cast<std::size_t>(iters));
  const auto wall0 = clock_type::now();
  const std::uint64_t tsc0 = __rdtsc();
  for (int i = 0; i < iters; ++i) {
    const std::uint64_t t0 = __rdtsc();
    if (initiator) {
      if (!e.link->write_with_imm(e.handle, 0, e.peer, 0, size, 1, 1)) fail("post");
      for (bool got = false, done = false; !(got && done);) {
        bulk::completion c = next(*e.link);
        got |= c.kind == bulk::completion_kind::write_received;
        done |= c.kind == bulk::completion_kind::write_done;
      }
      cycles.push_back(__rdtsc() - t0);
    } else {
      for (;;) {
        bulk::completion c = next(*e.link);
        if (c.kind == bulk::completion_kind::write_received) break;
      }
      if (!e.link->write_with_imm(e.handle, 0, e.peer, 0, size, 2, 2)) fail("post");
      while (next(*e.link).kind != bulk::completion_kind::write_done) {
      }
    }
  }
  const double us_per_cycle =
      std::chrono::duration<double, std::micro>(clock_type::now() - wall0).count() /
      static_cast<double>(__rdtsc() - tsc0);
  sync_pipes(in, out);
  if (!initiator) return 0;
  std::sort(cycles.begin(), cycles.end());
  // Median half round trip, as perftest's t_typical.
  return static_cast<double>(cycles[cycles.size() / 2]) * us_per_cycle / 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s bw|bw-events|lat SIZE ITERS [DEPTH]\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const std::size_t size = std::strtoull(argv[2], nullptr, 10);
  const int iters = std::atoi(argv[3]);
  const std::uint32_t depth = argc > 4 ? static_cast<std::uint32_t>(std::atoi(argv[4])) : 64;
  const bool bw = mode == "bw" || mode == "bw-events";
  if ((!bw && mode != "lat") || iters <= 0 || depth == 0 || depth > 1024) {
    std::fprintf(stderr, "bad arguments (mode bw|bw-events|lat, ITERS > 0, 0 < DEPTH <= 1024)\n");
    return 2;
  }
  int down[2], up[2];
  if (::pipe(down) != 0 || ::pipe(up) != 0) fail("pipe");
  // Fork before any verbs call: the child opens its own device context.
  const pid_t pid = ::fork();
  if (pid < 0) fail("fork");
  const bool parent = pid != 0;
  const int in = parent ? up[0] : down[0];
  const int out = parent ? down[1] : up[1];
  const double value = bw ? run_bw(parent, in, out, size, iters, depth, mode == "bw-events")
                          : run_lat(parent, in, out, size, iters);
  if (!parent) return 0;
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) fail("peer process failed");
  std::printf("%s size=%zu iters=%d value=%.2f unit=%s\n", mode.c_str(), size, iters, value,
              bw ? "MiB/s" : "us");
  return 0;
}
