#include "inference/gguf/writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string.h>

namespace tessera::inference::gguf {

namespace {

class bytes_out {
 public:
  std::vector<std::byte> buf;
  template <class T>
  void put(T v) {
    auto old = buf.size();
    buf.resize(old + sizeof v);
    std::memcpy(buf.data() + old, &v, sizeof v);
  }
  void str(std::string_view s) {
    put<std::uint64_t>(s.size());
    auto old = buf.size();
    buf.resize(old + s.size());
    if (!s.empty()) std::memcpy(buf.data() + old, s.data(), s.size());
  }
};

void put_scalar(bytes_out& o, value_type t, const value& v);

void put_array(bytes_out& o, const array& a) {
  o.put<std::uint32_t>(static_cast<std::uint32_t>(a.elem_type));
  o.put<std::uint64_t>(a.size());
  auto put_u = [&](std::uint64_t x) { put_scalar(o, a.elem_type, value{a.elem_type, x}); };
  auto put_i = [&](std::int64_t x) { put_scalar(o, a.elem_type, value{a.elem_type, x}); };
  for (auto x : a.uints) put_u(x);
  for (auto x : a.ints) put_i(x);
  for (auto x : a.floats) put_scalar(o, a.elem_type, value{a.elem_type, x});
  for (bool x : a.bools) o.put<std::uint8_t>(x ? 1 : 0);
  for (const auto& s : a.strings) o.str(s);
  for (const auto& v : a.arrays) put_array(o, std::get<array>(v.data));
}

void put_scalar(bytes_out& o, value_type t, const value& v) {
  auto u = [&] { return std::holds_alternative<std::uint64_t>(v.data) ? std::get<std::uint64_t>(v.data)
                                                                    : static_cast<std::uint64_t>(std::get<std::int64_t>(v.data)); };
  switch (t) {
    case value_type::u8: o.put(static_cast<std::uint8_t>(u())); break;
    case value_type::i8: o.put(static_cast<std::int8_t>(u())); break;
    case value_type::u16: o.put(static_cast<std::uint16_t>(u())); break;
    case value_type::i16: o.put(static_cast<std::int16_t>(u())); break;
    case value_type::u32: o.put(static_cast<std::uint32_t>(u())); break;
    case value_type::i32: o.put(static_cast<std::int32_t>(u())); break;
    case value_type::u64: o.put(static_cast<std::uint64_t>(u())); break;
    case value_type::i64: o.put(static_cast<std::int64_t>(u())); break;
    case value_type::f32: o.put(static_cast<float>(std::get<double>(v.data))); break;
    case value_type::f64: o.put(std::get<double>(v.data)); break;
    case value_type::boolean: o.put<std::uint8_t>(std::get<bool>(v.data) ? 1 : 0); break;
    case value_type::string: o.str(std::get<std::string>(v.data)); break;
    case value_type::array: put_array(o, std::get<array>(v.data)); break;
  }
}

std::uint64_t align_up(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

writer::writer(std::uint32_t alignment) : alignment_(alignment) {
  TESSERA_ASSERT(alignment != 0 && (alignment & (alignment - 1)) == 0,
                 "alignment {} is not a power of two", alignment);
  if (alignment != default_alignment) set("general.alignment", value::u32(alignment));
}

void writer::set(std::string key, value v) {
  for (auto& [k, old] : kv_) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  kv_.emplace_back(std::move(key), std::move(v));
}

result<writer::pending*> writer::add_common(std::string name, tensor_type type,
                                            std::vector<std::uint64_t> dims) {
  if (name.empty() || name.size() >= 64)
    return make_error(errc::invalid_argument, "tensor name '{}' must be 1..63 bytes", name);
  for (const auto& t : tensors_) {
    if (t.name == name) return make_error(errc::invalid_argument, "duplicate tensor name {}", name);
  }
  if (dims.empty() || dims.size() > 4)
    return make_error(errc::invalid_argument, "tensor {} has {} dimensions (must be 1..4)", name,
                      dims.size());
  std::uint64_t elems = 1;
  for (auto d : dims) {
    if (d == 0 || __builtin_mul_overflow(elems, d, &elems))
      return make_error(errc::invalid_argument, "tensor {} has a zero or overflowing dimension", name);
  }
  if (elems > (std::uint64_t{1} << 56))
    return make_error(errc::invalid_argument, "tensor {} has {} elements (too many)", name, elems);
  auto rb = bytes_of(type, dims[0]);
  if (!rb) return make_error(errc::invalid_argument, "tensor {}: {}", name, rb.error().message);
  pending p;
  p.name = std::move(name);
  p.type = type;
  p.dims = std::move(dims);
  p.size = *rb * (elems / p.dims[0]);
  p.rel_offset = data_size_;
  data_size_ = align_up(data_size_ + p.size, alignment_);
  tensors_.push_back(std::move(p));
  return &tensors_.back();
}

result<void> writer::add_tensor(std::string name, tensor_type type, std::vector<std::uint64_t> dims,
                                std::span<const std::byte> bytes) {
  auto p = add_common(std::move(name), type, std::move(dims));
  if (!p) return std::move(p).error();
  if ((*p)->size != bytes.size()) {
    auto err = make_error(errc::invalid_argument, "tensor {}: {} bytes given, {} expected",
                          (*p)->name, bytes.size(), (*p)->size);
    data_size_ = (*p)->rel_offset;
    tensors_.pop_back();
    return err;
  }
  (*p)->bytes.assign(bytes.begin(), bytes.end());
  return ok();
}

result<void> writer::add_tensor(std::string name, tensor_type type, std::vector<std::uint64_t> dims,
                                fill_fn fill) {
  auto p = add_common(std::move(name), type, std::move(dims));
  if (!p) return std::move(p).error();
  (*p)->fill = std::move(fill);
  return ok();
}

std::vector<std::byte> writer::header() const {
  bytes_out o;
  o.put<std::uint32_t>(magic);
  o.put<std::uint32_t>(3);
  o.put<std::uint64_t>(tensors_.size());
  o.put<std::uint64_t>(kv_.size());
  for (const auto& [k, v] : kv_) {
    o.str(k);
    o.put<std::uint32_t>(static_cast<std::uint32_t>(v.type));
    put_scalar(o, v.type, v);
  }
  for (const auto& t : tensors_) {
    o.str(t.name);
    o.put<std::uint32_t>(static_cast<std::uint32_t>(t.dims.size()));
    for (auto d : t.dims) o.put<std::uint64_t>(d);
    o.put<std::uint32_t>(static_cast<std::uint32_t>(t.type));
    o.put<std::uint64_t>(t.rel_offset);
  }
  o.buf.resize(align_up(o.buf.size(), alignment_), std::byte{0});
  return std::move(o.buf);
}

result<void> writer::emit(const std::function<result<void>(std::span<const std::byte>)>& sink) const {
  auto h = header();
  TESSERA_TRY(sink(h));
  std::vector<std::byte> scratch;
  std::uint64_t pos = 0;
  static const std::byte zeros[4096] = {};
  for (const auto& t : tensors_) {
    while (pos < t.rel_offset) {
      auto n = std::min<std::uint64_t>(t.rel_offset - pos, sizeof zeros);
      TESSERA_TRY(sink(std::span<const std::byte>(zeros, static_cast<std::size_t>(n))));
      pos += n;
    }
    if (t.fill) {
      scratch.assign(static_cast<std::size_t>(t.size), std::byte{0});
      auto r = t.fill(scratch);
      if (!r) return make_error(r.error().code, "tensor {}: {}", t.name, r.error().message);
      TESSERA_TRY(sink(scratch));
    } else {
      TESSERA_TRY(sink(t.bytes));
    }
    pos += t.size;
  }
  while (pos < data_size_) {
    auto n = std::min<std::uint64_t>(data_size_ - pos, sizeof zeros);
    TESSERA_TRY(sink(std::span<const std::byte>(zeros, static_cast<std::size_t>(n))));
    pos += n;
  }
  return ok();
}

result<std::vector<std::byte>> writer::to_bytes() const {
  std::vector<std::byte> out;
  auto r = emit([&](std::span<const std::byte> s) -> result<void> {
    out.insert(out.end(), s.begin(), s.end());
    return ok();
  });
  if (!r) return std::move(r).error();
  return out;
}

result<void> writer::write(const std::string& path) const {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    char buf[128];
    return make_error(errc::io, "{}: cannot create: {}", tmp, strerror_r(errno, buf, sizeof buf));
  }
  auto r = emit([&](std::span<const std::byte> s) -> result<void> {
    const std::byte* p = s.data();
    std::size_t n = s.size();
    while (n > 0) {
      ssize_t w = ::write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        char buf[128];
        return make_error(errc::io, "{}: write failed: {}", tmp, strerror_r(errno, buf, sizeof buf));
      }
      p += w;
      n -= static_cast<std::size_t>(w);
    }
    return ok();
  });
  if (::close(fd) != 0 && r) {
    char buf[128];
    r = make_error(errc::io, "{}: close failed: {}", tmp, strerror_r(errno, buf, sizeof buf));
  }
  if (!r) {
    ::unlink(tmp.c_str());
    return r;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    char buf[128];
    auto err = make_error(errc::io, "{}: cannot rename to {}: {}", tmp, path,
                          strerror_r(errno, buf, sizeof buf));
    ::unlink(tmp.c_str());
    return err;
  }
  return ok();
}

}  // namespace tessera::inference::gguf
