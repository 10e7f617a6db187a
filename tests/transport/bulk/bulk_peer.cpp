// tessera_bulk_peer: the other process of the conformance suite's two-process tests.
//
//   tessera_bulk_peer <tcp|shm|rdma> <echo|idle>
//
// Reads the test's connect params (hex msgpack, one line) from stdin, prints its own on stdout,
// connects. echo: announces a 4 MiB registered buffer, answers every write_received with
// {imm, bytes, checksum of the bytes}, exits 0 after "bye". idle: sends one hello and waits to be
// killed. Exit codes: 2 usage/set-up, 3 link went down unexpectedly, 4 nothing happened for 60 s.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "tests/transport/bulk/support.hpp"

using namespace tessera::transport::bulk;
namespace bulk = tessera::transport::bulk;

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "tessera_bulk_peer: %s\n", what.c_str());
  return 2;
}

int echo(bulk::link& l) {
  auto buf = allocate_buffer(4 << 20);
  if (!buf) return fail(buf.error().describe());
  auto h = l.register_buffer(*buf);
  if (!h) return fail(h.error().describe());
  auto d = l.describe(*h);
  if (!d) return fail(d.error().describe());
  if (!l.send(peer_protocol::pack(*d), 0)) return fail("announce failed");
  completion c[4];
  for (;;) {
    auto n = l.wait(c, std::chrono::seconds(60));
    if (!n) return 3;
    if (*n == 0) return 4;
    for (std::size_t i = 0; i < *n; ++i) {
      if (c[i].kind == completion_kind::link_down) return 3;
      if (c[i].kind == completion_kind::send_received && c[i].data == peer_protocol::bye()) {
        l.close();
        return 0;
      }
      if (c[i].kind == completion_kind::write_received) {
        peer_protocol::answer a{c[i].imm, c[i].bytes,
                                peer_protocol::checksum(buf->span().first(c[i].bytes))};
        if (!l.send(peer_protocol::pack(a), 1)) return 3;
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return fail("usage: tessera_bulk_peer <tcp|shm|rdma> <echo|idle>");
  auto kind = parse_backend(argv[1]);
  if (!kind) return fail(kind.error().describe());
  const std::string mode = argv[2];
  auto s = prepare_link(*kind, testing::default_options(*kind));
  if (!s) return fail(s.error().describe());
  std::string theirs;
  if (!std::getline(std::cin, theirs)) return fail("no params on stdin");
  std::cout << testing::to_hex(encode((*s)->local_params())) << std::endl;
  auto params = decode_connect_params(testing::from_hex(theirs));
  if (!params) return fail(params.error().describe());
  auto l = (*s)->connect(*params);
  if (!l) return fail(l.error().describe());
  if (mode == "echo") return echo(**l);
  if (mode == "idle") {
    std::vector<std::byte> hello(5, std::byte{'h'});
    if (!(*l)->send(hello, 0)) return 3;
    completion c[4];
    for (;;) {
      auto n = (*l)->wait(c, std::chrono::seconds(60));
      if (!n || *n == 0) return 4;
    }
  }
  return fail("unknown mode " + mode);
}
