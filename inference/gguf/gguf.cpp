#include "inference/gguf/gguf.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string.h>

namespace tessera::inference::gguf {

namespace {

constexpr std::size_t window_bytes = 1u << 20;

std::string errno_text(int e) {
  char buf[128];
  // GNU strerror_r returns the message pointer (which may or may not be buf).
  return std::string(strerror_r(e, buf, sizeof buf));
}

// Where the parser gets bytes: an in-memory image or a file read with buffered pread.
class source {
 public:
  source(std::span<const std::byte> mem) : mem_(mem), size_(mem.size()) {}
  source(int fd, std::uint64_t size) : fd_(fd), size_(size), window_(new std::byte[window_bytes]) {}

  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }

  // Copies [off, off+n) to dst; false (errno set for io) if it is not all inside the file.
  result<bool> read(std::uint64_t off, void* dst, std::size_t n) {
    if (off > size_ || n > size_ - off) return false;
    if (fd_ < 0) {
      if (n) std::memcpy(dst, mem_.data() + off, n);
      return true;
    }
    if (n > window_bytes / 2) return pread_all(off, static_cast<std::byte*>(dst), n);
    if (!(off >= win_off_ && off + n <= win_off_ + win_len_)) {
      std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(window_bytes, size_ - off));
      auto r = pread_all(off, window_.get(), len);
      if (!r) return r;
      win_off_ = off;
      win_len_ = len;
    }
    std::memcpy(dst, window_.get() + (off - win_off_), n);
    return true;
  }

  int io_errno = 0;

 private:
  result<bool> pread_all(std::uint64_t off, std::byte* dst, std::size_t n) {
    while (n > 0) {
      ssize_t got = ::pread(fd_, dst, n, static_cast<off_t>(off));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return make_error(errc::io, "pread at offset {}: {}", off, errno_text(errno));
      if (got == 0) return false;  // the file shrank under us
      dst += got;
      off += static_cast<std::uint64_t>(got);
      n -= static_cast<std::size_t>(got);
    }
    return true;
  }

  std::span<const std::byte> mem_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
  std::unique_ptr<std::byte[]> window_;
  std::uint64_t win_off_ = 0;
  std::size_t win_len_ = 0;
};

// Sequential reader over a source; every error names the file and what was being read.
class cursor {
 public:
  cursor(source& src, const std::string& name, const limits& lim)
      : src_(src), name_(name), lim_(lim) {}

  std::uint64_t pos = 0;

  [[nodiscard]] std::uint64_t remaining() const { return src_.size() - pos; }

  template <class T>
  result<T> scalar(std::string_view what) {
    T v{};
    auto r = src_.read(pos, &v, sizeof v);
    if (!r) return make_error(r.error().code, "{}: {}", name_, r.error().message);
    if (!*r) return truncated(what);
    pos += sizeof v;
    return v;
  }

  result<std::string> string(std::string_view what, std::uint64_t max_len) {
    auto len = scalar<std::uint64_t>(what);
    if (!len) return std::move(len).error();
    if (*len > max_len)
      return make_error(errc::corrupt, "{}: {} has absurd length {} (limit {}) at offset {}", name_,
                        what, *len, max_len, pos - 8);
    if (*len > remaining()) return truncated(what);
    std::string s(static_cast<std::size_t>(*len), '\0');
    auto r = src_.read(pos, s.data(), s.size());
    if (!r) return make_error(r.error().code, "{}: {}", name_, r.error().message);
    if (!*r) return truncated(what);
    pos += *len;
    return s;
  }

  error truncated(std::string_view what) const {
    return make_error(errc::corrupt, "{}: file truncated while reading {} at offset {} (file {})",
                      name_, what, pos, human_bytes(src_.size()));
  }

  const std::string& name() const { return name_; }
  const limits& lim() const { return lim_; }

 private:
  source& src_;
  const std::string& name_;
  const limits& lim_;
};

std::uint64_t min_wire_bytes(value_type t) {
  switch (t) {
    case value_type::u8: case value_type::i8: case value_type::boolean: return 1;
    case value_type::u16: case value_type::i16: return 2;
    case value_type::u32: case value_type::i32: case value_type::f32: return 4;
    case value_type::u64: case value_type::i64: case value_type::f64: return 8;
    case value_type::string: return 8;
    case value_type::array: return 12;
  }
  return 1;
}

bool valid_value_type(std::uint32_t t) { return t <= 12; }

result<value> read_value(cursor& c, value_type t, const std::string& key, std::uint32_t depth);

template <class T>
result<value> read_scalar_as(cursor& c, value_type t, const std::string& key) {
  auto v = c.scalar<T>(fmt::format("value of metadata key {}", key));
  if (!v) return std::move(v).error();
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return value{t, static_cast<double>(*v)};
  } else if constexpr (std::is_signed_v<T>) {
    return value{t, static_cast<std::int64_t>(*v)};
  } else {
    return value{t, static_cast<std::uint64_t>(*v)};
  }
}

result<value> read_array(cursor& c, const std::string& key, std::uint32_t depth) {
  if (depth >= c.lim().max_array_depth)
    return make_error(errc::corrupt, "{}: metadata key {} nests arrays deeper than {}", c.name(),
                      key, c.lim().max_array_depth);
  auto et = c.scalar<std::uint32_t>(fmt::format("array type of metadata key {}", key));
  if (!et) return std::move(et).error();
  if (!valid_value_type(*et))
    return make_error(errc::corrupt, "{}: metadata key {} is an array of unknown type {}", c.name(),
                      key, *et);
  auto elem = static_cast<value_type>(*et);
  auto n = c.scalar<std::uint64_t>(fmt::format("array length of metadata key {}", key));
  if (!n) return std::move(n).error();
  if (*n > c.lim().max_array_elems)
    return make_error(errc::corrupt, "{}: metadata key {} has absurd array length {} (limit {})",
                      c.name(), key, *n, c.lim().max_array_elems);
  if (*n > c.remaining() / min_wire_bytes(elem))
    return c.truncated(fmt::format("array of metadata key {} ({} elements)", key, *n));
  array a;
  a.elem_type = elem;
  auto count = static_cast<std::size_t>(*n);
  switch (elem) {
    case value_type::u8: case value_type::u16: case value_type::u32: case value_type::u64:
      a.uints.reserve(count);
      break;
    case value_type::i8: case value_type::i16: case value_type::i32: case value_type::i64:
      a.ints.reserve(count);
      break;
    case value_type::f32: case value_type::f64: a.floats.reserve(count); break;
    case value_type::string: a.strings.reserve(count); break;
    case value_type::array: a.arrays.reserve(count); break;
    case value_type::boolean: a.bools.reserve(count); break;
  }
  for (std::size_t i = 0; i < count; ++i) {
    auto v = read_value(c, elem, key, depth + 1);
    if (!v) return std::move(v).error();
    switch (elem) {
      case value_type::u8: case value_type::u16: case value_type::u32: case value_type::u64:
        a.uints.push_back(std::get<std::uint64_t>(v->data));
        break;
      case value_type::i8: case value_type::i16: case value_type::i32: case value_type::i64:
        a.ints.push_back(std::get<std::int64_t>(v->data));
        break;
      case value_type::f32: case value_type::f64:
        a.floats.push_back(std::get<double>(v->data));
        break;
      case value_type::boolean: a.bools.push_back(std::get<bool>(v->data)); break;
      case value_type::string: a.strings.push_back(std::get<std::string>(std::move(v->data))); break;
      case value_type::array: a.arrays.push_back(std::move(*v)); break;
    }
  }
  return value{value_type::array, std::move(a)};
}

result<value> read_value(cursor& c, value_type t, const std::string& key, std::uint32_t depth) {
  switch (t) {
    case value_type::u8: return read_scalar_as<std::uint8_t>(c, t, key);
    case value_type::i8: return read_scalar_as<std::int8_t>(c, t, key);
    case value_type::u16: return read_scalar_as<std::uint16_t>(c, t, key);
    case value_type::i16: return read_scalar_as<std::int16_t>(c, t, key);
    case value_type::u32: return read_scalar_as<std::uint32_t>(c, t, key);
    case value_type::i32: return read_scalar_as<std::int32_t>(c, t, key);
    case value_type::u64: return read_scalar_as<std::uint64_t>(c, t, key);
    case value_type::i64: return read_scalar_as<std::int64_t>(c, t, key);
    case value_type::f32: return read_scalar_as<float>(c, t, key);
    case value_type::f64: return read_scalar_as<double>(c, t, key);
    case value_type::boolean: {
      auto b = c.scalar<std::uint8_t>(fmt::format("value of metadata key {}", key));
      if (!b) return std::move(b).error();
      if (*b > 1)
        return make_error(errc::corrupt, "{}: metadata key {} has boolean byte {} (must be 0 or 1)",
                          c.name(), key, *b);
      return value{t, *b == 1};
    }
    case value_type::string: {
      auto s = c.string(fmt::format("string value of metadata key {}", key), c.lim().max_string_bytes);
      if (!s) return std::move(s).error();
      return value{t, std::move(*s)};
    }
    case value_type::array: return read_array(c, key, depth);
  }
  return make_error(errc::corrupt, "{}: metadata key {} has unknown value type {}", c.name(), key,
                    static_cast<std::uint32_t>(t));
}

bool mul_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  return __builtin_mul_overflow(a, b, &out);
}

std::byte* alloc_aligned(std::size_t n) {
  std::size_t rounded = (std::max<std::size_t>(n, 1) + 63) / 64 * 64;
  return static_cast<std::byte*>(std::aligned_alloc(64, rounded));
}

constexpr std::string_view supported_types = "f32, f16, bf16, q8_0, q4_0, q4_K, q6_K";

}  // namespace

// ---------------------------------------------------------------------------------------------
// types

std::string_view to_string(value_type t) noexcept {
  switch (t) {
    case value_type::u8: return "u8";
    case value_type::i8: return "i8";
    case value_type::u16: return "u16";
    case value_type::i16: return "i16";
    case value_type::u32: return "u32";
    case value_type::i32: return "i32";
    case value_type::f32: return "f32";
    case value_type::boolean: return "bool";
    case value_type::string: return "string";
    case value_type::array: return "array";
    case value_type::u64: return "u64";
    case value_type::i64: return "i64";
    case value_type::f64: return "f64";
  }
  return "unknown";
}

std::optional<type_geometry> geometry_of(std::uint32_t id) noexcept {
  switch (id) {
    case 0: return type_geometry{"f32", 1, 4};
    case 1: return type_geometry{"f16", 1, 2};
    case 2: return type_geometry{"q4_0", 32, 18};    // fp16 d + 16 bytes of nibbles
    case 8: return type_geometry{"q8_0", 32, 34};    // fp16 d + 32 int8
    case 12: return type_geometry{"q4_K", 256, 144};  // fp16 d, dmin + 12 scale bytes + 128 nibbles
    case 14: return type_geometry{"q6_K", 256, 210};  // 128 ql + 64 qh + 16 int8 scales + fp16 d
    case 30: return type_geometry{"bf16", 1, 2};
    default: return std::nullopt;
  }
}

result<std::uint64_t> bytes_of(tensor_type t, std::uint64_t elems) {
  auto g = geometry(t);
  if (elems % g.block_elems != 0)
    return make_error(errc::invalid_argument, "{} elements are not a multiple of the {} block ({})",
                      elems, g.name, g.block_elems);
  return elems / g.block_elems * g.block_bytes;
}

std::string ggml_type_name(std::uint32_t id) {
  static constexpr std::string_view names[] = {
      "f32",  "f16",  "q4_0", "q4_1", "q4_2", "q4_3", "q5_0",    "q5_1",   "q8_0",   "q8_1",
      "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "q8_K", "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s",
      "iq4_nl", "iq3_s", "iq2_s", "iq4_xs", "i8", "i16", "i32", "i64", "f64", "iq1_m", "bf16"};
  if (id < std::size(names)) return std::string(names[id]);
  return fmt::format("type {}", id);
}

result<tensor_type> parse_tensor_type(std::string_view name) {
  std::string lower(name);
  for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (std::uint32_t id : {0u, 1u, 2u, 8u, 12u, 14u, 30u}) {
    auto t = static_cast<tensor_type>(id);
    std::string n(geometry(t).name);
    for (auto& ch : n) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (n == lower) return t;
  }
  return make_error(errc::invalid_argument, "unknown tensor type '{}' (supported: {})", name,
                    supported_types);
}

std::size_t array::size() const noexcept {
  return uints.size() + ints.size() + floats.size() + bools.size() + strings.size() + arrays.size();
}

array string_array(std::vector<std::string> items) {
  array a;
  a.elem_type = value_type::string;
  a.strings = std::move(items);
  return a;
}
array f32_array(std::vector<float> items) {
  array a;
  a.elem_type = value_type::f32;
  a.floats.assign(items.begin(), items.end());
  return a;
}
array i32_array(std::vector<std::int32_t> items) {
  array a;
  a.elem_type = value_type::i32;
  a.ints.assign(items.begin(), items.end());
  return a;
}

std::string_view to_string(load_mode m) noexcept {
  switch (m) {
    case load_mode::mmap: return "mmap";
    case load_mode::mmap_populate: return "mmap-populate";
    case load_mode::mmap_locked: return "mmap-locked";
    case load_mode::anonymous: return "anonymous";
    case load_mode::headers_only: return "headers-only";
  }
  return "unknown";
}

result<load_mode> parse_load_mode(std::string_view name) {
  for (auto m : {load_mode::mmap, load_mode::mmap_populate, load_mode::mmap_locked,
                 load_mode::anonymous, load_mode::headers_only}) {
    if (to_string(m) == name) return m;
  }
  return make_error(errc::invalid_argument,
                    "unknown load mode '{}' (mmap, mmap-populate, mmap-locked, anonymous, "
                    "headers-only)",
                    name);
}

std::string human_bytes(std::uint64_t n) {
  if (n < 1024) return fmt::format("{} B", n);
  static constexpr const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(n);
  int u = -1;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  if (v >= 100.0 || v == static_cast<double>(static_cast<std::uint64_t>(v)))
    return fmt::format("{:.0f} {}", v, units[u]);
  return fmt::format("{:.1f} {}", v, units[u]);
}

void tensor_buffer::free_aligned::operator()(std::byte* p) const noexcept { std::free(p); }

// ---------------------------------------------------------------------------------------------
// parsing

struct parser_access {
  static result<void> parse_header(file& f, source& src, const limits& lim) {
    cursor c(src, f.name_, lim);
    if (src.size() < 24)
      return make_error(errc::corrupt, "{}: file too small for a GGUF header ({} bytes, need 24)",
                        f.name_, src.size());
    auto mg = c.scalar<std::uint32_t>("magic");
    if (!mg) return std::move(mg).error();
    if (*mg != magic)
      return make_error(errc::corrupt, "{}: not a GGUF file (magic 0x{:08x}, expected \"GGUF\")",
                        f.name_, *mg);
    auto ver = c.scalar<std::uint32_t>("version");
    if (!ver) return std::move(ver).error();
    if (*ver != 3 && *ver != 2)
      return make_error(errc::unsupported, "{}: unsupported GGUF version {} (this reader reads 2 and 3)",
                        f.name_, *ver);
    f.version_ = *ver;
    auto n_tensors = c.scalar<std::uint64_t>("tensor count");
    if (!n_tensors) return std::move(n_tensors).error();
    auto n_kv = c.scalar<std::uint64_t>("metadata count");
    if (!n_kv) return std::move(n_kv).error();
    if (*n_tensors > lim.max_tensors)
      return make_error(errc::corrupt, "{}: absurd tensor count {} (limit {})", f.name_, *n_tensors,
                        lim.max_tensors);
    if (*n_kv > lim.max_metadata)
      return make_error(errc::corrupt, "{}: absurd metadata count {} (limit {})", f.name_, *n_kv,
                        lim.max_metadata);

    f.kv_.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(*n_kv, c.remaining() / 13)));
    for (std::uint64_t i = 0; i < *n_kv; ++i) {
      auto key = c.string(fmt::format("key of metadata entry {}", i), lim.max_key_bytes);
      if (!key) return std::move(key).error();
      auto t = c.scalar<std::uint32_t>(fmt::format("type of metadata key {}", *key));
      if (!t) return std::move(t).error();
      if (!valid_value_type(*t))
        return make_error(errc::corrupt, "{}: metadata key {} has unknown value type {}", f.name_,
                          *key, *t);
      auto v = read_value(c, static_cast<value_type>(*t), *key, 0);
      if (!v) return std::move(v).error();
      if (f.kv_index_.count(*key))
        return make_error(errc::corrupt, "{}: duplicate metadata key {}", f.name_, *key);
      f.kv_index_.emplace(*key, f.kv_.size());
      f.kv_.emplace_back(std::move(*key), std::move(*v));
    }

    if (const value* al = f.find_value("general.alignment")) {
      if (al->type != value_type::u32)
        return make_error(errc::corrupt, "{}: general.alignment has type {}, expected u32", f.name_,
                          to_string(al->type));
      auto a = std::get<std::uint64_t>(al->data);
      if (a == 0 || (a & (a - 1)) != 0 || a > lim.max_alignment)
        return make_error(errc::corrupt,
                          "{}: general.alignment {} is not a power of two in [1, {}]", f.name_, a,
                          lim.max_alignment);
      f.alignment_ = static_cast<std::uint32_t>(a);
    }

    struct raw {
      std::uint64_t rel_offset;
    };
    std::vector<raw> raws;
    f.tensors_.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(*n_tensors, c.remaining() / 24)));
    raws.reserve(f.tensors_.capacity());
    for (std::uint64_t i = 0; i < *n_tensors; ++i) {
      auto name = c.string(fmt::format("name of tensor {}", i), lim.max_name_bytes);
      if (!name) return std::move(name).error();
      if (name->size() >= lim.max_name_bytes)
        return make_error(errc::corrupt, "{}: tensor {} name is {} bytes (limit {})", f.name_, i,
                          name->size(), lim.max_name_bytes - 1);
      if (name->empty()) return make_error(errc::corrupt, "{}: tensor {} has an empty name", f.name_, i);
      const std::string& tn = *name;
      auto nd = c.scalar<std::uint32_t>(fmt::format("dimension count of tensor {}", tn));
      if (!nd) return std::move(nd).error();
      if (*nd == 0 || *nd > lim.max_dims)
        return make_error(errc::corrupt, "{}: tensor {} has {} dimensions (must be 1..{})", f.name_,
                          tn, *nd, lim.max_dims);
      tensor_info ti;
      ti.name = tn;
      std::uint64_t elems = 1;
      for (std::uint32_t d = 0; d < *nd; ++d) {
        auto dim = c.scalar<std::uint64_t>(fmt::format("dimensions of tensor {}", tn));
        if (!dim) return std::move(dim).error();
        if (*dim == 0)
          return make_error(errc::corrupt, "{}: tensor {} has dimension {} of size 0", f.name_, tn, d);
        if (mul_overflows(elems, *dim, elems) || elems > (std::uint64_t{1} << 56))
          return make_error(errc::corrupt, "{}: tensor {} element count overflows (dimension {} = {})",
                            f.name_, tn, d, *dim);
        ti.dims.push_back(*dim);
      }
      ti.elements = elems;
      auto ty = c.scalar<std::uint32_t>(fmt::format("type of tensor {}", tn));
      if (!ty) return std::move(ty).error();
      auto geo = geometry_of(*ty);
      if (!geo)
        return make_error(errc::unsupported,
                          "{}: tensor {} has type {} (ggml type {}), not supported (supported: {})",
                          f.name_, tn, ggml_type_name(*ty), *ty, supported_types);
      ti.type = static_cast<tensor_type>(*ty);
      const std::uint64_t be = geo->block_elems;
      if (ti.dims[0] % be != 0)
        return make_error(errc::corrupt,
                          "{}: tensor {} row length {} is not a multiple of the {} block size {}",
                          f.name_, tn, ti.dims[0], geo->name, be);
      ti.size = elems / be * geo->block_bytes;  // < 2^56 * 4: no overflow
      auto off = c.scalar<std::uint64_t>(fmt::format("offset of tensor {}", tn));
      if (!off) return std::move(off).error();
      if (f.tensor_index_.count(tn))
        return make_error(errc::corrupt, "{}: duplicate tensor name {}", f.name_, tn);
      f.tensor_index_.emplace(tn, f.tensors_.size());
      raws.push_back({*off});
      f.tensors_.push_back(std::move(ti));
    }

    std::uint64_t data = (c.pos + f.alignment_ - 1) / f.alignment_ * f.alignment_;
    f.data_offset_ = data;
    const std::uint64_t fsize = src.size();
    for (std::size_t i = 0; i < f.tensors_.size(); ++i) {
      auto& ti = f.tensors_[i];
      std::uint64_t rel = raws[i].rel_offset;
      if (rel % f.alignment_ != 0)
        return make_error(errc::corrupt, "{}: tensor {} offset {} is not a multiple of the alignment {}",
                          f.name_, ti.name, rel, f.alignment_);
      std::uint64_t abs = 0, end = 0;
      if (__builtin_add_overflow(data, rel, &abs) || __builtin_add_overflow(abs, ti.size, &end))
        return make_error(errc::corrupt, "{}: tensor {} offset {} overflows", f.name_, ti.name, rel);
      if (end > fsize)
        return make_error(errc::corrupt,
                          "{}: tensor {} extends past end of file (offset {}, size {}, file {})",
                          f.name_, ti.name, human_bytes(abs), human_bytes(ti.size),
                          human_bytes(fsize));
      ti.offset = abs;
    }
    std::vector<std::size_t> order(f.tensors_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return f.tensors_[a].offset < f.tensors_[b].offset;
    });
    for (std::size_t i = 1; i < order.size(); ++i) {
      const auto& a = f.tensors_[order[i - 1]];
      const auto& b = f.tensors_[order[i]];
      if (b.offset < a.offset + a.size)
        return make_error(errc::corrupt,
                          "{}: tensors {} and {} overlap (bytes {}..{} and {}..{})", f.name_,
                          a.name, b.name, a.offset, a.offset + a.size, b.offset, b.offset + b.size);
    }
    return ok();
  }
};

result<file> file::parse(std::span<const std::byte> bytes, std::string name, const limits& lim) {
  file f;
  f.name_ = std::move(name);
  f.file_size_ = bytes.size();
  source src(bytes);
  auto r = parser_access::parse_header(f, src, lim);
  if (!r) return std::move(r).error();
  f.mem_ = alloc_aligned(bytes.size());
  if (!f.mem_) return make_error(errc::io, "{}: out of memory for {}", f.name_, human_bytes(bytes.size()));
  if (!bytes.empty()) std::memcpy(f.mem_, bytes.data(), bytes.size());
  f.mem_size_ = bytes.size();
  f.mem_base_ = 0;
  f.mem_mapped_ = false;
  f.mode_ = load_mode::anonymous;
  return f;
}

result<file> file::open(const std::string& path, const open_options& opts) {
  file f;
  f.name_ = path;
  f.mode_ = opts.mode;
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd_ < 0) return make_error(errno == ENOENT ? errc::not_found : errc::io, "{}: cannot open: {}",
                                   path, errno_text(errno));
  struct stat st{};
  if (::fstat(f.fd_, &st) != 0)
    return make_error(errc::io, "{}: cannot stat: {}", path, errno_text(errno));
  if (!S_ISREG(st.st_mode)) return make_error(errc::invalid_argument, "{}: not a regular file", path);
  f.file_size_ = static_cast<std::uint64_t>(st.st_size);
  {
    source src(f.fd_, f.file_size_);
    auto r = parser_access::parse_header(f, src, opts.lim);
    if (!r) return std::move(r).error();
  }
  switch (opts.mode) {
    case load_mode::headers_only: break;
    case load_mode::mmap:
    case load_mode::mmap_populate:
    case load_mode::mmap_locked: {
      int flags = MAP_PRIVATE;
      if (opts.mode != load_mode::mmap) flags |= MAP_POPULATE;
      void* p = ::mmap(nullptr, static_cast<std::size_t>(f.file_size_), PROT_READ, flags, f.fd_, 0);
      if (p == MAP_FAILED)
        return make_error(errc::io, "{}: cannot mmap {}: {}", path, human_bytes(f.file_size_),
                          errno_text(errno));
      f.mem_ = static_cast<std::byte*>(p);
      f.mem_size_ = static_cast<std::size_t>(f.file_size_);
      f.mem_mapped_ = true;
      if (opts.mode != load_mode::mmap) ::madvise(p, f.mem_size_, MADV_WILLNEED);
      if (opts.mode == load_mode::mmap_locked) {
        if (::mlock(p, f.mem_size_) != 0)
          return make_error(errc::io, "{}: cannot mlock {}: {} (RLIMIT_MEMLOCK?)", path,
                            human_bytes(f.file_size_), errno_text(errno));
        f.locked_ = true;
      }
      break;
    }
    case load_mode::anonymous: {
      std::uint64_t n = f.file_size_ > f.data_offset_ ? f.file_size_ - f.data_offset_ : 0;
      void* p = ::mmap(nullptr, static_cast<std::size_t>(std::max<std::uint64_t>(n, 1)),
                       PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED)
        return make_error(errc::io, "{}: cannot allocate {} of anonymous memory: {}", path,
                          human_bytes(n), errno_text(errno));
      f.mem_ = static_cast<std::byte*>(p);
      f.mem_size_ = static_cast<std::size_t>(std::max<std::uint64_t>(n, 1));
      f.mem_mapped_ = true;
      f.mem_base_ = f.data_offset_;
      auto r = f.read_at(f.data_offset_, f.mem_, static_cast<std::size_t>(n));
      if (!r) return std::move(r).error();
      break;
    }
  }
  return f;
}

file::file(file&& o) noexcept { *this = std::move(o); }

file& file::operator=(file&& o) noexcept {
  if (this == &o) return *this;
  release();
  name_ = std::move(o.name_);
  fd_ = std::exchange(o.fd_, -1);
  mode_ = o.mode_;
  mem_ = std::exchange(o.mem_, nullptr);
  mem_size_ = std::exchange(o.mem_size_, 0);
  mem_base_ = o.mem_base_;
  mem_mapped_ = o.mem_mapped_;
  locked_ = std::exchange(o.locked_, false);
  version_ = o.version_;
  alignment_ = o.alignment_;
  data_offset_ = o.data_offset_;
  file_size_ = o.file_size_;
  kv_ = std::move(o.kv_);
  kv_index_ = std::move(o.kv_index_);
  tensors_ = std::move(o.tensors_);
  tensor_index_ = std::move(o.tensor_index_);
  return *this;
}

file::~file() { release(); }

void file::release() noexcept {
  if (mem_) {
    if (mem_mapped_) {
      if (locked_) ::munlock(mem_, mem_size_);
      ::munmap(mem_, mem_size_);
    } else {
      std::free(mem_);
    }
    mem_ = nullptr;
  }
  locked_ = false;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

result<void> file::read_at(std::uint64_t offset, std::byte* dst, std::size_t n) const {
  if (fd_ < 0) {  // parse(): the whole image is in memory
    if (mem_ && offset >= mem_base_ && offset - mem_base_ + n <= mem_size_) {
      std::memcpy(dst, mem_ + (offset - mem_base_), n);
      return ok();
    }
    return make_error(errc::invalid_argument, "{}: bytes {}..{} are not available", name_, offset,
                      offset + n);
  }
  while (n > 0) {
    ssize_t got = ::pread(fd_, dst, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return make_error(errc::io, "{}: pread at offset {}: {}", name_, offset, errno_text(errno));
    if (got == 0)
      return make_error(errc::corrupt, "{}: file shrank while reading offset {}", name_, offset);
    dst += got;
    offset += static_cast<std::uint64_t>(got);
    n -= static_cast<std::size_t>(got);
  }
  return ok();
}

// ---------------------------------------------------------------------------------------------
// lookups

const value* file::find_value(std::string_view key) const {
  auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

namespace {
error missing_key(const std::string& file, std::string_view key) {
  return make_error(errc::not_found, "{}: metadata key {} missing", file, key);
}
error wrong_type(const std::string& file, std::string_view key, value_type got, std::string_view want) {
  return make_error(errc::invalid_argument, "{}: metadata key {} has type {}, expected {}", file, key,
                    to_string(got), want);
}
}  // namespace

result<std::uint64_t> file::get_uint(std::string_view key) const {
  const value* v = find_value(key);
  if (!v) return missing_key(name_, key);
  if (auto* u = std::get_if<std::uint64_t>(&v->data)) return *u;
  if (auto* i = std::get_if<std::int64_t>(&v->data)) {
    if (*i < 0)
      return make_error(errc::invalid_argument, "{}: metadata key {} is negative ({})", name_, key, *i);
    return static_cast<std::uint64_t>(*i);
  }
  return wrong_type(name_, key, v->type, "an unsigned integer");
}

result<std::int64_t> file::get_int(std::string_view key) const {
  const value* v = find_value(key);
  if (!v) return missing_key(name_, key);
  if (auto* i = std::get_if<std::int64_t>(&v->data)) return *i;
  if (auto* u = std::get_if<std::uint64_t>(&v->data)) {
    if (*u > static_cast<std::uint64_t>(INT64_MAX))
      return make_error(errc::invalid_argument, "{}: metadata key {} is out of range ({})", name_,
                        key, *u);
    return static_cast<std::int64_t>(*u);
  }
  return wrong_type(name_, key, v->type, "an integer");
}

result<double> file::get_float(std::string_view key) const {
  const value* v = find_value(key);
  if (!v) return missing_key(name_, key);
  if (auto* d = std::get_if<double>(&v->data)) return *d;
  return wrong_type(name_, key, v->type, "f32 or f64");
}

result<bool> file::get_bool(std::string_view key) const {
  const value* v = find_value(key);
  if (!v) return missing_key(name_, key);
  if (auto* b = std::get_if<bool>(&v->data)) return *b;
  return wrong_type(name_, key, v->type, "bool");
}

result<std::string_view> file::get_string(std::string_view key) const {
  const value* v = find_value(key);
  if (!v) return missing_key(name_, key);
  if (auto* s = std::get_if<std::string>(&v->data)) return std::string_view(*s);
  return wrong_type(name_, key, v->type, "string");
}

result<const array*> file::get_array(std::string_view key, value_type elem) const {
  const value* v = find_value(key);
  if (!v) return missing_key(name_, key);
  auto* a = std::get_if<array>(&v->data);
  if (!a) return wrong_type(name_, key, v->type, fmt::format("array of {}", to_string(elem)));
  if (a->elem_type != elem)
    return make_error(errc::invalid_argument, "{}: metadata key {} is an array of {}, expected {}",
                      name_, key, to_string(a->elem_type), to_string(elem));
  return a;
}

const tensor_info* file::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

result<const tensor_info*> file::tensor(std::string_view name) const {
  const tensor_info* t = find_tensor(name);
  if (!t) return make_error(errc::not_found, "{}: tensor {} not found", name_, name);
  return t;
}

result<byte_range> file::row_range(const tensor_info& t, std::uint64_t first_row,
                                   std::uint64_t rows) const {
  std::uint64_t total = t.rows();
  if (first_row > total || rows > total - first_row)
    return make_error(errc::invalid_argument, "{}: tensor {} has {} rows; rows {}..{} requested",
                      name_, t.name, total, first_row, first_row + rows);
  std::uint64_t rs = t.row_size();
  return byte_range{t.offset + first_row * rs, rows * rs};
}

result<std::span<const std::byte>> file::data(const tensor_info& t) const {
  if (!mem_ || t.offset < mem_base_ || t.offset - mem_base_ + t.size > mem_size_)
    return make_error(errc::invalid_argument,
                      "{}: tensor {} is not in memory (load mode {}); use read_rows()", name_,
                      t.name, to_string(mode_));
  return std::span<const std::byte>(mem_ + (t.offset - mem_base_), static_cast<std::size_t>(t.size));
}

result<tensor_buffer> file::read_rows(const tensor_info& t, std::uint64_t first_row,
                                      std::uint64_t rows) const {
  auto range = row_range(t, first_row, rows);
  if (!range) return std::move(range).error();
  tensor_buffer buf;
  buf.data_.reset(alloc_aligned(static_cast<std::size_t>(range->size)));
  if (!buf.data_)
    return make_error(errc::io, "{}: out of memory reading {} of tensor {}", name_,
                      human_bytes(range->size), t.name);
  buf.size_ = static_cast<std::size_t>(range->size);
  buf.first_row_ = first_row;
  buf.row_count_ = rows;
  if (fd_ >= 0) {
    auto r = read_at(range->offset, buf.data_.get(), buf.size_);
    if (!r) return std::move(r).error();
  } else {
    auto span = data(t);
    if (!span) return std::move(span).error();
    std::memcpy(buf.data_.get(), span->data() + (range->offset - t.offset), buf.size_);
  }
  return buf;
}

}  // namespace tessera::inference::gguf
