#include "actors/mailbox.hpp"

#include <thread>
#include <utility>

namespace tessera::actors {

mpsc_lane::mpsc_lane() noexcept : head_(&stub_), tail_(&stub_) {}

void mpsc_lane::push(message_node* node) noexcept {
  node->next.store(nullptr, std::memory_order_relaxed);
  message_node* prev = head_.exchange(node, std::memory_order_acq_rel);
  prev->next.store(node, std::memory_order_release);
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

result<void> mailbox::push_lane(lane_state& l, std::size_t capacity, message_node* node,
                                bool bypass) {
  std::int64_t before = l.queue.count.fetch_add(1, std::memory_order_seq_cst);
  if (before & closed_bit) {
    l.queue.count.fetch_sub(1, std::memory_order_relaxed);
    return error{errc::closed, "mailbox closed"};
  }
  if (!bypass && static_cast<std::size_t>(before) >= capacity) {
    l.queue.count.fetch_sub(1, std::memory_order_relaxed);
    return make_error(errc::overloaded, "{} lane full ({} messages)",
                      node->lane_ == lane::control ? "control" : "data", capacity);
  }
  l.queue.push(node);
  return ok();
}

message_node* mailbox::pop_lane(lane_state& l, std::size_t capacity) noexcept {
  // No look at the counter first: it lives on the line every sender writes. An empty queue is
  // seen on the receiver's own line.
  message_node* n = l.queue.pop();
  if (n == nullptr) return nullptr;
  if (++l.unsettled >= settle_batch || l.near_bound) settle_lane(l, capacity);
  return n;
}

void mailbox::settle_lane(lane_state& l, std::size_t capacity) noexcept {
  if (l.unsettled == 0) return;
  std::int64_t popped = std::exchange(l.unsettled, 0);
  std::int64_t before = l.queue.count.fetch_sub(popped, std::memory_order_relaxed) & ~closed_bit;
  // Near the bound every pop is counted at once, so a sender is refused only when the lane is
  // really full. Far from it the counter may run ahead of the truth by less than a batch; this
  // view of it is at most a batch of pops old.
  l.near_bound = before - popped + settle_batch >= static_cast<std::int64_t>(capacity);
}

void mailbox::settle() noexcept {
  settle_lane(control_, control_capacity_);
  settle_lane(data_, data_capacity_);
}

message_node* mailbox::pop() noexcept {
  if (message_node* n = pop_lane(control_, control_capacity_)) return n;
  return pop_lane(data_, data_capacity_);
}

std::size_t mailbox::size() const noexcept {
  const std::int64_t control = control_.queue.count.load(std::memory_order_seq_cst) & ~closed_bit;
  const std::int64_t data = data_.queue.count.load(std::memory_order_seq_cst) & ~closed_bit;
  return static_cast<std::size_t>(control + data);
}

void mailbox::close() noexcept {
  control_.queue.count.fetch_or(closed_bit, std::memory_order_seq_cst);
  data_.queue.count.fetch_or(closed_bit, std::memory_order_seq_cst);
}

bool mailbox::closed() const noexcept {
  return (data_.queue.count.load(std::memory_order_acquire) & closed_bit) != 0;
}

}  // namespace tessera::actors
