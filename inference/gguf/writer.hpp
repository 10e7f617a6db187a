// GGUF v3 writer: metadata + tensors with alignment. Tensor bytes are either given up front or
// produced on demand by a fill callback while the file is written, so a multi-GiB model never has
// to sit in memory at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "actors/base/result.hpp"
#include "inference/gguf/gguf.hpp"

namespace tessera::inference::gguf {

class writer {
 public:
  /// Fills `out` (exactly the tensor's byte size) with the tensor's bytes.
  using fill_fn = std::function<result<void>(std::span<std::byte> out)>;

  /// Alignment of the data section and of every tensor (a power of two). Written as
  /// general.alignment when it differs from the default 32.
  explicit writer(std::uint32_t alignment = default_alignment);

  /// Sets (or replaces) a metadata key; file order is first-set order.
  void set(std::string key, value v);

  /// Adds a tensor whose bytes are copied now. Errors: duplicate name, bad dims, size mismatch.
  result<void> add_tensor(std::string name, tensor_type type, std::vector<std::uint64_t> dims,
                          std::span<const std::byte> bytes);
  /// Adds a tensor whose bytes `fill` produces during write().
  result<void> add_tensor(std::string name, tensor_type type, std::vector<std::uint64_t> dims,
                          fill_fn fill);

  /// Writes the file to `path` (via `path.tmp` + rename, so a failed write leaves no half file).
  result<void> write(const std::string& path) const;
  /// Serialises into memory (small files: tests, fuzz seeds).
  result<std::vector<std::byte>> to_bytes() const;

  [[nodiscard]] std::uint64_t tensor_count() const noexcept { return tensors_.size(); }

 private:
  struct pending {
    std::string name;
    tensor_type type;
    std::vector<std::uint64_t> dims;
    std::uint64_t size = 0;
    std::uint64_t rel_offset = 0;
    std::vector<std::byte> bytes;
    fill_fn fill;
  };
  result<pending*> add_common(std::string name, tensor_type type, std::vector<std::uint64_t> dims);
  std::vector<std::byte> header() const;
  result<void> emit(const std::function<result<void>(std::span<const std::byte>)>& sink) const;

  std::uint32_t alignment_;
  std::vector<std::pair<std::string, value>> kv_;
  std::vector<pending> tensors_;
  std::uint64_t data_size_ = 0;
};

}  // namespace tessera::inference::gguf
