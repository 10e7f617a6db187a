// Backend-independent parts of the bulk plane: params encoding, backend choice, shared buffers,
// and backend-specific refusals that the conformance suite cannot phrase generically.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "transport/bulk/link.hpp"

namespace {

using namespace tessera;
using namespace tessera::transport::bulk;
namespace bulk = tessera::transport::bulk;

TEST(connect_params, malformed_bytes_are_rejected_as_corrupt) {
  const std::vector<std::byte> junk = {std::byte{0xc1}, std::byte{0xff}, std::byte{0x00}};
  auto r = decode_connect_params(junk);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::corrupt) << r.error().describe();
  auto empty = decode_connect_params({});
  ASSERT_FALSE(empty);
}

TEST(connect_params, truncated_bytes_are_rejected) {
  connect_params p;
  p.backend = 1;
  p.address = "10.0.0.1";
  auto bytes = encode(p);
  for (std::size_t n = 0; n < bytes.size(); n += 3) {
    auto r = decode_connect_params(std::span(bytes).first(n));
    EXPECT_FALSE(r) << "prefix of " << n << " bytes decoded";
  }
}

TEST(connect_params, oversized_input_is_rejected_before_parsing) {
  std::vector<std::byte> big(5000, std::byte{0x90});
  auto r = decode_connect_params(big);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::corrupt);
}

TEST(connect_params, wrong_version_unknown_backend_and_bad_gid_are_rejected) {
  connect_params p;
  p.backend = 1;
  p.version = 99;
  auto v = decode_connect_params(encode(p));
  ASSERT_FALSE(v);
  EXPECT_EQ(v.error().code, errc::unsupported);
  p.version = connect_params::current_version;
  p.backend = 9;
  auto b = decode_connect_params(encode(p));
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error().code, errc::corrupt);
  p.backend = 3;
  p.gid = {1, 2, 3};
  auto g = decode_connect_params(encode(p));
  ASSERT_FALSE(g);
  EXPECT_EQ(g.error().code, errc::corrupt);
}

TEST(connect_params, round_trip_keeps_every_field) {
  connect_params p;
  p.backend = 3;
  p.host_id = "boot-id";
  p.nonce = 0x1234567890abcdefull;
  p.address = "fe80::1";
  p.port = 4711;
  p.pid = 42;
  p.shm_name = "/proc/42/fd/7";
  p.qpn = 0x11;
  p.psn = 0x22;
  p.gid = std::vector<std::uint8_t>(16, 0xab);
  p.lid = 3;
  p.mtu = 4;
  auto r = decode_connect_params(encode(p));
  ASSERT_TRUE(r) << r.error().describe();
  EXPECT_EQ(*r, p);
}

TEST(backend_choice, rdma_needs_both_ends_then_shm_needs_one_host_else_tcp) {
  local_capabilities a{"host-a", true}, b{"host-b", true}, a2{"host-a", false};
  EXPECT_EQ(choose_backend(a, b), backend_kind::rdma);
  EXPECT_EQ(choose_backend(a, b, std::nullopt, true), backend_kind::tcp);
  EXPECT_EQ(choose_backend(a, a2), backend_kind::shm);
  EXPECT_EQ(choose_backend(a2, a), backend_kind::shm);
  EXPECT_EQ(choose_backend(a2, local_capabilities{"host-b", false}), backend_kind::tcp);
  EXPECT_EQ(choose_backend(a, b, backend_kind::tcp), backend_kind::tcp);
  EXPECT_EQ(choose_backend(local_capabilities{"", false}, local_capabilities{"", false}),
            backend_kind::tcp);
}

TEST(backend_choice, names_parse_and_unknown_names_are_refused) {
  EXPECT_EQ(*parse_backend("shm"), backend_kind::shm);
  auto bad = parse_backend("infiniband");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("infiniband"), std::string::npos);
}

TEST(shared_buffer, zero_size_is_refused_and_sizes_round_to_pages) {
  auto z = allocate_buffer(0);
  ASSERT_FALSE(z);
  EXPECT_EQ(z.error().code, errc::invalid_argument);
  auto b = allocate_buffer(10);
  ASSERT_TRUE(b);
  EXPECT_GE(b->size(), 10u);
  EXPECT_EQ(b->size() % 4096, 0u);
  EXPECT_EQ(b->data()[9], std::byte{0});
  shared_buffer moved = std::move(*b);
  EXPECT_EQ(b->data(), nullptr);
  EXPECT_NE(moved.data(), nullptr);
}

TEST(prepare_link, zero_limits_are_refused) {
  link_options o;
  o.limits.max_outstanding = 0;
  auto s = prepare_link(backend_kind::tcp, o);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, errc::invalid_argument);
}

TEST(tcp_backend, a_bind_address_that_is_not_numeric_is_refused) {
  link_options o;
  o.bind_address = "localhost.example";
  auto s = prepare_link(backend_kind::tcp, o);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("localhost.example"), std::string::npos);
}

// A node binds every interface and tells the peer its advertised address (mesh/node/advertise):
// without one the peer would not know where to connect, so a wildcard bind alone is refused.
TEST(tcp_backend, a_wildcard_bind_needs_an_advertise_address) {
  link_options o;
  o.bind_address = "0.0.0.0";
  auto refused = prepare_link(backend_kind::tcp, o);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, errc::invalid_argument);
  EXPECT_NE(refused.error().message.find("advertise"), std::string::npos)
      << refused.error().message;
  o.advertise_address = "not-a-number";
  auto bad = prepare_link(backend_kind::tcp, o);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("not-a-number"), std::string::npos);
}

TEST(tcp_backend, a_link_bound_to_every_interface_is_reached_at_its_advertised_address) {
  link_options wide;
  link_addresses{"0.0.0.0", "127.0.0.1"}.apply_to(wide);
  auto a = prepare_link(backend_kind::tcp, wide);
  ASSERT_TRUE(a) << a.error().describe();
  EXPECT_EQ((*a)->local_params().address, "127.0.0.1");
  auto b = prepare_link(backend_kind::tcp, link_options{});
  ASSERT_TRUE(b) << b.error().describe();
  const auto pa = (*a)->local_params();
  const auto pb = (*b)->local_params();
  result<std::unique_ptr<bulk::link>> la = make_error(errc::internal, "not run");
  std::thread t([&] { la = (*a)->connect(pb); });
  auto lb = (*b)->connect(pa);
  t.join();
  ASSERT_TRUE(la) << la.error().describe();
  ASSERT_TRUE(lb) << lb.error().describe();
  const std::array<std::byte, 3> hello{std::byte{1}, std::byte{2}, std::byte{3}};
  ASSERT_TRUE((*la)->send(hello, 7));
  std::array<completion, 4> got{};
  bool received = false;
  for (int i = 0; i < 100 && !received; ++i) {
    auto n = (*lb)->wait(got, std::chrono::milliseconds(50));
    ASSERT_TRUE(n) << n.error().describe();
    for (std::size_t k = 0; k < *n; ++k)
      received |= got[k].kind == completion_kind::send_received && got[k].data.size() == 3;
  }
  EXPECT_TRUE(received);
}

/// A port free on 127.0.0.1 now (bound and released).
std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// listen.bulk_port: every tcp link of a process shares one listener, and the set-up hello routes
// each connection to the link it names — four pairs set up at once, while a stranger's junk
// connection arrives on the same port, each pair gets its own peer's bytes.
TEST(tcp_backend, links_on_one_bulk_port_share_its_listener_and_never_cross) {
  const std::uint16_t port = free_port();
  auto hold = reserve_bulk_port("127.0.0.1", port);
  ASSERT_TRUE(hold) << hold.error().describe();
  auto taken = reserve_bulk_port("127.0.0.1", port);  // the same process: the same listener
  ASSERT_TRUE(taken) << taken.error().describe();
  link_options o;
  link_addresses{"127.0.0.1", "", port}.apply_to(o);
  constexpr int pairs = 4;
  std::vector<std::unique_ptr<link_setup>> a, b;
  for (int i = 0; i < pairs; ++i) {
    auto x = prepare_link(backend_kind::tcp, o);
    auto y = prepare_link(backend_kind::tcp, o);
    ASSERT_TRUE(x && y);
    EXPECT_EQ((*x)->local_params().port, port);
    a.push_back(std::move(*x));
    b.push_back(std::move(*y));
  }
  // A stranger: connects and sends junk where a hello belongs.
  const int stranger = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(stranger, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  const std::array<char, 24> junk{};
  ASSERT_EQ(::send(stranger, junk.data(), junk.size(), MSG_NOSIGNAL), 24);
  std::vector<result<std::unique_ptr<bulk::link>>> la, lb;
  for (int i = 0; i < pairs; ++i) {
    la.emplace_back(make_error(errc::internal, "not run"));
    lb.emplace_back(make_error(errc::internal, "not run"));
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < pairs; ++i) {
    threads.emplace_back([&, i] { la[i] = a[i]->connect(b[i]->local_params()); });
    threads.emplace_back([&, i] { lb[i] = b[i]->connect(a[i]->local_params()); });
  }
  for (auto& t : threads)
    t.join();
  ::close(stranger);
  for (int i = 0; i < pairs; ++i) {
    ASSERT_TRUE(la[i]) << la[i].error().describe();
    ASSERT_TRUE(lb[i]) << lb[i].error().describe();
    const std::array<std::byte, 1> mark{static_cast<std::byte>(i + 1)};
    ASSERT_TRUE((*la[i])->send(mark, 1));
  }
  for (int i = 0; i < pairs; ++i) {
    std::array<completion, 4> got{};
    bool received = false;
    for (int k = 0; k < 100 && !received; ++k) {
      auto n = (*lb[i])->wait(got, std::chrono::milliseconds(50));
      ASSERT_TRUE(n) << n.error().describe();
      for (std::size_t j = 0; j < *n; ++j) {
        if (got[j].kind != completion_kind::send_received) continue;
        ASSERT_EQ(got[j].data.size(), 1u);
        EXPECT_EQ(got[j].data[0], static_cast<std::byte>(i + 1)) << "pair " << i << " crossed";
        received = true;
      }
    }
    EXPECT_TRUE(received) << "pair " << i;
  }
}

// A bulk port another process holds is refused at once, naming the port and the setting.
TEST(tcp_backend, a_taken_bulk_port_is_refused_naming_it) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const auto port = ntohs(a.sin_port);
  auto r = reserve_bulk_port("127.0.0.1", port);
  ::close(fd);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("bulk port 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << r.error().message;
  EXPECT_NE(r.error().message.find("listen.bulk_port"), std::string::npos) << r.error().message;
}

TEST(shm_backend, a_peer_on_another_host_is_refused) {
  auto s = prepare_link(backend_kind::shm, link_options{});
  ASSERT_TRUE(s);
  connect_params remote = (*s)->local_params();
  remote.host_id = "some-other-host";
  remote.nonce ^= 1;
  auto l = (*s)->connect(remote);
  ASSERT_FALSE(l);
  EXPECT_EQ(l.error().code, errc::invalid_argument) << l.error().describe();
}

// Two shm links in this process, connected to each other (b connects on a thread: connect
// waits for the peer). b_params is b's side, whose inbox a test maps to play a peer that rewrites
// its own memory.
struct shm_pair {
  std::unique_ptr<bulk::link> a;
  std::unique_ptr<bulk::link> b;
  connect_params b_params;
};

void connect_shm_pair(shm_pair& pair) {
  auto sa = prepare_link(backend_kind::shm, link_options{});
  auto sb = prepare_link(backend_kind::shm, link_options{});
  ASSERT_TRUE(sa && sb);
  pair.b_params = (*sb)->local_params();
  result<std::unique_ptr<bulk::link>> lb = error{};
  std::thread t([&] { lb = (*sb)->connect((*sa)->local_params()); });
  auto la = (*sa)->connect(pair.b_params);
  t.join();
  ASSERT_TRUE(la && lb);
  pair.a = std::move(*la);
  pair.b = std::move(*lb);
}

// A connected shm pair with a 4 KiB source registered on a and a 4 KiB target registered on b,
// described for a to write into.
struct shm_write_pair {
  shm_pair pair;
  shared_buffer src;
  shared_buffer target;
  buffer_handle src_handle;
  remote_buffer target_remote;
};

void connect_shm_write_pair(shm_write_pair& w) {
  ASSERT_NO_FATAL_FAILURE(connect_shm_pair(w.pair));
  auto target = allocate_buffer(4096);
  auto src = allocate_buffer(4096);
  ASSERT_TRUE(target && src);
  w.target = std::move(*target);
  w.src = std::move(*src);
  auto th = w.pair.b->register_buffer(w.target);
  auto sh = w.pair.a->register_buffer(w.src);
  ASSERT_TRUE(th && sh);
  auto remote = w.pair.b->describe(*th);
  ASSERT_TRUE(remote);
  w.src_handle = *sh;
  w.target_remote = *remote;
}

// The first page of the inbox `params` names (header and registration table), mapped writable.
void map_inbox_page(const connect_params& params, std::byte*& page) {
  const int fd = ::open(params.shm_name.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0) << params.shm_name;
  void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  ASSERT_NE(p, MAP_FAILED);
  page = static_cast<std::byte*>(p);
}

TEST(shm_backend, an_inbox_of_another_format_is_refused_by_name) {
  // A peer built with another ring protocol: its inbox header (magic, then the format) says so.
  link_options o;
  o.connect_timeout_ms = std::chrono::milliseconds(500);
  auto sa = prepare_link(backend_kind::shm, o);
  auto sb = prepare_link(backend_kind::shm, o);
  ASSERT_TRUE(sa && sb);
  const connect_params pb = (*sb)->local_params();
  std::byte* p = nullptr;
  ASSERT_NO_FATAL_FAILURE(map_inbox_page(pb, p));
  std::uint32_t format = 0;
  std::memcpy(&format, p + 4, sizeof format);
  const std::uint32_t other = format + 7;
  std::memcpy(p + 4, &other, sizeof other);
  ::munmap(p, 4096);
  auto la = (*sa)->connect(pb);
  ASSERT_FALSE(la);
  EXPECT_EQ(la.error().code, errc::unsupported) << la.error().describe();
  EXPECT_NE(la.error().message.find(fmt::format("format {}, we speak {}", other, format)),
            std::string::npos)
      << la.error().describe();
}

TEST(shm_backend, a_peer_that_rewrites_its_ring_geometry_after_connect_cannot_move_our_accesses) {
  // The peer owns its inbox header and can write it at any time. Its ring depth and table size
  // are read once, at connect; a depth raised afterwards once sent our 65th message past the end
  // of the mapping, and a larger table let a forged buffer id index past our own bookkeeping.
  shm_pair pair;
  ASSERT_NO_FATAL_FAILURE(connect_shm_pair(pair));
  std::byte* p = nullptr;
  ASSERT_NO_FATAL_FAILURE(map_inbox_page(pair.b_params, p));
  const std::uint32_t huge = 1u << 30;
  std::memcpy(p + 16, &huge, sizeof huge);  // depth
  std::memcpy(p + 24, &huge, sizeof huge);  // max_buffers
  ::munmap(p, 4096);
  auto& la = pair.a;
  auto& lb = pair.b;
  const std::uint32_t depth = link_options{}.limits.max_received;
  for (std::uint32_t i = 0; i < 3 * depth; ++i) {
    const std::byte m[4] = {std::byte(i), std::byte(i >> 8), std::byte{0}, std::byte{9}};
    auto sent = la->send(m, i);
    ASSERT_TRUE(sent) << i << ": " << sent.error().describe();
    completion done[4];
    (void)la->poll(done);  // our send_done: the outstanding bound
    completion c[1];
    std::size_t n = 0;
    while (n == 0) {
      auto r = lb->wait(c, std::chrono::seconds(5));
      ASSERT_TRUE(r) << r.error().describe();
      ASSERT_NE(*r, 0u) << "message " << i << " did not arrive";
      n = c[0].kind == completion_kind::send_received ? *r : 0;
    }
    ASSERT_EQ(c[0].data.size(), sizeof m);
    EXPECT_EQ(std::memcmp(c[0].data.data(), m, sizeof m), 0) << i;
  }
  auto src = allocate_buffer(64);
  ASSERT_TRUE(src);
  auto h = la->register_buffer(*src);
  ASSERT_TRUE(h);
  const remote_buffer forged{1000, 0, 1, 64};
  auto w = la->write_with_imm(*h, 0, forged, 0, 64, 0, 0);
  ASSERT_FALSE(w);
  EXPECT_EQ(w.error().code, errc::protocol) << w.error().describe();
  EXPECT_NE(w.error().message.find("no buffer 1000"), std::string::npos) << w.error().describe();
}

TEST(shm_backend, a_buffer_size_raised_in_the_peers_table_cannot_carry_a_write_past_the_mapping) {
  // The peer's registration table is the peer's to write. We map a buffer at its first write
  // and reuse the mapping while the rkey stays; a size raised in the table afterwards (and a
  // descriptor that claims it) once sent the next write past the end of the 4 KiB mapping.
  shm_write_pair s;
  ASSERT_NO_FATAL_FAILURE(connect_shm_write_pair(s));
  auto& la = s.pair.a;
  ASSERT_TRUE(la->write_with_imm(s.src_handle, 0, s.target_remote, 0, 64, 1, 1));  // maps it
  // Entry 1 of the table (after the 128-byte header): rkey, fd, then the size at byte 8.
  std::byte* p = nullptr;
  ASSERT_NO_FATAL_FAILURE(map_inbox_page(s.pair.b_params, p));
  std::uint64_t size = 0;
  std::memcpy(&size, p + 128 + 8, sizeof size);
  ASSERT_EQ(size, 4096u) << "the table entry is not where this test expects it";
  const std::uint64_t huge = std::uint64_t{1} << 30;
  std::memcpy(p + 128 + 8, &huge, sizeof huge);
  ::munmap(p, 4096);
  remote_buffer forged = s.target_remote;
  forged.size = huge;
  auto w = la->write_with_imm(s.src_handle, 0, forged, std::uint64_t{1} << 20, 64, 2, 2);
  ASSERT_FALSE(w);
  EXPECT_EQ(w.error().code, errc::protocol) << w.error().describe();
  EXPECT_NE(w.error().message.find("is 4096 bytes"), std::string::npos) << w.error().describe();
  EXPECT_FALSE(la->is_up());  // a remote access error takes the link down, as on RDMA
}

TEST(shm_backend, private_memory_can_be_a_source_but_not_a_target) {
  shm_pair pair;
  ASSERT_NO_FATAL_FAILURE(connect_shm_pair(pair));
  auto& la = pair.a;
  auto& lb = pair.b;
  std::vector<std::byte> priv(4096, std::byte{5});
  auto h = la->register_buffer(priv.data(), priv.size());
  ASSERT_TRUE(h);
  auto d = la->describe(*h);
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code, errc::unsupported);
  EXPECT_NE(d.error().message.find("allocate_buffer"), std::string::npos);
  // ... and as a source it works.
  auto target = allocate_buffer(4096);
  ASSERT_TRUE(target);
  auto th = lb->register_buffer(*target);
  ASSERT_TRUE(th);
  auto remote = lb->describe(*th);
  ASSERT_TRUE(remote);
  ASSERT_TRUE(la->write_with_imm(*h, 0, *remote, 0, 4096, 1, 1));
  completion c[1];
  std::size_t n = 0;
  while (n == 0) n = *lb->wait(c, std::chrono::seconds(1));
  EXPECT_EQ(c[0].kind, completion_kind::write_received);
  EXPECT_EQ(target->data()[4095], std::byte{5});
}

TEST(shm_backend, a_group_of_writes_that_claims_more_than_its_slot_holds_takes_the_link_down) {
  // A post_writes() list reaches the peer as groups, a slot each, whose head says how many
  // records follow. The count is the writer's to write; the reader bounds it by its own slot
  // size, and a larger one is a broken peer: the link goes down naming it, after the writes
  // already taken, and nothing is read past the slot.
  shm_write_pair s;
  ASSERT_NO_FATAL_FAILURE(connect_shm_write_pair(s));
  auto& la = s.pair.a;
  auto& lb = s.pair.b;
  const buffer_handle src = s.src_handle;
  const remote_buffer& to = s.target_remote;
  ASSERT_TRUE(la->write_with_imm(src, 0, to, 0, 64, 7, 1));  // taken whole, before the group
  const write_request list[2] = {{src, 0, to, 0, 64, 8, 2}, {src, 64, to, 64, 64, 9, 3}};
  ASSERT_TRUE(la->post_writes(list));
  // Find the group's slot in b's inbox: sequence number 2, then kind 3 (a group) and count 2.
  const int fd = ::open(s.pair.b_params.shm_name.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const off_t size = ::lseek(fd, 0, SEEK_END);
  void* m = ::mmap(nullptr, static_cast<std::size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED,
                   fd, 0);
  ::close(fd);
  ASSERT_NE(m, MAP_FAILED);
  auto* inbox = static_cast<std::byte*>(m);
  const std::uint64_t want[2] = {2, (std::uint64_t{2} << 32) | 3};  // seq, then {kind, imm}
  std::byte* head = nullptr;
  for (off_t off = 0; off + 16 <= size && head == nullptr; off += 64) {
    if (std::memcmp(inbox + off, want, sizeof want) == 0) head = inbox + off;
  }
  ASSERT_NE(head, nullptr) << "no group slot in the inbox";
  const std::uint32_t forged = 1u << 30;
  std::memcpy(head + 12, &forged, sizeof forged);
  ::munmap(m, static_cast<std::size_t>(size));
  std::vector<completion> got;
  completion c[4];
  while (got.empty() || got.back().kind != completion_kind::link_down) {
    auto n = lb->wait(c, std::chrono::seconds(5));
    ASSERT_TRUE(n) << n.error().describe();
    ASSERT_GT(*n, 0u) << "the link stayed up";
    got.insert(got.end(), std::make_move_iterator(c), std::make_move_iterator(c + *n));
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].kind, completion_kind::write_received);
  EXPECT_EQ(got[0].imm, 7u);
  ASSERT_TRUE(got[1].failure.has_value());
  EXPECT_EQ(got[1].failure->code, errc::protocol) << got[1].failure->describe();
  EXPECT_NE(got[1].failure->message.find("group of 1073741824 writes"), std::string::npos)
      << got[1].failure->describe();
  EXPECT_FALSE(lb->is_up());
}

}  // namespace
