// Model sharing's wire and file helpers, shared by the holder side (model_share.cpp) and the
// fetcher side (model_fetch.cpp): the in-band messages of a share session, chunk hashing, link
// options, whole-range file reads and writes, the model-name rule. Internal to mesh/serving.
#pragma once

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/base/msgpack_bounded.hpp"
#include "actors/base/thread.hpp"
#include "mesh/serving/model_share.hpp"

namespace tessera::mesh::serving::share_detail {

namespace bulk = transport::bulk;
namespace gguf = inference::gguf;
namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

/// The in-band messages of a share session (link send()).
struct share_wire {
  enum op_t : std::uint8_t { hello = 1, buffer = 2, table = 3, chunk = 4 };
  std::uint8_t op = hello;
  std::uint64_t index = 0;        ///< chunk
  std::uint32_t slot = 0;         ///< table / chunk: where the bytes go
  std::uint64_t bytes = 0;        ///< reply: bytes written; hello reply: the encoded table's size
  std::uint64_t chunk_bytes = 0;  ///< hello reply
  bulk::remote_buffer target;     ///< buffer: the fetcher's receive buffer
  std::uint64_t slot_bytes = 0;   ///< buffer
  std::string model, root, error;
  MSGPACK_DEFINE_MAP(op, index, slot, bytes, chunk_bytes, target, slot_bytes, model, root, error);
};

inline std::vector<std::byte> pack_wire(const share_wire& w) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, w);
  std::vector<std::byte> out(buf.size());
  std::memcpy(out.data(), buf.data(), buf.size());
  return out;
}

inline result<share_wire> unpack_wire(std::span<const std::byte> b) {
  auto w = tessera::bounded_decode<share_wire>(b.data(), b.size());
  if (!w)
    return make_error(errc::corrupt, "model share: malformed message ({})", w.error().message);
  return w;
}

inline std::string hex_of(std::span<const std::uint8_t> b) {
  std::string out;
  for (auto c : b)
    out += fmt::format("{:02x}", c);
  return out;
}

inline std::array<std::uint8_t, kHashBytes> blake2b(const void* data, std::size_t n) {
  std::array<std::uint8_t, kHashBytes> h{};
  crypto_generichash(h.data(), h.size(), static_cast<const unsigned char*>(data), n, nullptr, 0);
  return h;
}

inline bulk::link_options share_link_options(const bulk::link_addresses& addresses) {
  bulk::link_options o;
  addresses.apply_to(o);
  o.connect_timeout_ms = kShareConnectTimeout;
  o.peer_timeout_ms = kShareTimeout;
  return o;
}

inline std::vector<std::uint8_t> to_u8(const std::vector<std::byte>& b) {
  std::vector<std::uint8_t> out(b.size());
  if (!b.empty()) std::memcpy(out.data(), b.data(), b.size());
  return out;
}

inline result<bulk::connect_params> params_of(const std::vector<std::uint8_t>& p) {
  std::vector<std::byte> b(p.size());
  if (!p.empty()) std::memcpy(b.data(), p.data(), p.size());
  return bulk::decode_connect_params(b);
}

inline result<void> pread_all(int fd, std::byte* dst, std::uint64_t n, std::uint64_t off,
                       const std::string& path) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, dst, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      return make_error(errc::io, "{}: cannot read {} bytes at {}: {}", path, n, off,
                        r == 0 ? "end of file" : std::strerror(errno));
    dst += r;
    off += static_cast<std::uint64_t>(r);
    n -= static_cast<std::uint64_t>(r);
  }
  return ok();
}

inline result<void> pwrite_all(int fd, const std::byte* src, std::uint64_t n, std::uint64_t off,
                        const std::string& path) {
  while (n > 0) {
    const ssize_t r = ::pwrite(fd, src, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      return make_error(errc::io, "{}: cannot write {} bytes at {}: {}", path, n, off,
                        std::strerror(errno));
    src += r;
    off += static_cast<std::uint64_t>(r);
    n -= static_cast<std::uint64_t>(r);
  }
  return ok();
}

/// A model name becomes a file name: refuse anything that could leave the directory.
inline bool safe_name(const std::string& n) {
  if (n.empty() || n.size() > 200 || n[0] == '.') return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

}  // namespace tessera::mesh::serving::share_detail
