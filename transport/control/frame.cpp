#include "transport/control/frame.hpp"

#include <cstring>
#include <exception>

#include <msgpack.hpp>

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

// Walks the msgpack body without building objects, refusing deep or huge structures before the
// parser reserves anything for them (a 5-byte array header can announce 4 billion elements).
class bounded_visitor : public msgpack::null_visitor {
 public:
  explicit bounded_visitor(const frame_limits& limits) : limits_(limits) {}
  bool start_array(std::uint32_t n) { return enter(n); }
  bool end_array() { return leave(); }
  bool start_map(std::uint32_t n) { return enter(n); }
  bool end_map() { return leave(); }

 private:
  bool enter(std::uint32_t n) {
    if (++depth_ > limits_.max_body_depth) return false;
    elements_ += n;
    return elements_ <= limits_.max_body_elements;
  }
  bool leave() {
    --depth_;
    return true;
  }
  const frame_limits& limits_;
  std::uint32_t depth_ = 0;
  std::uint64_t elements_ = 0;
};

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

bool is_valid_msgpack_body(std::span<const std::byte> body, const frame_limits& limits) noexcept {
  if (body.empty()) return false;
  try {
    bounded_visitor v(limits);
    std::size_t off = 0;
    auto ret = msgpack::detail::parse_imp(reinterpret_cast<const char*>(body.data()), body.size(),
                                          off, v);
    return ret == msgpack::PARSE_SUCCESS && off == body.size();
  } catch (const std::exception&) {
    // msgpack throws on size overflows and allocation failure: both mean "not a valid body".
    return false;
  }
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
