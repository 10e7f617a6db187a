// actor_cell: the runtime's side of one actor — mailbox, scheduling flag, lifecycle, monitors.
// The actor (behaviour and state) lives inside; the cell outlives it while refs to it exist.
//
// Lifecycle:   spawned --first turn--> running --quit / throw / stop_request--> stopped
//   stopped: pending requests failed (errc::closed), on_stop, timers cancelled, mailbox closed
//   and drained (queued requests answered errc::closed), names removed, monitors get `down`,
//   the parent gets `child_exit`. All of it on the actor's own thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "actors/actor.hpp"
#include "actors/actor_ref.hpp"
#include "actors/mailbox.hpp"
#include "actors/scheduler.hpp"

namespace tessera::actors {

class actor_system;

class actor_cell {
 public:
  actor_cell(actor_system& sys, actor_id id, std::unique_ptr<actor> behaviour,
             std::size_t data_capacity, std::size_t control_capacity, int pinned_worker,
             actor_ref parent);
  ~actor_cell();
  actor_cell(const actor_cell&) = delete;
  actor_cell& operator=(const actor_cell&) = delete;

  /// Pushes `node` and makes the actor runnable. On error the caller keeps `node`. Called from a
  /// handler (another actor's turn), a data-lane message to an actor this handler already sent
  /// to may be batched: admitted (or refused) now, delivered when the handler returns, when
  /// `send_batch_limit` wait, or before the handler's next send that is not batched with it.
  [[nodiscard]] result<void> enqueue(message_node* node, bool bypass_bound) noexcept;
  /// Delivers this thread's open send batch now (no-op without one).
  static void flush_sends() noexcept;
  /// Messages one send batch holds at most.
  static constexpr std::uint32_t send_batch_limit = 64;
  /// How many nodes ahead a batched node points the receiver (request_id) to fetch.
  static constexpr std::uint32_t prefetch_distance = 8;
  /// One turn: up to `max_batch` messages (control lane first). Scheduler only.
  resume_result resume(std::size_t max_batch);
  /// Schedules the first turn (on_start).
  void start();
  /// Adds `watcher` to the monitors; false (and the exit reason) when the actor already stopped.
  bool add_watcher(const actor_ref& watcher, exit_reason& reason_if_dead);
  /// Nothing queued and not scheduled (shutdown uses it to detect the end of draining).
  [[nodiscard]] bool quiescent() const noexcept;
  [[nodiscard]] bool stopped() const noexcept { return stopped_.load(std::memory_order_acquire); }
  [[nodiscard]] actor_id id() const noexcept { return id_; }
  /// Messages handled so far (status pages; any thread, approximate while it runs).
  [[nodiscard]] std::uint64_t handled() const noexcept {
    return handled_.load(std::memory_order_relaxed);
  }
  /// Messages waiting in its mailbox (both lanes; any thread, approximate).
  [[nodiscard]] std::size_t queued() const noexcept { return mailbox_.size(); }
  [[nodiscard]] int pinned_worker() const noexcept { return pinned_worker_; }

  std::atomic<std::uint32_t> refs{0};
  /// Scheduler only: link in a worker's pinned inbox. Written by the one thread that holds the
  /// scheduled cell before it publishes the cell (CAS, release); read after the taking exchange.
  actor_cell* sched_next = nullptr;

 private:
  result<void> add_to_batch(message_node* node) noexcept;
  void make_runnable() noexcept;
  static void begin_turn() noexcept;
  static void end_turn() noexcept;
  /// Handles and frees `node`; returns the sender's cell with the node's count on it (or null).
  actor_cell* process(message_node* node);
  void finalize(exit_reason reason);
  void drain_after_close();

  actor_system& sys_;
  actor_id id_;
  std::unique_ptr<actor> behaviour_;
  mailbox mailbox_;
  alignas(64) std::atomic<bool> scheduled_{false};
  int pinned_worker_;
  actor_ref parent_;
  bool started_ = false;
  // Written by the thread running the actor's turn only (a load and a store, no read-modify-write
  // on the hot path); read by status pages.
  std::atomic<std::uint64_t> handled_{0};
  std::atomic<bool> stopped_{false};
  std::mutex watch_mutex_;
  std::vector<actor_ref> watchers_;
  exit_reason exit_reason_;
  // The counts on the last sender's cell that handled messages carried, dropped together when
  // a message from another sender comes, at the bound, or when this actor stops. One atomic per
  // message on a line the sender keeps using made every cross-thread message pay a second
  // cache-line transfer. The cost: a sender's cell (not its state) may outlive it until this
  // actor hears from someone else or stops; one cell per actor at most.
  static constexpr std::uint32_t held_counts_limit = 1024;
  actor_cell* held_sender_ = nullptr;
  std::uint32_t held_counts_ = 0;
};

}  // namespace tessera::actors
