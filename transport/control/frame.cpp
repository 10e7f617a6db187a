#include "transport/control/frame.hpp"

#include <array>
#include <cstring>
#include <new>
#include <vector>

namespace tessera::transport::control {
namespace {

constexpr std::byte kMagic0{'T'};
constexpr std::byte kMagic1{'C'};

void put_le(char* p, std::uint64_t v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

std::uint64_t get_le(const std::byte* p, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

// Big-endian unsigned integer of n (1, 2, 4 or 8) bytes at p.
std::uint64_t get_be(const std::uint8_t* p, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}

// Open containers whose objects are still being read, innermost last; the first kInline levels
// live on the stack, deeper ones (only where frame_limits allow more nesting) on the heap.
class pending_stack {
 public:
  bool empty() const { return size_ == 0; }
  std::uint32_t size() const { return size_; }
  std::uint64_t& top() { return size_ <= kInline ? inline_[size_ - 1] : deep_.back(); }
  void push(std::uint64_t objects) {
    if (size_ < kInline) {
      inline_[size_] = objects;
    } else {
      deep_.push_back(objects);
    }
    ++size_;
  }
  void pop() {
    if (size_ > kInline) deep_.pop_back();
    --size_;
  }

 private:
  static constexpr std::uint32_t kInline = 64;
  std::array<std::uint64_t, kInline> inline_;  // read only where push() wrote: no fill per call
  std::vector<std::uint64_t> deep_;
  std::uint32_t size_ = 0;
};

}  // namespace

// Walks the body by the msgpack spec without building anything, refusing deep or huge
// structures before reading on (a 5-byte array header can announce 4 billion elements).
// Hand-written because it runs twice per control message (send() and receive): msgpack-c's
// parser with a counting visitor allocated its stack on every call and took ~0.5 us per 64-byte
// body, a few percent of a loopback round trip. tests/transport/control check it against that
// parser on generated and fuzzed bodies.
bool is_valid_msgpack_body(std::span<const std::byte> body, const frame_limits& limits) noexcept {
  if (body.empty()) return false;
  const auto* p = reinterpret_cast<const std::uint8_t*>(body.data());
  const std::size_t n = body.size();
  std::size_t off = 0;
  std::uint64_t elements = 0;  // array items and map pairs announced so far
  std::uint64_t top_level = 1;  // exactly one object at the top
  try {
    pending_stack open;
    for (;;) {
      std::uint64_t& left = open.empty() ? top_level : open.top();
      if (left == 0) {
        if (open.empty()) break;
        open.pop();  // this container is complete
        continue;
      }
      --left;
      if (off >= n) return false;
      const std::uint8_t b = p[off++];
      std::uint64_t skip = 0;       // payload bytes after the header
      std::size_t len_bytes = 0;    // bytes of a length field, then read into skip
      std::uint64_t extra = 0;      // payload bytes beyond the length (an ext's type)
      std::int64_t items = -1;      // >= 0: a container with this many array items / map pairs
      bool map = false;
      if (b <= 0x7f || b >= 0xe0) {
        // positive or negative fixint
      } else if (b <= 0x8f) {
        items = b & 0x0f;
        map = true;
      } else if (b <= 0x9f) {
        items = b & 0x0f;
      } else if (b <= 0xbf) {
        skip = b & 0x1f;  // fixstr
      } else {
        switch (b) {
          case 0xc0: case 0xc2: case 0xc3: break;                       // nil, false, true
          case 0xc4: case 0xd9: len_bytes = 1; break;                   // bin8, str8
          case 0xc5: case 0xda: len_bytes = 2; break;                   // bin16, str16
          case 0xc6: case 0xdb: len_bytes = 4; break;                   // bin32, str32
          case 0xc7: len_bytes = 1; extra = 1; break;                   // ext8
          case 0xc8: len_bytes = 2; extra = 1; break;                   // ext16
          case 0xc9: len_bytes = 4; extra = 1; break;                   // ext32
          case 0xca: skip = 4; break;                                   // float32
          case 0xcb: skip = 8; break;                                   // float64
          case 0xcc: case 0xd0: skip = 1; break;                        // (u)int8
          case 0xcd: case 0xd1: skip = 2; break;                        // (u)int16
          case 0xce: case 0xd2: skip = 4; break;                        // (u)int32
          case 0xcf: case 0xd3: skip = 8; break;                        // (u)int64
          case 0xd4: skip = 2; break;                                   // fixext1
          case 0xd5: skip = 3; break;                                   // fixext2
          case 0xd6: skip = 5; break;                                   // fixext4
          case 0xd7: skip = 9; break;                                   // fixext8
          case 0xd8: skip = 17; break;                                  // fixext16
          case 0xdc: case 0xde: case 0xdd: case 0xdf: {                 // array/map 16/32
            const std::size_t w = (b == 0xdc || b == 0xde) ? 2 : 4;
            if (n - off < w) return false;
            items = static_cast<std::int64_t>(get_be(p + off, w));
            off += w;
            map = b >= 0xde;
            break;
          }
          default: return false;  // 0xc1: never used
        }
      }
      if (len_bytes > 0) {
        if (n - off < len_bytes) return false;
        skip = get_be(p + off, len_bytes) + extra;
        off += len_bytes;
      }
      if (items >= 0) {
        if (open.size() + 1 > limits.max_body_depth) return false;
        elements += static_cast<std::uint64_t>(items);
        if (elements > limits.max_body_elements) return false;
        const std::uint64_t objects = static_cast<std::uint64_t>(items) * (map ? 2 : 1);
        if (objects > 0) open.push(objects);
      } else if (skip > n - off) {
        return false;
      } else {
        off += skip;
      }
    }
  } catch (const std::bad_alloc&) {
    return false;  // nesting beyond the inline levels, and no memory for more
  }
  return off == n;
}

namespace {

reject_reason fail(reject_reason why, std::string* detail, std::string message) {
  if (detail != nullptr) *detail = std::move(message);
  return why;
}

}  // namespace

std::string_view to_string(reject_reason r) noexcept {
  switch (r) {
    case reject_reason::none: return "none";
    case reject_reason::truncated: return "truncated";
    case reject_reason::oversized: return "oversized";
    case reject_reason::bad_magic: return "bad_magic";
    case reject_reason::bad_version: return "bad_version";
    case reject_reason::bad_header: return "bad_header";
    case reject_reason::unknown_type: return "unknown_type";
    case reject_reason::trailing_bytes: return "trailing_bytes";
    case reject_reason::bad_body: return "bad_body";
    case reject_reason::bad_parts: return "bad_parts";
    case reject_reason::sender_mismatch: return "sender_mismatch";
    case reject_reason::count_: break;
  }
  return "unknown";
}

bool is_valid_node_id(std::string_view id) noexcept {
  if (id.empty() || id.size() > kMaxNodeIdLen) return false;
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

result<std::string> encode_frame(const frame_header& header, std::span<const std::byte> body,
                                 const frame_limits& limits) {
  TESSERA_ASSERT(is_valid_node_id(header.sender), "invalid sender node id '{}'", header.sender);
  TESSERA_ASSERT(is_known_type(header.type), "unknown message type {}", header.type);
  const std::size_t size = kHeaderSize + header.sender.size() + body.size();
  if (body.size() > limits.max_body_size || size > limits.max_frame_size) {
    return make_error(errc::overloaded,
                      "control frame of type {} too large: body {} B, frame {} B (limits {} B, {} B)",
                      header.type, body.size(), size, limits.max_body_size, limits.max_frame_size);
  }
  std::string out(size, '\0');
  char* p = out.data();
  p[0] = 'T';
  p[1] = 'C';
  p[2] = static_cast<char>(header.version);
  p[3] = static_cast<char>(header.sender.size());
  put_le(p + 4, header.type, 2);
  put_le(p + 6, 0, 2);
  put_le(p + 8, body.size(), 4);
  put_le(p + 12, header.epoch, 8);
  put_le(p + 20, header.incarnation, 8);
  put_le(p + 28, header.seq, 8);
  std::memcpy(p + kHeaderSize, header.sender.data(), header.sender.size());
  if (!body.empty()) std::memcpy(p + kHeaderSize + header.sender.size(), body.data(), body.size());
  return out;
}

void patch_seq(std::string& frame, std::uint64_t seq) {
  TESSERA_ASSERT(frame.size() >= kHeaderSize, "patch_seq on a {}-byte frame", frame.size());
  put_le(frame.data() + 28, seq, 8);
}

reject_reason decode_frame(std::span<const std::byte> bytes, const frame_limits& limits,
                           frame_view& out, std::string* detail) {
  const std::size_t size = bytes.size();
  if (size > limits.max_frame_size) {
    return fail(reject_reason::oversized, detail,
                fmt::format("frame of {} B exceeds the limit of {} B", size, limits.max_frame_size));
  }
  if (size < 4) {
    return fail(reject_reason::truncated, detail, fmt::format("frame of {} B has no header", size));
  }
  const std::byte* p = bytes.data();
  if (p[0] != kMagic0 || p[1] != kMagic1) {
    return fail(reject_reason::bad_magic, detail, "frame does not start with the magic 'TC'");
  }
  const auto version = static_cast<std::uint8_t>(p[2]);
  if (version != kProtocolVersion) {
    return fail(reject_reason::bad_version, detail,
                fmt::format("protocol version {} (this node speaks {})", version, kProtocolVersion));
  }
  if (size < kHeaderSize) {
    return fail(reject_reason::truncated, detail,
                fmt::format("frame of {} B is shorter than the {}-byte header", size, kHeaderSize));
  }
  const std::size_t sender_len = static_cast<std::uint8_t>(p[3]);
  const auto type = static_cast<std::uint16_t>(get_le(p + 4, 2));
  const auto flags = get_le(p + 6, 2);
  const std::size_t body_len = get_le(p + 8, 4);
  if (flags != 0) {
    return fail(reject_reason::bad_header, detail, fmt::format("reserved flags 0x{:x} set", flags));
  }
  if (sender_len == 0 || sender_len > kMaxNodeIdLen) {
    return fail(reject_reason::bad_header, detail,
                fmt::format("sender id length {} outside 1..{}", sender_len, kMaxNodeIdLen));
  }
  if (body_len > limits.max_body_size) {
    return fail(reject_reason::oversized, detail,
                fmt::format("body of {} B exceeds the limit of {} B", body_len, limits.max_body_size));
  }
  const std::size_t declared = kHeaderSize + sender_len + body_len;
  if (size < declared) {
    return fail(reject_reason::truncated, detail,
                fmt::format("frame of {} B shorter than the {} B its header declares", size, declared));
  }
  if (size > declared) {
    return fail(reject_reason::trailing_bytes, detail,
                fmt::format("{} bytes after the declared end of the frame", size - declared));
  }
  std::string_view sender(reinterpret_cast<const char*>(p + kHeaderSize), sender_len);
  if (!is_valid_node_id(sender)) {
    return fail(reject_reason::bad_header, detail, "sender id has characters outside [A-Za-z0-9._-]");
  }
  if (!is_known_type(type)) {
    return fail(reject_reason::unknown_type, detail, fmt::format("unknown message type {}", type));
  }
  auto body = bytes.subspan(kHeaderSize + sender_len, body_len);
  if (!is_valid_msgpack_body(body, limits)) {
    return fail(reject_reason::bad_body, detail,
                fmt::format("body of {} B is not one msgpack object within the limits (depth {}, "
                            "{} elements)",
                            body_len, limits.max_body_depth, limits.max_body_elements));
  }
  out.header.version = version;
  out.header.type = type;
  out.header.epoch = get_le(p + 12, 8);
  out.header.incarnation = get_le(p + 20, 8);
  out.header.seq = get_le(p + 28, 8);
  out.header.sender = sender;
  out.body = body;
  return reject_reason::none;
}

result<frame_view> parse_frame(std::span<const std::byte> bytes, const frame_limits& limits) {
  frame_view view;
  std::string detail;
  auto why = decode_frame(bytes, limits, view, &detail);
  if (why == reject_reason::none) return view;
  return make_error(why == reject_reason::bad_version ? errc::unsupported : errc::corrupt,
                    "control frame rejected ({}): {}", to_string(why), detail);
}

}  // namespace tessera::transport::control
