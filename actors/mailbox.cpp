#include "actors/mailbox.hpp"

#include <algorithm>
#include <thread>
#include <utility>

namespace tessera::actors {

mpsc_lane::mpsc_lane() noexcept : head_(&stub_), tail_(&stub_) {}

void mpsc_lane::push(message_node* node) noexcept {
  push_chain(node, node);
}

void mpsc_lane::push_chain(message_node* first, message_node* last) noexcept {
  last->next.store(nullptr, std::memory_order_relaxed);
  // seq_cst: with actor_cell's scheduled flag this is a Dekker pair (see actor_cell::resume).
  message_node* prev = head_.exchange(last, std::memory_order_seq_cst);
  prev->next.store(first, std::memory_order_release);
}

message_node* mpsc_lane::pop() noexcept {
  message_node* tail = tail_;
  message_node* next = tail->next.load(std::memory_order_acquire);
  if (tail == &stub_) {
    if (next == nullptr) return nullptr;
    tail_ = next;
    tail = next;
    next = next->next.load(std::memory_order_acquire);
  }
  if (next != nullptr) {
    tail_ = next;
    // The next pop reads this node's link: start fetching it while the caller handles `tail`
    // (a draining receiver otherwise misses the cache on every node another core wrote).
    __builtin_prefetch(next);
    return tail;
  }
  if (tail != head_.load(std::memory_order_acquire)) return nullptr;  // a push is half done
  push(&stub_);
  next = tail->next.load(std::memory_order_acquire);
  if (next != nullptr) {
    tail_ = next;
    return tail;
  }
  return nullptr;
}

mailbox::mailbox(std::size_t data_capacity, std::size_t control_capacity) noexcept
    : data_capacity_(data_capacity), control_capacity_(control_capacity) {}

mailbox::~mailbox() {
  // Whatever is left belongs to nobody now; the owner has stopped.
  while (message_node* n = pop()) delete n;
}

result<void> mailbox::push(message_node* node, bool bypass_bound) noexcept {
  if (node->lane_ == lane::control) return push_lane(control_, control_capacity_, node, false);
  return push_lane(data_, data_capacity_, node, bypass_bound);
}

result<void> mailbox::admit_data() noexcept {
  return admit_lane(data_, data_capacity_, lane::data, false);
}

std::uint32_t mailbox::reserve_data(std::uint32_t n) noexcept {
  // Room for these and as much again: a reservation never takes the lane's last slots, so near
  // the bound every sender admits one at a time and is refused only when the lane is full (or
  // when others hold unused reservations: early by at most what they hold, see the header).
  auto fits = [&](std::int64_t count) {
    return (count & closed_bit) == 0 &&
           static_cast<std::size_t>(count) + 2 * std::size_t{n} <= data_capacity_;
  };
  if (!fits(data_.queue.count.load(std::memory_order_relaxed))) return 0;
  const std::int64_t before = data_.queue.count.fetch_add(n, std::memory_order_seq_cst);
  if (fits(before)) return n;
  data_.queue.count.fetch_sub(n, std::memory_order_seq_cst);
  return 0;
}

void mailbox::unreserve_data(std::uint32_t n) noexcept {
  if (n != 0) data_.queue.count.fetch_sub(n, std::memory_order_seq_cst);
}

result<void> mailbox::push_lane(lane_state& l, std::size_t capacity, message_node* node,
                                bool bypass) {
  TESSERA_TRY(admit_lane(l, capacity, node->lane_, bypass));
  l.queue.push(node);
  return ok();
}

result<void> mailbox::admit_lane(lane_state& l, std::size_t capacity, lane which, bool bypass) {
  std::int64_t before = l.queue.count.fetch_add(1, std::memory_order_seq_cst);
  if (before & closed_bit) {
    l.queue.count.fetch_sub(1, std::memory_order_relaxed);
    return error{errc::closed, "mailbox closed"};
  }
  // At the bound by the counter: it may still hold pops the owner has not subtracted yet (the
  // owner was preempted mid-turn, say, while senders filled the lane). Subtract the pops it
  // published. Settling zeroes them (seq_cst) before it subtracts them from the counter (seq_cst),
  // and this load (seq_cst) follows our increment: if our `before` already lacks a batch, the
  // load sees the zero, so no pop is taken off twice; if it still holds it, we may see less
  // than it holds and refuse a little early, never late. The bound is never exceeded.
  if (!bypass && static_cast<std::size_t>(before) >= capacity &&
      static_cast<std::size_t>(before - l.popped.load(std::memory_order_seq_cst)) >= capacity) {
    l.queue.count.fetch_sub(1, std::memory_order_relaxed);
    return make_error(errc::overloaded, "{} lane full ({} messages)",
                      which == lane::control ? "control" : "data", capacity);
  }
  return ok();
}

message_node* mailbox::pop_lane(lane_state& l) noexcept {
  // No look at the counter first: it lives on the line every sender writes. An empty queue is
  // seen on the receiver's own line.
  message_node* n = l.queue.pop();
  if (n == nullptr) return nullptr;
  // A node of a send batch names a later node of its batch: fetch it now, so the walk down the
  // chain (each node written by another core) has several misses in flight, not one.
  if (n->kind == message_kind::message && n->request_id != 0) {
    __builtin_prefetch(reinterpret_cast<const void*>(n->request_id));
    n->request_id = 0;
  }
  const std::int64_t popped = l.popped.load(std::memory_order_relaxed) + 1;
  if (popped >= settle_batch) {
    l.popped.store(0, std::memory_order_seq_cst);
    l.queue.count.fetch_sub(popped, std::memory_order_seq_cst);
  } else {
    // Relaxed: a push that reads an older value subtracts fewer pops (refuses, at worst, a
    // little early); it can never read a value from before the last zeroing (see push_lane).
    l.popped.store(popped, std::memory_order_relaxed);
  }
  return n;
}

void mailbox::settle_lane(lane_state& l) noexcept {
  const std::int64_t popped = l.popped.load(std::memory_order_relaxed);
  if (popped == 0) return;
  // Zero the published pops first: a push that reads them after our subtraction must not take
  // them off a second time.
  l.popped.store(0, std::memory_order_seq_cst);
  l.queue.count.fetch_sub(popped, std::memory_order_seq_cst);
}

void mailbox::settle() noexcept {
  settle_lane(control_);
  settle_lane(data_);
}

message_node* mailbox::pop() noexcept {
  if (message_node* n = pop_lane(control_)) return n;
  return pop_lane(data_);
}

std::size_t mailbox::size() const noexcept {
  // The counter first, then the pops not yet off it: a settle in between makes this count high,
  // never low (the other order could miss messages that are there).
  auto lane_size = [](const lane_state& l) {
    const std::int64_t count = l.queue.count.load(std::memory_order_seq_cst) & ~closed_bit;
    return std::max<std::int64_t>(0, count - l.popped.load(std::memory_order_seq_cst));
  };
  return static_cast<std::size_t>(lane_size(control_) + lane_size(data_));
}

void mailbox::close() noexcept {
  control_.queue.count.fetch_or(closed_bit, std::memory_order_seq_cst);
  data_.queue.count.fetch_or(closed_bit, std::memory_order_seq_cst);
}

bool mailbox::closed() const noexcept {
  return (data_.queue.count.load(std::memory_order_acquire) & closed_bit) != 0;
}

}  // namespace tessera::actors
