// Large, long-lived buffers that the forward pass streams (the KV cache): one anonymous mapping
// with transparent huge pages requested, like the weights' arena.
//
// Why not std::vector: a context's cache is tens to hundreds of MB read front to back for every
// token. On 4 KiB pages its page tables alone are ~200 KB per 100 MB, and the weights streaming
// between two layers' attention evict them from the caches, so each new page cost a page walk from
// DRAM: large Q8_0 decode at depth 4096 spent 4.7 ms per token in attention inside the model
// against 3.1 ms for the same reads alone (bench/RESULTS.md, issue 35). The mapping is also
// zero-filled by the kernel and committed only as positions are written, so a context sized for a
// long n_ctx costs the memory of what it holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "actors/base/result.hpp"

namespace tessera::inference {

/// An anonymous, zero-filled mapping of `bytes` (rounded up to 2 MiB), huge pages requested.
class page_buffer {
 public:
  page_buffer() = default;
  static result<page_buffer> create(std::size_t bytes);
  ~page_buffer();
  page_buffer(page_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  page_buffer& operator=(page_buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  page_buffer(const page_buffer&) = delete;
  page_buffer& operator=(const page_buffer&) = delete;

  [[nodiscard]] void* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

 private:
  void release() noexcept;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

/// n elements of a trivially copyable T in a page_buffer, zero-initialised.
template <class T>
class page_array {
 public:
  page_array() = default;
  static result<page_array> create(std::size_t n) {
    auto b = page_buffer::create(n * sizeof(T));
    if (!b) return b.error();
    page_array a;
    a.buf_ = std::move(*b);
    a.n_ = n;
    return a;
  }
  [[nodiscard]] T* data() noexcept { return static_cast<T*>(buf_.data()); }
  [[nodiscard]] const T* data() const noexcept { return static_cast<const T*>(buf_.data()); }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }

 private:
  page_buffer buf_;
  std::size_t n_ = 0;
};

}  // namespace tessera::inference
