// GGUF v3 model files: types, metadata values, tensor infos, and the validating reader.
//
// Layout of a GGUF file (little-endian):
//   "GGUF" u32 version u64 tensor_count u64 metadata_kv_count
//   metadata_kv_count x { string key, u32 value_type, value }
//   tensor_count x { string name, u32 n_dims, u64 dims[n_dims], u32 ggml_type, u64 offset }
//   padding to `general.alignment` (default 32)
//   data section: each tensor at data_start + offset (offset a multiple of the alignment)
// A string is u64 length + bytes (no NUL). An array is u32 element type + u64 count + elements.
// dims[0] is the innermost (row) length: a weight with dims {in, out} is row-major [out][in].
//
// The reader never trusts the file: every count, length, dimension and offset is bounded and checked
// (limits below), and any failure is a result<> error that names the file, the tensor or key, and
// the problem. It never reads outside the file and never allocates more than the file could hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "actors/base/result.hpp"
#include "inference/kernels/quant.hpp"

namespace tessera::inference::gguf {

inline constexpr std::uint32_t magic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr std::uint32_t default_alignment = 32;

/// Metadata value types (wire numbers of the GGUF spec).
enum class value_type : std::uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8,
  array = 9, u64 = 10, i64 = 11, f64 = 12,
};
std::string_view to_string(value_type t) noexcept;

/// On-disk geometry of a supported tensor type (the GGUF/GGML block layouts): `block_elems`
/// elements stored in `block_bytes` bytes. The parser keeps its own table rather than calling the
/// kernels so that it stands alone (the fuzz target builds it with clang); a unit test checks that
/// it agrees with inference/kernels/quant.hpp.
struct type_geometry {
  std::string_view name;
  std::uint32_t block_elems = 0;
  std::uint32_t block_bytes = 0;
};
/// Geometry of a supported GGML type id; nullopt for every other id.
std::optional<type_geometry> geometry_of(std::uint32_t ggml_type_id) noexcept;
inline type_geometry geometry(tensor_type t) noexcept {
  return *geometry_of(static_cast<std::uint32_t>(t));
}
/// Bytes of `elems` elements of `t`; error unless elems is a multiple of the block size.
result<std::uint64_t> bytes_of(tensor_type t, std::uint64_t elems);

/// Name of any GGML type id, supported or not ("q5_K", "iq2_xs", ... or "type 99").
std::string ggml_type_name(std::uint32_t ggml_type_id);
/// Parses "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k"/"q4_K", "q6_k"/"q6_K".
result<tensor_type> parse_tensor_type(std::string_view name);

struct value;

/// A metadata array: element type plus the elements, stored by kind (integers widened).
struct array {
  value_type elem_type = value_type::u8;
  std::vector<std::uint64_t> uints;      ///< u8, u16, u32, u64
  std::vector<std::int64_t> ints;        ///< i8, i16, i32, i64
  std::vector<double> floats;            ///< f32, f64
  std::vector<bool> bools;               ///< boolean
  std::vector<std::string> strings;      ///< string
  std::vector<value> arrays;             ///< array (arrays of arrays)
  [[nodiscard]] std::size_t size() const noexcept;
};

/// One metadata value with its exact wire type (so a written file reads back identically).
struct value {
  value_type type = value_type::u32;
  std::variant<std::uint64_t, std::int64_t, double, bool, std::string, array> data;

  static value u8(std::uint8_t v) { return {value_type::u8, std::uint64_t{v}}; }
  static value u32(std::uint32_t v) { return {value_type::u32, std::uint64_t{v}}; }
  static value u64(std::uint64_t v) { return {value_type::u64, v}; }
  static value i32(std::int32_t v) { return {value_type::i32, std::int64_t{v}}; }
  static value f32(float v) { return {value_type::f32, double{v}}; }
  static value f64(double v) { return {value_type::f64, v}; }
  static value boolean(bool v) { return {value_type::boolean, v}; }
  static value str(std::string v) { return {value_type::string, std::move(v)}; }
  static value arr(array a) { return {value_type::array, std::move(a)}; }
};

/// Helpers to build typed arrays for the writer.
array string_array(std::vector<std::string> items);
array f32_array(std::vector<float> items);
array i32_array(std::vector<std::int32_t> items);

/// Explicit bounds on everything a file declares. Values beyond them are rejected as corrupt.
struct limits {
  std::uint64_t max_tensors = 1u << 16;        ///< real models: a few hundred to a few thousand
  std::uint64_t max_metadata = 1u << 16;       ///< key/value pairs
  std::uint64_t max_key_bytes = 1u << 16;      ///< one metadata key
  std::uint64_t max_string_bytes = 64u << 20;  ///< one string value (chat templates are ~10 KB)
  std::uint64_t max_array_elems = 1u << 24;    ///< vocabularies are up to ~256K entries
  std::uint32_t max_array_depth = 4;           ///< arrays of arrays
  std::uint32_t max_dims = 4;                  ///< GGML_MAX_DIMS
  std::uint64_t max_name_bytes = 64;           ///< GGML_MAX_NAME (including room for NUL)
  std::uint32_t max_alignment = 1u << 20;
};

/// Where tensor bytes live once a file is open.
enum class load_mode {
  mmap,           ///< map the file; pages fault in on first touch (may be reclaimed by the kernel)
  mmap_populate,  ///< map with MAP_POPULATE + MADV_WILLNEED: pre-faulted, still reclaimable
  mmap_locked,    ///< map, populate and mlock: resident for the life of the file
  anonymous,      ///< pread the whole data section into anonymous memory (never paged out to file)
  headers_only,   ///< parse the header by pread only; tensor bytes are fetched with read_rows()
};
std::string_view to_string(load_mode m) noexcept;
result<load_mode> parse_load_mode(std::string_view name);

/// One tensor as the file describes it, validated.
struct tensor_info {
  std::string name;
  tensor_type type = tensor_type::f32;
  std::vector<std::uint64_t> dims;  ///< dims[0] = row length (innermost)
  std::uint64_t offset = 0;         ///< absolute byte offset in the file
  std::uint64_t size = 0;           ///< bytes
  std::uint64_t elements = 0;

  [[nodiscard]] std::uint64_t row_elems() const noexcept { return dims.empty() ? 0 : dims[0]; }
  [[nodiscard]] std::uint64_t rows() const noexcept {
    return dims.empty() || dims[0] == 0 ? 0 : elements / dims[0];
  }
  [[nodiscard]] std::uint64_t row_size() const noexcept { return rows() ? size / rows() : 0; }
};

/// A byte range of a file.
struct byte_range {
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
};

struct open_options {
  load_mode mode = load_mode::mmap;
  limits lim{};
};

/// Rows of a tensor read into anonymous memory (64-byte aligned).
class tensor_buffer {
 public:
  tensor_buffer() = default;
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data_.get(), size_}; }
  [[nodiscard]] std::span<std::byte> bytes() noexcept { return {data_.get(), size_}; }
  [[nodiscard]] std::uint64_t first_row() const noexcept { return first_row_; }
  [[nodiscard]] std::uint64_t row_count() const noexcept { return row_count_; }

 private:
  friend class file;
  struct free_aligned {
    void operator()(std::byte* p) const noexcept;
  };
  std::unique_ptr<std::byte, free_aligned> data_;
  std::size_t size_ = 0;
  std::uint64_t first_row_ = 0;
  std::uint64_t row_count_ = 0;
};

/// An open, validated GGUF file. Move-only; the mapping (if any) lives as long as the object.
class file {
 public:
  /// Opens and validates `path`. Errors: io (open/mmap/read/mlock), corrupt (any bound or
  /// consistency check), unsupported (version, tensor type). Messages start with the file name.
  static result<file> open(const std::string& path, const open_options& opts = {});
  /// Validates an in-memory image (copied). `name` prefixes error messages. For tests and fuzzing.
  static result<file> parse(std::span<const std::byte> bytes, std::string name,
                            const limits& lim = {});

  file(file&&) noexcept;
  file& operator=(file&&) noexcept;
  file(const file&) = delete;
  file& operator=(const file&) = delete;
  ~file();

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] std::uint32_t version() const noexcept { return version_; }
  [[nodiscard]] std::uint32_t alignment() const noexcept { return alignment_; }
  [[nodiscard]] std::uint64_t data_offset() const noexcept { return data_offset_; }
  [[nodiscard]] std::uint64_t file_size() const noexcept { return file_size_; }
  [[nodiscard]] load_mode mode() const noexcept { return mode_; }

  /// Metadata in file order.
  [[nodiscard]] const std::vector<std::pair<std::string, value>>& metadata() const noexcept {
    return kv_;
  }
  [[nodiscard]] const value* find_value(std::string_view key) const;
  /// Typed getters. Errors name the file and key: not_found (missing) or invalid_argument (wrong
  /// type / negative / out of range). get_uint accepts any integer type holding a value >= 0.
  [[nodiscard]] result<std::uint64_t> get_uint(std::string_view key) const;
  [[nodiscard]] result<std::int64_t> get_int(std::string_view key) const;
  [[nodiscard]] result<double> get_float(std::string_view key) const;  ///< f32/f64
  [[nodiscard]] result<bool> get_bool(std::string_view key) const;
  [[nodiscard]] result<std::string_view> get_string(std::string_view key) const;
  [[nodiscard]] result<const array*> get_array(std::string_view key, value_type elem) const;

  /// Tensors in file order.
  [[nodiscard]] const std::vector<tensor_info>& tensors() const noexcept { return tensors_; }
  /// Tensor by name, nullptr if absent.
  [[nodiscard]] const tensor_info* find_tensor(std::string_view name) const;
  /// Tensor by name, not_found error naming the file and tensor if absent.
  [[nodiscard]] result<const tensor_info*> tensor(std::string_view name) const;

  /// The file byte range holding rows [first_row, first_row + rows) of `t`.
  [[nodiscard]] result<byte_range> row_range(const tensor_info& t, std::uint64_t first_row,
                                             std::uint64_t rows) const;
  /// The tensor's bytes in memory (mapped or anonymous). Error in headers_only mode.
  [[nodiscard]] result<std::span<const std::byte>> data(const tensor_info& t) const;
  /// Reads rows [first_row, first_row + rows) of `t` into fresh anonymous memory with pread, touching
  /// no other part of the file. Works in every mode (in memory modes it copies).
  [[nodiscard]] result<tensor_buffer> read_rows(const tensor_info& t, std::uint64_t first_row,
                                                std::uint64_t rows) const;

 private:
  file() = default;
  result<void> read_at(std::uint64_t offset, std::byte* dst, std::size_t n) const;
  void release() noexcept;

  std::string name_;
  int fd_ = -1;  // kept open for read_rows() in every mode but parse()
  load_mode mode_ = load_mode::mmap;
  // Bytes held in memory: the whole-file mapping (mmap modes, base 0), the anonymous data section
  // (anonymous mode, base data_offset_) or the copied image (parse(), base 0).
  std::byte* mem_ = nullptr;
  std::size_t mem_size_ = 0;
  std::uint64_t mem_base_ = 0;
  bool mem_mapped_ = false;  // munmap (true) or free (false)
  bool locked_ = false;
  std::uint32_t version_ = 0;
  std::uint32_t alignment_ = default_alignment;
  std::uint64_t data_offset_ = 0;
  std::uint64_t file_size_ = 0;
  std::vector<std::pair<std::string, value>> kv_;
  std::unordered_map<std::string, std::size_t> kv_index_;
  std::vector<tensor_info> tensors_;
  std::unordered_map<std::string, std::size_t> tensor_index_;

  friend struct parser_access;
};

/// "91 MiB", "3.5 KiB", "12 B": sizes in error messages.
std::string human_bytes(std::uint64_t n);

}  // namespace tessera::inference::gguf
