// mailbox: the bounded, two-lane, multi-producer single-consumer queue of one actor.
//
// Each lane is an intrusive Vyukov MPSC queue (a push is one atomic exchange, no lock) with its own
// counter and bound. The control lane (down, child exits, timers, stop) is always served before
// the data lane, so an actor that is flooded with data still hears that it must stop.
//
// Bounds (designed behaviour at the limit):
//  - data lane full   -> push returns errc::overloaded; the sender learns, nothing is dropped.
//                         Slots a handler's open send batch reserved and has not used yet count
//                         as taken until its flush (fewer than 64 per batch; see reserve_data).
//  - control lane full -> push returns errc::overloaded; the runtime counts it
//                         (stats::control_overflow) and logs it.
//  - responses to this actor's own requests bypass the data bound: they are already bounded by
//    the actor's limit on pending requests, and refusing one would turn a reply into a timeout.
//  - closed (actor stopped) -> push returns errc::closed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>
#include <span>
#include <vector>

#include "actors/actor_ref.hpp"
#include "actors/base/result.hpp"
#include "actors/envelope.hpp"
#include "actors/node_pool.hpp"

namespace tessera::actors {

/// One queued message. Local messages are typed_node<T> (the struct itself, never serialised);
/// messages that came from the network are bytes_node (decoded by the receiver's handler).
struct message_node {
  std::atomic<message_node*> next{nullptr};
  std::uint32_t type_id = 0;
  message_kind kind = message_kind::message;
  lane lane_ = lane::data;
  /// Request correlation, or the timer id for kind::timer. For a plain message (kind::message)
  /// in a send batch, from the send until it is popped: the address of a later node of the
  /// same batch, which pop() prefetches and clears (the receiver never sees it).
  std::uint64_t request_id = 0;
  actor_ref sender;

  message_node() = default;
  message_node(const message_node&) = delete;
  message_node& operator=(const message_node&) = delete;
  virtual ~message_node() = default;

  // Every send allocates a node and its receiver frees it, usually on another thread: nodes come
  // from the node pool (the virtual destructor makes delete pass the dynamic type's size).
  static void* operator new(std::size_t bytes) { return node_pool::allocate(bytes); }
  static void operator delete(void* block, std::size_t bytes) noexcept {
    node_pool::deallocate(block, bytes);
  }
  // Over-aligned message types bypass the pool (its blocks have new's default alignment).
  static void* operator new(std::size_t bytes, std::align_val_t align) {
    return ::operator new(bytes, align);
  }
  static void operator delete(void* block, std::size_t, std::align_val_t align) noexcept {
    ::operator delete(block, align);
  }

  /// The local typed value, or null when the body is still msgpack bytes.
  virtual void* payload() noexcept { return nullptr; }
  /// The msgpack body, when this node came from the network.
  virtual std::span<const char> bytes() const noexcept { return {}; }
  /// Packs the payload for an envelope (local nodes); bytes nodes return their bytes.
  virtual std::vector<char> encode() const = 0;
  /// The declared name of the payload type (for error messages).
  virtual std::string_view type_name() const noexcept = 0;
};

/// A node carrying a local message struct.
template <class T>
struct typed_node final : message_node {
  T value;
  explicit typed_node(T v) : value(std::move(v)) { type_id = T::type_id; }
  void* payload() noexcept override { return &value; }
  std::vector<char> encode() const override { return pack_message(value); }
  std::string_view type_name() const noexcept override { return T::type_name; }
};

/// A node carrying a message body that arrived in an envelope.
struct bytes_node final : message_node {
  std::vector<char> body;
  explicit bytes_node(std::vector<char> b) : body(std::move(b)) {}
  std::span<const char> bytes() const noexcept override { return body; }
  std::vector<char> encode() const override { return body; }
  std::string_view type_name() const noexcept override { return "<remote>"; }
};

/// Intrusive lock-free MPSC queue (Dmitry Vyukov's design). push from any thread; pop from the
/// owner only. pop may return null while a push is half done; the counter tells the owner that a
/// message is on its way.
class mpsc_lane {
 public:
  mpsc_lane() noexcept;
  mpsc_lane(const mpsc_lane&) = delete;
  mpsc_lane& operator=(const mpsc_lane&) = delete;

  void push(message_node* node) noexcept;
  /// Appends `first`..`last`, already linked through `next`, with one exchange.
  void push_chain(message_node* first, message_node* last) noexcept;
  message_node* pop() noexcept;
  /// Owner only, and only while it owns the queue: a node it has not returned yet (tail_ is the
  /// next one to return).
  [[nodiscard]] bool has_unpopped() const noexcept { return tail_ != &stub_; }
  /// Any thread: something was pushed since the queue last ran dry (a push that has exchanged
  /// the head but not yet linked counts).
  [[nodiscard]] bool pushed() const noexcept {
    return head_.load(std::memory_order_seq_cst) != &stub_;
  }

 private:
  struct stub_node final : message_node {
    std::vector<char> encode() const override { return {}; }
    std::string_view type_name() const noexcept override { return "<stub>"; }
  };
  alignas(64) std::atomic<message_node*> head_;

 public:
  /// The owner's counter (mailbox's: pushed minus popped, and its closed bit). It shares the
  /// producers' line with head_: a push's two atomics then cost one cache-line transfer, not two.
  std::atomic<std::int64_t> count{0};

 private:
  alignas(64) message_node* tail_;
  stub_node stub_;
};

/// The two lanes, their bounds and the closed flag.
class mailbox {
 public:
  mailbox(std::size_t data_capacity, std::size_t control_capacity) noexcept;
  ~mailbox();
  mailbox(const mailbox&) = delete;
  mailbox& operator=(const mailbox&) = delete;

  /// Enqueues `node` (ownership passes on success only). `bypass_bound` is for responses.
  [[nodiscard]] result<void> push(message_node* node, bool bypass_bound = false) noexcept;
  // Batched sends (actor_cell's send batches): slots are admitted first, the nodes pushed later
  // as one chain. Admitted slots count against the bound from the moment they are admitted.
  /// Admits one data-lane message (push's bound and closed checks) without queueing it.
  [[nodiscard]] result<void> admit_data() noexcept;
  /// Admits `n` data-lane slots at once when the lane has room for them and `n` more, else
  /// none (returns 0; the caller admits one at a time, exact at the bound). A sender refused
  /// while other senders hold reserved slots they have not used is refused early by at most
  /// those slots (each open batch holds fewer than `n`); the bound is never exceeded.
  [[nodiscard]] std::uint32_t reserve_data(std::uint32_t n) noexcept;
  /// Gives back `n` reserved slots that were not used.
  void unreserve_data(std::uint32_t n) noexcept;
  /// Queues `first`..`last`, linked through `next`, each admitted before; one exchange.
  void push_admitted_chain(message_node* first, message_node* last) noexcept {
    data_.queue.push_chain(first, last);
  }
  /// Next message, control lane first; null when nothing is (yet) visible. Owner only.
  message_node* pop() noexcept;
  /// Messages pushed and not yet popped (both lanes), including pushes still in progress. Never
  /// fewer than are there; from another thread than the owner's it may count a few just popped.
  [[nodiscard]] std::size_t size() const noexcept;
  // Whether a queue holds something, in two halves (resume() reads the first while it owns the
  // actor and the second after it gave the actor up, when another worker may already be popping).
  // Admitted slots of an open send batch count in neither (see resume()).
  /// Owner only, while it owns the mailbox: a node not yet popped.
  [[nodiscard]] bool has_unpopped() const noexcept {
    return data_.queue.has_unpopped() || control_.queue.has_unpopped();
  }
  /// Any thread: a push since the queues last ran dry, or one being linked.
  [[nodiscard]] bool pushed() const noexcept {
    return data_.queue.pushed() || control_.queue.pushed();
  }
  /// Owner only: takes the pops not yet subtracted off the counters (end of every turn).
  void settle() noexcept;
  /// Pops the owner may leave off the counter: subtracting one at a time was an atomic on the
  /// line every sender increments, so the line crossed cores twice per message in a fan-in. The
  /// bound stays exact: a push that finds the counter at the bound subtracts the owner's
  /// published pops (`lane_state::popped`) before it refuses.
  static constexpr std::int64_t settle_batch = 64;
  /// Refuses every later push with errc::closed and waits for pushes in progress to land.
  void close() noexcept;
  [[nodiscard]] bool closed() const noexcept;
  [[nodiscard]] std::size_t data_capacity() const noexcept { return data_capacity_; }
  [[nodiscard]] std::size_t control_capacity() const noexcept { return control_capacity_; }

 private:
  static constexpr std::int64_t closed_bit = std::int64_t{1} << 62;
  struct lane_state {
    mpsc_lane queue;
    // Pops not yet subtracted off queue.count. Written by the owner only (a plain store per pop
    // to a line no sender writes); read by a push only when the counter says the lane is full,
    // so that a consumer preempted with unsettled pops does not get senders refused early.
    alignas(64) std::atomic<std::int64_t> popped{0};
    // queue.count: pushed minus (popped - this->popped), | closed_bit once closed.
  };
  static void settle_lane(lane_state& l) noexcept;
  result<void> push_lane(lane_state& l, std::size_t capacity, message_node* node, bool bypass);
  result<void> admit_lane(lane_state& l, std::size_t capacity, lane which, bool bypass);
  static message_node* pop_lane(lane_state& l) noexcept;

  lane_state control_;
  lane_state data_;
  std::size_t data_capacity_;
  std::size_t control_capacity_;
};

}  // namespace tessera::actors
