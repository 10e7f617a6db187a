// result<T>: the error type of every fallible call that crosses a module boundary.
//
// GCC 12 has no std::expected in C++20 mode, so this is a small expected-shaped type. An error
// carries a code (for programs) and a message naming the thing that was wrong (for people), e.g.
// "model.gguf: tensor blk.3.attn_q.weight extends past end of file (offset 91 MiB, file 88 MiB)".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <fmt/format.h>

#include "actors/base/assert.hpp"

namespace tessera {

/// Error codes shared by all modules. Stable numbers: they travel in remote replies.
enum class errc : std::uint16_t {
  invalid_argument = 1,  ///< the caller passed something malformed or out of range
  not_found = 2,         ///< a named thing (actor, model, peer, file) does not exist
  timeout = 3,           ///< a deadline passed before an answer arrived
  closed = 4,            ///< the target stopped or the runtime is shutting down
  overloaded = 5,        ///< a bounded queue is full; try later
  corrupt = 6,           ///< bytes failed validation (frame, file, checksum)
  unsupported = 7,       ///< valid but not handled (version, tensor type, architecture)
  io = 8,                ///< the operating system refused (open, mmap, socket)
  protocol = 9,          ///< a peer broke the protocol
  unauthorized = 10,     ///< a peer or client lacks the cluster secret or token
  cancelled = 11,        ///< the work was abandoned on purpose
  internal = 12,         ///< a bug surfaced as an error instead of an abort (handler threw)
  no_capacity = 13,      ///< nobody can take this work now
};

std::string_view to_string(errc code) noexcept;

/// An error: a code and a message for a human.
struct error {
  errc code = errc::internal;
  std::string message;

  [[nodiscard]] std::string describe() const;
  bool operator==(const error&) const = default;
};

/// Builds an error with an fmt-formatted message.
template <class... Args>
[[nodiscard]] error make_error(errc code, fmt::format_string<Args...> format, Args&&... args) {
  return error{code, fmt::format(format, std::forward<Args>(args)...)};
}

/// Either a T or an error. Construct from a T (success) or from an `error` (failure).
template <class T>
class [[nodiscard]] result {
 public:
  using value_type = T;

  result(T value) : state_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit
  result(tessera::error err) : state_(std::in_place_index<1>, std::move(err)) {}  // NOLINT: implicit

  [[nodiscard]] bool has_value() const noexcept { return state_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  T& value() & {
    TESSERA_ASSERT(has_value(), "result::value() on an error: {}", std::get<1>(state_).describe());
    return std::get<0>(state_);
  }
  const T& value() const& {
    TESSERA_ASSERT(has_value(), "result::value() on an error: {}", std::get<1>(state_).describe());
    return std::get<0>(state_);
  }
  T&& value() && {
    TESSERA_ASSERT(has_value(), "result::value() on an error: {}", std::get<1>(state_).describe());
    return std::get<0>(std::move(state_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const tessera::error& error() const& {
    TESSERA_ASSERT(!has_value(), "result::error() on a value");
    return std::get<1>(state_);
  }
  tessera::error&& error() && {
    TESSERA_ASSERT(!has_value(), "result::error() on a value");
    return std::get<1>(std::move(state_));
  }

  template <class U>
  T value_or(U&& fallback) const& {
    return has_value() ? std::get<0>(state_) : static_cast<T>(std::forward<U>(fallback));
  }

 private:
  std::variant<T, tessera::error> state_;
};

/// result<void>: success carries nothing.
template <>
class [[nodiscard]] result<void> {
 public:
  result() = default;
  result(tessera::error err) : error_(std::move(err)), failed_(true) {}  // NOLINT: implicit

  [[nodiscard]] bool has_value() const noexcept { return !failed_; }
  explicit operator bool() const noexcept { return has_value(); }
  void value() const {
    TESSERA_ASSERT(has_value(), "result<void>::value() on an error: {}", error_.describe());
  }
  const tessera::error& error() const& {
    TESSERA_ASSERT(failed_, "result::error() on a value");
    return error_;
  }
  tessera::error&& error() && {
    TESSERA_ASSERT(failed_, "result::error() on a value");
    return std::move(error_);
  }

 private:
  tessera::error error_;
  bool failed_ = false;
};

/// Shorthand for a successful result<void>.
inline result<void> ok() { return {}; }

}  // namespace tessera

/// Evaluates `expr` (a result<T>); on error returns the error from the enclosing function.
#define TESSERA_TRY(expr)                                   \
  do {                                                      \
    auto&& tessera_try_r_ = (expr);                         \
    if (!tessera_try_r_) return std::move(tessera_try_r_).error(); \
  } while (0)

template <>
struct fmt::formatter<tessera::errc> : fmt::formatter<std::string_view> {
  auto format(tessera::errc code, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(tessera::to_string(code), ctx);
  }
};
