// Model distribution: a peer that the plan gives a group (or a slice of one) for a model it has no
// file of receives the bytes it needs from peers that hold the file, over the bulk transport, each
// chunk verified against the model's hash.
//
// Identity. A holder hashes its file once at start into a chunk table — BLAKE2b-256 of every
// chunk of `chunk_bytes` (1 MiB, doubled until the table has at most kMaxChunks entries) plus the
// file size and the GGUF data offset — and the model's content id (`root`) is BLAKE2b-256 of the
// encoded table. The root travels in the model's placement spec (model_spec::content), so the
// leader plans only over holders of identical bytes and a fetcher knows, from the plan and not
// from the peer it fetches from, which bytes are right: a table whose hash is not the root, or a
// chunk whose hash is not the table's, is refused and the fetcher moves to another holder.
//
// What is fetched. The GGUF header (chunks covering [0, data_offset)) and then, for each shard the
// plan gives this peer, the chunks covering inference::model::model::file_ranges() of that shard:
// a pipeline stage fetches its layers only; a tensor-parallel slice its rows (column-split tensors
// are strided, so their chunks are fetched whole). The bytes go into a sparse copy of the file at
// their own offsets (`<dir>/<name>.gguf`), so the ordinary loaders read it unchanged; the root is
// kept beside it (`<name>.root`) and a restart re-verifies the chunks already there instead of
// fetching them again.
//
// Set-up. The fetcher prepares a bulk link and sends its connect params in a share_setup offer over
// the control plane; the holder answers with its own (or an error: unknown model, other content,
// busy), both connect. In-band then (link send() messages, msgpack): the fetcher says hello with
// the registered receive buffer (kShareSlots slots), asks for the table, then for chunks; the
// holder preads each into a staging slot, writes it into the fetcher's slot (write_with_imm) and
// sends a reply naming slot and size (the reply follows the write on the link, so the bytes are
// there when the reply is). kShareSlots chunks are in flight at once.
//
// Bounds: a holder serves kMaxShareSessions fetches at once (further offers are answered "busy"),
// every wait is bounded by kShareTimeout, a session idle that long is closed, tables are bounded by
// kMaxChunks entries, messages by the link's max_send_bytes.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <msgpack.hpp>

#include "actors/base/result.hpp"
#include "inference/gguf/gguf.hpp"
#include "inference/model/model.hpp"
#include "transport/bulk/link.hpp"

namespace tessera::mesh::serving {

inline constexpr std::uint64_t kMinChunkBytes = 1u << 20;
inline constexpr std::uint64_t kMaxChunkBytes = 64u << 20;
inline constexpr std::uint64_t kMaxChunks = 32768;  // a table of at most 1 MiB of hashes
inline constexpr std::size_t kHashBytes = 32;       // BLAKE2b-256
inline constexpr std::size_t kMaxShareSessions = 4;
inline constexpr std::uint32_t kShareSlots = 4;
inline constexpr std::chrono::milliseconds kShareTimeout{20'000};
/// Link set-up: short, since stopping a node waits for a set-up in progress.
inline constexpr std::chrono::milliseconds kShareConnectTimeout{5'000};

/// A file's chunk hashes. Plain data; its encoding hashes to the model's content id.
struct chunk_table {
  std::uint64_t file_size = 0;
  std::uint64_t data_offset = 0;  ///< GGUF: where tensor data starts (the header is before it)
  std::uint64_t chunk_bytes = 0;
  std::vector<std::uint8_t> hashes;  ///< kHashBytes per chunk, in file order
  MSGPACK_DEFINE_MAP(file_size, data_offset, chunk_bytes, hashes);

  [[nodiscard]] std::uint64_t chunks() const noexcept { return hashes.size() / kHashBytes; }
  /// Byte range of chunk `i` (the last one may be short).
  [[nodiscard]] inference::gguf::byte_range chunk_range(std::uint64_t i) const noexcept;
  /// Whether `bytes` are chunk `i`.
  [[nodiscard]] bool matches(std::uint64_t i, std::span<const std::byte> bytes) const;
};

/// Reads the GGUF file at `path` once and hashes it. `progress(done, total)` may be empty.
[[nodiscard]] result<chunk_table> hash_model_file(
    const std::string& path,
    const std::function<void(std::uint64_t, std::uint64_t)>& progress = {});
[[nodiscard]] std::vector<std::uint8_t> encode(const chunk_table& t);
/// Parses and checks an encoded table (sizes consistent, bounds): errc::corrupt otherwise.
[[nodiscard]] result<chunk_table> decode_chunk_table(std::span<const std::uint8_t> bytes);
/// The content id: BLAKE2b-256 of encode(t), 64 hex digits.
[[nodiscard]] std::string content_root(const chunk_table& t);
/// The chunks that cover `ranges`, sorted, each once.
[[nodiscard]] std::vector<std::uint64_t> chunks_covering(
    const chunk_table& t, std::span<const inference::gguf::byte_range> ranges);

/// Control-plane message of the set-up (runtime message model_share): an offer from a fetcher, an
/// answer from a holder.
struct share_setup {
  enum kind_t : std::uint8_t { offer = 1, answer = 2 };
  std::uint8_t kind = offer;
  std::uint64_t fetch_id = 0;
  std::string model;
  std::string root;
  std::uint8_t backend = 0;
  std::vector<std::uint8_t> params;  ///< transport::bulk::encode(connect_params); empty on error
  std::string error;                 ///< answer: why the holder will not serve
  MSGPACK_DEFINE_MAP(kind, fetch_id, model, root, backend, params, error);
};

/// Ships a share_setup to a peer (node hex id) over the control plane; thread-safe.
using share_sender = std::function<void(const std::string& to_hex, const share_setup& m)>;

/// The holder's side: serves its model files to fetchers, each session on a worker thread.
class share_server {
 public:
  share_server(transport::bulk::link_addresses addresses, share_sender send);
  ~share_server();  ///< stop()
  share_server(const share_server&) = delete;
  share_server& operator=(const share_server&) = delete;

  /// A model this peer can serve (any thread; a name added twice keeps the first).
  void add(const std::string& name, const std::string& path, chunk_table table);
  /// An offer from the peer `from_hex` (any thread): answered from a worker.
  void on_offer(const std::string& from_hex, const share_setup& offer);
  /// Ends every session (their fetchers see the link go down) and joins.
  void stop();

  struct stats {
    std::uint64_t sessions = 0, refused = 0, chunks = 0, bytes = 0;
    std::size_t running = 0;
  };
  [[nodiscard]] stats counters() const;

 private:
  struct entry {
    std::string path;
    chunk_table table;
    std::vector<std::uint8_t> encoded;
    std::string root;
  };
  struct serve_session;  // one fetcher's session on a serving thread (model_share.cpp)
  void serve(std::string from_hex, share_setup offer, const entry* e);
  void reap();

  transport::bulk::link_addresses addresses_;
  share_sender send_;
  std::map<std::string, entry> models_;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;
  std::size_t running_ = 0;
  std::atomic<std::uint64_t> sessions_{0}, refused_{0}, chunks_{0}, bytes_{0};
  struct worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<worker> workers_;
};

/// A peer holding the model, as the fetcher sees it.
struct share_source {
  std::string hex;  ///< control-plane id
  transport::bulk::backend_kind backend = transport::bulk::backend_kind::tcp;
};

/// The fetcher's side for one model: a worker thread that keeps a sparse local copy holding the
/// bytes of every shard asked for.
class model_fetch {
 public:
  struct options {
    std::string model;
    std::string root;  ///< the content id from the plan
    std::string dir;   ///< where the sparse copy lives (created)
    transport::bulk::link_addresses addresses;
    share_sender send;
    std::uint64_t fetch_id = 0;   ///< unique on this peer (answers are routed by it)
    std::function<void()> on_change;  ///< a want became ready or failed (any thread)
    /// Bytes verified so far / needed for the shards asked for (on the worker thread).
    std::function<void(std::uint64_t done, std::uint64_t total)> on_progress;
  };
  enum class state : std::uint8_t { idle, connecting, fetching, ready, failed };

  explicit model_fetch(options o);
  ~model_fetch();  ///< stops the worker (a fetch in progress is abandoned; its bytes stay)
  model_fetch(const model_fetch&) = delete;
  model_fetch& operator=(const model_fetch&) = delete;

  /// Stops the worker (idempotent): a fetch in progress is abandoned, its bytes stay.
  void stop();
  /// The holders to fetch from, best first, and the shards this peer needs (engine thread).
  void want(std::vector<share_source> sources, std::vector<inference::model::shard_spec> shards);
  /// An answer to one of our offers (any thread).
  void on_answer(const std::string& from_hex, const share_setup& answer);
  /// True once every byte `shard` reads is here and verified.
  [[nodiscard]] bool ready_for(const inference::model::shard_spec& shard) const;
  [[nodiscard]] std::string path() const;
  /// Every chunk of the file is here and verified: its table (the holder's), else nullopt.
  [[nodiscard]] std::optional<chunk_table> complete_table() const;
  [[nodiscard]] bool complete() const;  ///< the same, without copying the table
  [[nodiscard]] std::uint64_t fetch_id() const { return opt_.fetch_id; }
  [[nodiscard]] const std::string& root() const { return opt_.root; }

  struct progress {
    state st = state::idle;
    std::uint64_t bytes_done = 0, bytes_total = 0;  ///< for the shards asked for
    std::uint64_t fetched_bytes = 0;                ///< moved over links (not found on disk)
    std::string from;                               ///< current holder
    std::string error;                              ///< the last failure
    double seconds = 0;                             ///< time of the last completed fetch
    std::uint64_t attempts = 0;                     ///< fetches started (each over the holders)
  };
  [[nodiscard]] progress snapshot() const;

 private:
  void run();
  result<void> fetch_once(const std::vector<share_source>& sources,
                          const std::vector<inference::model::shard_spec>& shards);
  result<void> fetch_from(const share_source& src,
                          const std::vector<inference::model::shard_spec>& shards);
  result<void> open_store(const chunk_table& t);

  options opt_;
  std::string path_, root_path_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> stopping_{false};
  std::vector<share_source> sources_;
  std::vector<inference::model::shard_spec> wants_;
  std::uint64_t want_gen_ = 0, done_gen_ = 0;
  std::vector<inference::model::shard_spec> ready_;
  std::optional<chunk_table> complete_;  // set once every chunk is here
  std::optional<share_setup> answer_;
  progress prog_;
  // --- worker only ---
  std::optional<chunk_table> table_;
  std::vector<bool> have_;  // chunks here and verified
  int fd_ = -1;
  std::thread thread_;
};

[[nodiscard]] std::string_view to_string(model_fetch::state s) noexcept;

}  // namespace tessera::mesh::serving
