// The bulk plane: one interface for a point-to-point link that moves tensors between two nodes.
//
// Semantics are those of an RDMA reliable connection (RC queue pair), and every backend (rdma, shm,
// tcp) gives the same ones, so that code above (collectives, shard transfer) never asks which
// backend it runs on:
//
//   * register_buffer(): memory the link may read from (source of a write) or that the peer may
//     write into (target of a write). Bounded count (link_limits::max_buffers). A registration
//     yields a remote_buffer descriptor (plain data) that the owner hands to the peer through the
//     control plane; the peer names it as the target of write_with_imm().
//   * write_with_imm(): one-sided write of a range of a local registered buffer into the peer's
//     registered buffer at an offset, with a 32-bit immediate. The peer receives one
//     `write_received` completion carrying imm and the byte count, and only after every byte is in
//     its buffer (RDMA WRITE_WITH_IMM). The writer receives one `write_done` completion carrying
//     its wr_id once the source range may be reused.
//   * post_writes(): a list of writes posted as one (RDMA: one chain of work requests and one
//     doorbell, as ibv_post_send takes them). Each write behaves exactly as its own
//     write_with_imm() would (its own write_done and write_received, in list order); the list is
//     checked whole before any byte moves, so a refusal posts none of it.
//   * send(): a small two-sided message (<= link_limits::max_send_bytes); the peer receives one
//     `send_received` completion carrying the bytes; the sender one `send_done`.
//   * Ordering: the peer sees received completions in the order the operations were posted (one
//     ordered stream per direction, writes and sends mixed).
//   * Completions: poll() never blocks; wait() spins for up to link_options::spin_us and then
//     blocks (futex/epoll) until a completion arrives, the link goes down or the timeout passes. A
//     blocking hand-off costs 20-50 us on a 2-vCPU guest, a spin 0.2 us: short waits stay spinning.
//   * Bounds: at most link_limits::max_outstanding posted operations whose local completion has not
//     yet been polled; one more is refused with errc::overloaded (nothing is sent). Every refusal
//     happens before any byte moves: a bad offset, an unknown buffer or an oversized send returns
//     errc::invalid_argument and writes nothing.
//   * Link down: the peer process died, closed its end, broke the protocol, or an operation failed
//     (e.g. remote access error). Every pending operation then completes with an error, a single
//     `link_down` completion is delivered after the ones already received, and every later call
//     returns errc::closed naming the cause. Never a hang: waits have timeouts, dead peers are
//     detected (pidfd for shm, EOF/RST/TCP_USER_TIMEOUT for tcp, retry-exceeded for rdma).
//
// Set-up is a plain-data exchange: prepare_link() allocates the local side (a listening socket, a
// shared-memory inbox, a queue pair) and describes it as connect_params; both sides send their
// params to each other over the authenticated control plane and call link_setup::connect(remote).
// The params carry a random nonce that doubles as the admission token: only a process that saw
// the params (i.e. a member of the cluster) can complete the link.
//
// Threading: a link may be used from several threads; posting calls (register, write, send) are
// serialised internally, and completions go to whichever thread polls. Destroying the link closes
// it (the peer sees link_down).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <msgpack.hpp>

#include "actors/base/result.hpp"

namespace tessera::transport::bulk {

/// Which implementation carries a link. Values are stable: they travel in connect_params.
enum class backend_kind : std::uint8_t { tcp = 1, shm = 2, rdma = 3 };

[[nodiscard]] std::string_view to_string(backend_kind kind) noexcept;
/// Parses "tcp", "shm" or "rdma".
[[nodiscard]] result<backend_kind> parse_backend(std::string_view name);

/// A local registration, valid on the link that made it until deregister_buffer().
struct buffer_handle {
  std::uint32_t id = 0;  ///< 0 is never a valid handle
  bool operator==(const buffer_handle&) const = default;
};

/// What a peer needs to write into one of our registered buffers. Plain data: travels over the
/// control plane. `addr`/`rkey` are backend-specific (rdma: virtual address and MR rkey; shm:
/// shared-memory file index and a random key; tcp: 0 and a random key); a writer treats them as
/// opaque and only checks `size` before writing.
struct remote_buffer {
  std::uint32_t id = 0;
  std::uint64_t addr = 0;
  std::uint32_t rkey = 0;
  std::uint64_t size = 0;
  bool operator==(const remote_buffer&) const = default;
  MSGPACK_DEFINE_MAP(id, addr, rkey, size)
};

/// Everything a peer needs to connect to our side of a link. Plain data, msgpack-serialisable;
/// carried by the authenticated control plane. Fields a backend does not use stay empty.
struct connect_params {
  static constexpr std::uint16_t current_version = 1;
  std::uint16_t version = current_version;
  std::uint8_t backend = 0;  ///< a backend_kind
  std::string host_id;       ///< identifies the machine (boot id): shm only links equal hosts
  std::uint64_t nonce = 0;   ///< random per link side; admission token and tie-breaker
  // tcp
  std::string address;  ///< numeric IPv4/IPv6 address the peer connects to
  std::uint16_t port = 0;
  // shm
  std::int32_t pid = 0;  ///< owner of the shared-memory inbox (liveness via pidfd)
  std::string shm_name;  ///< path the peer opens to map our inbox (e.g. /proc/<pid>/fd/<n>)
  // rdma
  std::uint32_t qpn = 0;
  std::uint32_t psn = 0;
  std::vector<std::uint8_t> gid;  ///< 16 bytes
  std::uint16_t lid = 0;
  std::uint8_t mtu = 0;  ///< ibv_mtu enum value
  bool operator==(const connect_params&) const = default;
  MSGPACK_DEFINE_MAP(version, backend, host_id, nonce, address, port, pid, shm_name, qpn, psn, gid,
                     lid, mtu)
};

/// Serialises params to msgpack bytes / parses them back (rejecting malformed or wrong-version
/// input with errc::corrupt / errc::unsupported).
[[nodiscard]] std::vector<std::byte> encode(const connect_params& params);
[[nodiscard]] result<connect_params> decode_connect_params(std::span<const std::byte> bytes);

/// Per-link bounds. A backend may lower the defaults it is given (e.g. rdma: max_write_bytes by
/// the device's max message size); link::limits() says what applies.
struct link_limits {
  std::uint32_t max_buffers = 64;              ///< live registrations per link
  std::uint32_t max_outstanding = 64;          ///< posted ops not yet completed+polled
  std::uint32_t max_send_bytes = 64 * 1024;    ///< one send()
  std::uint64_t max_write_bytes = 1ull << 30;  ///< one write_with_imm()
  /// Received completions queued and not yet polled (shm: ring slots of max_send_bytes each; a
  /// slot holds one write or send, or a group of up to max_send_bytes / 16 writes of one
  /// post_writes() list, so lists may queue more writes than this).
  /// At the bound the sender is held back (backpressure), up to peer_timeout_ms.
  std::uint32_t max_received = 64;
};

/// Options for prepare_link().
struct link_options {
  link_limits limits;
  std::uint32_t spin_us = 50;  ///< wait() spins this long before it blocks
  /// tcp: address to listen on (numeric; "0.0.0.0" = every interface). Empty: 127.0.0.1.
  std::string bind_address;
  /// tcp: 0 = each link listens on an ephemeral port of its own; otherwise every link of this
  /// process on bind_address shares one listener on this port (a firewall needs one known port;
  /// the set-up hello says which link a connection is for). reserve_bulk_port() binds it early.
  std::uint16_t listen_port = 0;
  /// The address the peer is told to connect to (tcp) and whose GID the link uses (rdma, when the
  /// device has one for it). Empty: bind_address, which must then not be the wildcard (a peer on
  /// another host cannot reach "127.0.0.1", so the node always sets it: mesh/node/advertise.hpp).
  std::string advertise_address;
  /// How long connect() waits for the peer to show up.
  std::chrono::milliseconds connect_timeout_ms{10'000};
  /// A peer that accepts no bytes for this long is declared dead (tcp: TCP_USER_TIMEOUT and the
  /// write stall limit).
  std::chrono::milliseconds peer_timeout_ms{10'000};
  /// rdma: device name ("" = first with an active port) and GID index (-1 = pick RoCE v2 IPv4).
  std::string rdma_device;
  int rdma_gid_index = -1;
  /// shm: where both processes can use membarrier(), posts take no fence (biased locks, and a
  /// consumer about to sleep runs membarrier() instead); false puts a fence (an atomic
  /// read-modify-write) into every post and poll, as before. For comparison runs.
  bool shm_fence_free = true;
};

/// Where a node's bulk links listen and what they tell the peer (link_options' two addresses), as
/// one value for the components that open links on the node's behalf.
struct link_addresses {
  std::string bind = "127.0.0.1";
  std::string advertise;  ///< empty: bind
  std::uint16_t port = 0;  ///< link_options::listen_port (0: a port per link)
  void apply_to(link_options& o) const {
    o.bind_address = bind;
    o.advertise_address = advertise;
    o.listen_port = port;
  }
};

/// Binds the shared tcp listener for `bind`:`port` (link_options::listen_port) now, so that a
/// port already taken fails at start with a clear error, not at the first link; the listener
/// stays while the returned handle (or any link set-up on it) lives.
[[nodiscard]] result<std::shared_ptr<void>> reserve_bulk_port(const std::string& bind,
                                                              std::uint16_t port);

enum class completion_kind : std::uint8_t {
  write_done = 1,     ///< local: our write_with_imm() finished (wr_id)
  send_done = 2,      ///< local: our send() finished (wr_id)
  write_received = 3, ///< remote: the peer wrote `bytes` into one of our buffers (imm)
  send_received = 4,  ///< remote: the peer sent `data`
  link_down = 5,      ///< the link is down; `failure` says why. Delivered once, last.
};

[[nodiscard]] std::string_view to_string(completion_kind kind) noexcept;

struct completion {
  completion_kind kind = completion_kind::link_down;
  std::uint64_t wr_id = 0;  ///< write_done / send_done: the caller's tag
  std::uint32_t imm = 0;    ///< write_received
  std::uint64_t bytes = 0;  ///< bytes moved (all kinds but link_down)
  std::vector<std::byte> data;     ///< send_received: the message
  std::optional<error> failure;    ///< set when the operation failed or the link went down
  [[nodiscard]] bool ok() const noexcept { return !failure.has_value(); }
};

/// One write of a post_writes() list: the arguments of one write_with_imm().
struct write_request {
  buffer_handle local;
  std::uint64_t local_offset = 0;
  remote_buffer remote;
  std::uint64_t remote_offset = 0;
  std::uint64_t bytes = 0;
  std::uint32_t imm = 0;
  std::uint64_t wr_id = 0;
};

class shared_buffer;

/// One established point-to-point link. See the file comment for the semantics.
class link {
 public:
  virtual ~link() = default;
  link() = default;
  link(const link&) = delete;
  link& operator=(const link&) = delete;

  [[nodiscard]] virtual backend_kind kind() const noexcept = 0;
  [[nodiscard]] virtual const link_limits& limits() const noexcept = 0;

  /// Registers [addr, addr+size). errc::no_capacity at max_buffers live registrations;
  /// errc::invalid_argument for null/empty ranges. shm: only memory from allocate_buffer() can be
  /// a write *target* (describe() refuses other memory); any memory can be a write source.
  [[nodiscard]] virtual result<buffer_handle> register_buffer(void* addr, std::size_t size) = 0;
  /// Registers a whole shared_buffer. Every backend can make it a write target (shm maps the
  /// peer's memfd); the default forwards to register_buffer(data, size).
  [[nodiscard]] virtual result<buffer_handle> register_buffer(const shared_buffer& buffer);
  /// Frees the registration slot. Writes the peer makes afterwards with the old descriptor fail
  /// and take the link down (as a remote access error does on RDMA).
  [[nodiscard]] virtual result<void> deregister_buffer(buffer_handle handle) = 0;
  /// The descriptor to hand to the peer so it can write into `handle`.
  [[nodiscard]] virtual result<remote_buffer> describe(buffer_handle handle) const = 0;

  /// Writes local[local_offset, +bytes) into remote[remote_offset, +bytes) and delivers `imm`.
  /// Refused (nothing written) with errc::invalid_argument when either range is out of bounds,
  /// `local` is unknown or bytes > max_write_bytes; errc::overloaded at max_outstanding;
  /// errc::closed when the link is down. bytes may be 0 (delivers only the immediate).
  [[nodiscard]] virtual result<void> write_with_imm(buffer_handle local, std::uint64_t local_offset,
                                                    const remote_buffer& remote,
                                                    std::uint64_t remote_offset,
                                                    std::uint64_t bytes, std::uint32_t imm,
                                                    std::uint64_t wr_id) = 0;
  /// Posts `writes` in order as one operation, each as write_with_imm() would post it (one
  /// write_done per write, and one write_received per write at the peer, in list order). Why a
  /// list: every post pays a fixed cost besides its bytes (a lock, checks, the hand-off to the
  /// peer: a doorbell on RDMA, a system call on tcp, a cache line that moves to the reader's core
  /// on shm), and a list pays it once. All or nothing: the whole list is checked first, and when
  /// any write would be refused (the reasons of write_with_imm(), the message naming the write's
  /// index) or the list does not fit in the room left under max_outstanding (errc::overloaded;
  /// errc::invalid_argument when it exceeds max_outstanding itself), none is posted. An empty
  /// list posts nothing and succeeds. A link that goes down while the list is being posted
  /// makes it return errc::closed; like single writes cut off by the same failure, a prefix of
  /// the list may have reached the peer, and no write is reported done that did not finish.
  [[nodiscard]] virtual result<void> post_writes(std::span<const write_request> writes) = 0;
  /// Sends a small message. errc::invalid_argument over max_send_bytes; errc::overloaded at
  /// max_outstanding; errc::closed when down. May block while the transport applies backpressure
  /// (never longer than link_options::peer_timeout_ms; then the link goes down).
  [[nodiscard]] virtual result<void> send(std::span<const std::byte> message,
                                          std::uint64_t wr_id) = 0;

  /// Moves up to out.size() completions into `out` without blocking; returns how many.
  [[nodiscard]] virtual std::size_t poll(std::span<completion> out) = 0;
  /// As poll(), but waits (spin, then block) up to `timeout` for at least one completion.
  /// Returns 0 on timeout. After the link_down completion has been delivered, returns errc::closed.
  [[nodiscard]] virtual result<std::size_t> wait(std::span<completion> out,
                                                 std::chrono::microseconds timeout) = 0;

  /// True until the link goes down (peer death, close, error).
  [[nodiscard]] virtual bool is_up() const noexcept = 0;
  /// Takes the link down from this side; the peer sees link_down. Idempotent.
  virtual void close() = 0;
};

/// The local half of a link being set up: owns the local resources until connect().
class link_setup {
 public:
  virtual ~link_setup() = default;
  link_setup() = default;
  link_setup(const link_setup&) = delete;
  link_setup& operator=(const link_setup&) = delete;

  /// Our params, to send to the peer.
  [[nodiscard]] virtual const connect_params& local_params() const noexcept = 0;
  /// Completes the link with the peer's params (both sides call this, in any order, concurrently).
  /// errc::invalid_argument for params of another backend; errc::timeout when the peer does not
  /// show up within connect_timeout_ms; errc::unauthorized when the wrong peer shows up.
  /// Consumes the set-up: call at most once.
  [[nodiscard]] virtual result<std::unique_ptr<link>> connect(const connect_params& remote) = 0;
};

/// Allocates the local half of a link of the given backend.
/// errc::unsupported when the backend is not available here (e.g. no RDMA device).
[[nodiscard]] result<std::unique_ptr<link_setup>> prepare_link(backend_kind kind,
                                                               const link_options& options);

/// Per-process facts the backend choice needs. Sent along with params during negotiation.
struct local_capabilities {
  std::string host_id;     ///< this_host_id()
  bool has_rdma = false;   ///< an RDMA device with an active port
  MSGPACK_DEFINE_MAP(host_id, has_rdma)
};

/// This machine's identity: the kernel boot id (/proc/sys/kernel/random/boot_id).
[[nodiscard]] std::string this_host_id();
/// Capabilities of this process (probes RDMA devices once).
[[nodiscard]] local_capabilities probe_capabilities();
/// This host's active RDMA ports, each with the GID a link would use, as text for capability
/// exchange and status: "rxe0/1 ::ffff:10.0.2.15 (RoCE v2, GID index 1)". Empty where there is no
/// device, or the build has no rdma backend.
[[nodiscard]] std::vector<std::string> describe_rdma_ports();

/// The backend a link between `a` and `b` should use: rdma when both have a device, else shm when
/// both are on one host, else tcp. `forced` (configuration) overrides the choice. Both ends
/// compute the same answer from the same two capability records. When rdma set-up fails the
/// caller retries with choose_backend(..., exclude_rdma = true).
[[nodiscard]] backend_kind choose_backend(const local_capabilities& a, const local_capabilities& b,
                                          std::optional<backend_kind> forced = std::nullopt,
                                          bool exclude_rdma = false);

/// Memory every backend can use as a write target (shm needs shared memory; rdma and tcp take it
/// as well). memfd-backed, page aligned, zero filled. Portable code allocates receive buffers here.
class shared_buffer {
 public:
  shared_buffer() = default;
  ~shared_buffer();
  shared_buffer(shared_buffer&& other) noexcept;
  shared_buffer& operator=(shared_buffer&& other) noexcept;
  shared_buffer(const shared_buffer&) = delete;
  shared_buffer& operator=(const shared_buffer&) = delete;

  [[nodiscard]] std::byte* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::span<std::byte> span() const noexcept { return {data_, size_}; }
  [[nodiscard]] int fd() const noexcept { return fd_; }

 private:
  friend result<shared_buffer> allocate_buffer(std::size_t size);
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  int fd_ = -1;
};

/// Allocates `size` bytes (rounded up to pages). errc::invalid_argument for 0, errc::io when the
/// OS refuses.
[[nodiscard]] result<shared_buffer> allocate_buffer(std::size_t size);

}  // namespace tessera::transport::bulk
