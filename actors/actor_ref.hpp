// actor_ref: a location-transparent handle to an actor, `(node_id, actor_id)` on the wire.
//
// A local ref also holds a counted pointer to the actor's cell so that a send is a push into the
// mailbox with no table lookup. A ref decoded from an envelope (or naming another node) has no
// cell; the system resolves it by id (local) or hands the message to its remote_router.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <utility>

#include <fmt/format.h>
#include <msgpack.hpp>

namespace tessera::actors {

using node_id = std::uint64_t;
using actor_id = std::uint64_t;

class actor_cell;
void intrusive_add_ref(actor_cell* cell) noexcept;
void intrusive_release(actor_cell* cell) noexcept;

/// Counted pointer to an actor cell (the count lives in the cell; no control block to allocate).
class cell_ptr {
 public:
  cell_ptr() = default;
  explicit cell_ptr(actor_cell* cell, bool add_ref = true) noexcept : cell_(cell) {
    if (cell_ && add_ref) intrusive_add_ref(cell_);
  }
  cell_ptr(const cell_ptr& other) noexcept : cell_ptr(other.cell_) {}
  cell_ptr(cell_ptr&& other) noexcept : cell_(std::exchange(other.cell_, nullptr)) {}
  cell_ptr& operator=(cell_ptr other) noexcept {
    std::swap(cell_, other.cell_);
    return *this;
  }
  ~cell_ptr() {
    if (cell_) intrusive_release(cell_);
  }
  actor_cell* get() const noexcept { return cell_; }
  actor_cell* operator->() const noexcept { return cell_; }
  explicit operator bool() const noexcept { return cell_ != nullptr; }
  /// Gives up ownership without releasing (the caller now owns one count).
  actor_cell* detach() noexcept { return std::exchange(cell_, nullptr); }

 private:
  actor_cell* cell_ = nullptr;
};

/// Handle to an actor on this node or another. Cheap to copy; compares by (node, id).
/// An id of 0 is "nobody" (e.g. the sender of a message sent from outside any actor).
class actor_ref {
 public:
  actor_ref() = default;
  actor_ref(node_id node, actor_id id) : node_(node), id_(id) {}
  actor_ref(node_id node, actor_id id, cell_ptr cell) : node_(node), id_(id), cell_(std::move(cell)) {}

  [[nodiscard]] node_id node() const noexcept { return node_; }
  [[nodiscard]] actor_id id() const noexcept { return id_; }
  [[nodiscard]] bool valid() const noexcept { return id_ != 0; }
  explicit operator bool() const noexcept { return valid(); }
  /// The local cell, or null for remote refs and refs decoded from the wire.
  [[nodiscard]] actor_cell* cell() const noexcept { return cell_.get(); }
  /// Runtime use: moves the counted cell pointer out; the ref keeps its node and id.
  [[nodiscard]] cell_ptr take_cell() noexcept { return std::move(cell_); }

  friend bool operator==(const actor_ref& a, const actor_ref& b) noexcept {
    return a.node_ == b.node_ && a.id_ == b.id_;
  }

  MSGPACK_DEFINE(node_, id_);

 private:
  node_id node_ = 0;
  actor_id id_ = 0;
  cell_ptr cell_;
};

}  // namespace tessera::actors

template <>
struct std::hash<tessera::actors::actor_ref> {
  std::size_t operator()(const tessera::actors::actor_ref& r) const noexcept {
    return std::hash<std::uint64_t>{}(r.id() * 0x9E3779B97F4A7C15ull ^ r.node());
  }
};

template <>
struct fmt::formatter<tessera::actors::actor_ref> : fmt::formatter<std::string_view> {
  auto format(const tessera::actors::actor_ref& r, fmt::format_context& ctx) const {
    return fmt::format_to(ctx.out(), "actor {}@{}", r.id(), r.node());
  }
};
