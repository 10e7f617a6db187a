// Model sharing: the chunk tables of a model file (BLAKE2b per chunk, the content root) and the
// holder side (share_server: offers answered, chunks served over bulk links). The fetcher side:
// model_fetch.cpp.
#include "mesh/serving/model_share.hpp"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/base/msgpack_bounded.hpp"
#include "actors/base/thread.hpp"
#include "mesh/serving/model_share_wire.hpp"

namespace tessera::mesh::serving {

using namespace share_detail;  // with the namespace aliases both halves use

// ------------------------------------------------------------------ chunk tables

gguf::byte_range chunk_table::chunk_range(std::uint64_t i) const noexcept {
  const std::uint64_t off = i * chunk_bytes;
  if (off >= file_size) return {file_size, 0};
  return {off, std::min(chunk_bytes, file_size - off)};
}

bool chunk_table::matches(std::uint64_t i, std::span<const std::byte> bytes) const {
  if (i >= chunks() || bytes.size() != chunk_range(i).size) return false;
  const auto h = blake2b(bytes.data(), bytes.size());
  return std::memcmp(h.data(), hashes.data() + i * kHashBytes, kHashBytes) == 0;
}

result<chunk_table> hash_model_file(
    const std::string& path, const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  auto f = gguf::file::open(path, {gguf::load_mode::headers_only, {}});
  if (!f) return f.error();
  chunk_table t;
  t.file_size = f->file_size();
  t.data_offset = f->data_offset();
  t.chunk_bytes = kMinChunkBytes;
  while ((t.file_size + t.chunk_bytes - 1) / t.chunk_bytes > kMaxChunks) {
    if (t.chunk_bytes >= kMaxChunkBytes)
      return make_error(errc::unsupported, "{}: {} is too large to share (at most {} chunks of {})",
                        path, gguf::human_bytes(t.file_size), kMaxChunks,
                        gguf::human_bytes(kMaxChunkBytes));
    t.chunk_bytes *= 2;
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error(errc::io, "{}: cannot open: {}", path, std::strerror(errno));
  std::vector<std::byte> buf(static_cast<std::size_t>(t.chunk_bytes));
  const std::uint64_t n = (t.file_size + t.chunk_bytes - 1) / t.chunk_bytes;
  t.hashes.reserve(n * kHashBytes);
  for (std::uint64_t i = 0; i < n; ++i) {
    const auto r = t.chunk_range(i);
    if (auto e = pread_all(fd, buf.data(), r.size, r.offset, path); !e) {
      ::close(fd);
      return e.error();
    }
    const auto h = blake2b(buf.data(), r.size);
    t.hashes.insert(t.hashes.end(), h.begin(), h.end());
    if (progress) progress(r.offset + r.size, t.file_size);
  }
  ::close(fd);
  return t;
}

std::vector<std::uint8_t> encode(const chunk_table& t) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, t);
  return {reinterpret_cast<const std::uint8_t*>(buf.data()),
          reinterpret_cast<const std::uint8_t*>(buf.data()) + buf.size()};
}

result<chunk_table> decode_chunk_table(std::span<const std::uint8_t> bytes) {
  auto decoded = tessera::bounded_decode<chunk_table>(bytes.data(), bytes.size());
  if (!decoded)
    return make_error(errc::corrupt, "model chunk table: malformed ({})", decoded.error().message);
  const chunk_table& t = *decoded;
  if (t.chunk_bytes < kMinChunkBytes || t.chunk_bytes > kMaxChunkBytes ||
      t.hashes.size() % kHashBytes != 0 || t.chunks() > kMaxChunks ||
      t.chunks() != (t.file_size + t.chunk_bytes - 1) / t.chunk_bytes ||
      t.data_offset > t.file_size)
    return make_error(errc::corrupt,
                      "model chunk table: inconsistent ({} bytes in chunks of {}, {} hashes, data "
                      "at {})",
                      t.file_size, t.chunk_bytes, t.hashes.size() / kHashBytes, t.data_offset);
  return t;
}

std::string content_root(const chunk_table& t) {
  const auto e = encode(t);
  const auto h = blake2b(e.data(), e.size());
  return hex_of(h);
}

std::vector<std::uint64_t> chunks_covering(const chunk_table& t,
                                           std::span<const gguf::byte_range> ranges) {
  std::set<std::uint64_t> s;
  for (const auto& r : ranges) {
    if (r.size == 0 || r.offset >= t.file_size) continue;
    const std::uint64_t last = std::min(r.offset + r.size, t.file_size) - 1;
    for (std::uint64_t c = r.offset / t.chunk_bytes; c <= last / t.chunk_bytes; ++c)
      s.insert(c);
  }
  return {s.begin(), s.end()};
}

// ------------------------------------------------------------------ holder side

share_server::share_server(bulk::link_addresses addresses, share_sender send)
    : addresses_(std::move(addresses)), send_(std::move(send)) {}

share_server::~share_server() {
  stop();
}

void share_server::add(const std::string& name, const std::string& path, chunk_table table) {
  entry e;
  e.path = path;
  e.encoded = encode(table);
  e.root = content_root(table);
  e.table = std::move(table);
  std::lock_guard lock(mu_);
  models_.emplace(name, std::move(e));  // map nodes stay put: sessions keep pointers to them
}

void share_server::stop() {
  stopping_ = true;
  std::vector<worker> ws;
  {
    std::lock_guard lock(mu_);
    ws.swap(workers_);
  }
  for (auto& w : ws)
    if (w.thread.joinable()) w.thread.join();
}

void share_server::reap() {
  // Under mu_: joins finished workers.
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (it->done->load()) {
      it->thread.join();
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
}

share_server::stats share_server::counters() const {
  stats s;
  s.sessions = sessions_;
  s.refused = refused_;
  s.chunks = chunks_;
  s.bytes = bytes_;
  std::lock_guard lock(mu_);
  s.running = running_;
  return s;
}

void share_server::on_offer(const std::string& from_hex, const share_setup& offer) {
  share_setup no;
  no.kind = share_setup::answer;
  no.fetch_id = offer.fetch_id;
  no.model = offer.model;
  no.root = offer.root;
  if (stopping_) return;
  std::lock_guard lock(mu_);
  const auto it = models_.find(offer.model);
  if (it == models_.end()) {
    no.error = fmt::format("this peer has no model '{}'", offer.model);
  } else if (it->second.root != offer.root) {
    no.error = fmt::format("this peer's model '{}' is other content ({}, not {})", offer.model,
                           it->second.root.substr(0, 16), offer.root.substr(0, 16));
  }
  reap();
  if (no.error.empty() && running_ >= kMaxShareSessions)
    no.error = fmt::format("busy: serving {} fetches already", running_);
  if (!no.error.empty()) {
    ++refused_;
    send_(from_hex, no);
    return;
  }
  ++running_;
  auto done = std::make_shared<std::atomic<bool>>(false);
  const entry* e = &it->second;
  workers_.push_back({std::thread([this, from_hex, offer, e, done] {
                        name_this_thread("share-serve");
                        serve(from_hex, offer, e);
                        {
                          std::lock_guard l(mu_);
                          --running_;
                        }
                        *done = true;
                      }),
                      done});
}

/// One fetcher's session on a serving thread: the staging buffer registered on its link, the
/// fetcher's receive buffer, and the answer to each of its messages.
struct share_server::serve_session {
  share_server& server;
  bulk::link& link;
  const entry& e;
  int fd;
  std::uint64_t slot_bytes;
  std::optional<bulk::shared_buffer> staging;
  bulk::buffer_handle staged{};
  std::optional<bulk::remote_buffer> target;
  std::uint64_t target_slot = 0;
  std::uint64_t wr = 1;
  std::uint64_t served = 0;  // chunks

  /// Fills `out` (the reply) for `w`; false when the link failed (the session ends).
  bool answer(const share_wire& w, share_wire& out) {
    out.op = w.op;
    out.index = w.index;
    out.slot = w.slot;
    if (w.op == share_wire::hello) {
      out.bytes = e.encoded.size();
      out.chunk_bytes = slot_bytes;
    } else if (w.op == share_wire::buffer) {
      take_buffer(w, out);
    } else if (w.op == share_wire::table || w.op == share_wire::chunk) {
      return write_piece(w, out);
    } else {
      out.error = fmt::format("unknown operation {}", w.op);
    }
    return true;
  }

  /// The fetcher's receive buffer (kShareSlots slots); our staging buffer, registered once.
  void take_buffer(const share_wire& w, share_wire& out) {
    if (w.slot_bytes < slot_bytes || w.target.size < w.slot_bytes * kShareSlots) {
      out.error = fmt::format("receive buffer of {} bytes is smaller than {} slots of {}",
                              w.target.size, kShareSlots, slot_bytes);
      return;
    }
    if (!staging) {
      auto b = bulk::allocate_buffer(static_cast<std::size_t>(slot_bytes * kShareSlots));
      auto h = b ? link.register_buffer(*b) : result<bulk::buffer_handle>(b.error());
      if (!h) {
        out.error = h.error().describe();
        return;
      }
      staging = std::move(*b);
      staged = *h;
    }
    target = w.target;
    target_slot = w.slot_bytes;
  }

  /// The chunk table or one chunk, read into its staging slot and written into the fetcher's.
  bool write_piece(const share_wire& w, share_wire& out) {
    if (!target || !staging || w.slot >= kShareSlots) {
      out.error = "no receive buffer (or a slot outside it)";
      return true;
    }
    std::byte* dst = staging->data() + w.slot * slot_bytes;
    std::uint64_t bytes = 0;
    if (w.op == share_wire::table) {
      bytes = e.encoded.size();
      std::memcpy(dst, e.encoded.data(), bytes);
    } else if (w.index >= e.table.chunks()) {
      out.error = fmt::format("chunk {} is past the last ({})", w.index, e.table.chunks());
      return true;
    } else {
      const auto r = e.table.chunk_range(w.index);
      bytes = r.size;
      if (auto rd = pread_all(fd, dst, r.size, r.offset, e.path); !rd) {
        out.error = rd.error().describe();
        return true;
      }
    }
    if (!link.write_with_imm(staged, w.slot * slot_bytes, *target, w.slot * target_slot, bytes,
                             w.slot, wr++))
      return false;
    out.bytes = bytes;
    if (w.op == share_wire::chunk) {
      ++server.chunks_;
      server.bytes_ += bytes;
      ++served;
    }
    return true;
  }
};

void share_server::serve(std::string from_hex, share_setup offer, const entry* e) {
  share_setup ans;
  ans.kind = share_setup::answer;
  ans.fetch_id = offer.fetch_id;
  ans.model = offer.model;
  ans.root = offer.root;
  ans.backend = offer.backend;
  const auto theirs = params_of(offer.params);
  auto setup = theirs ? bulk::prepare_link(static_cast<bulk::backend_kind>(offer.backend),
                                           share_link_options(addresses_))
                      : result<std::unique_ptr<bulk::link_setup>>(theirs.error());
  if (!setup) {
    ans.error = setup.error().describe();
    ++refused_;
    send_(from_hex, ans);
    return;
  }
  ans.params = to_u8(bulk::encode((*setup)->local_params()));
  send_(from_hex, ans);
  auto l = (*setup)->connect(*theirs);
  if (!l) {
    spdlog::warn("model share: link to fetcher {} of '{}': {}", from_hex, offer.model,
                 l.error().describe());
    return;
  }
  ++sessions_;
  bulk::link& link = **l;
  const int fd = ::open(e->path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    spdlog::warn("model share: {}: cannot open: {}", e->path, std::strerror(errno));
    return;
  }
  serve_session ss{*this, link, *e, fd,
                   std::max<std::uint64_t>(e->table.chunk_bytes, e->encoded.size())};
  auto last = clock_type::now();
  std::array<bulk::completion, 16> c;
  bool down = false;
  while (!stopping_ && !down) {
    auto n = link.wait(c, std::chrono::milliseconds(100));
    if (!n) break;
    if (*n == 0) {
      if (clock_type::now() - last > kShareTimeout) break;  // an idle fetcher: free the slot
      continue;
    }
    for (std::size_t i = 0; i < *n && !down; ++i) {
      if (c[i].kind == bulk::completion_kind::link_down || !c[i].ok()) {
        down = true;
        break;
      }
      if (c[i].kind != bulk::completion_kind::send_received) continue;
      last = clock_type::now();
      auto w = unpack_wire(c[i].data);
      if (!w) {
        down = true;  // a fetcher that breaks the protocol loses the session
        break;
      }
      share_wire out;
      if (!ss.answer(*w, out) || !link.send(pack_wire(out), ss.wr++)) down = true;
    }
  }
  ::close(fd);
  spdlog::info("model share: served {} chunks of '{}' to {}", ss.served, offer.model, from_hex);
}

}  // namespace tessera::mesh::serving
