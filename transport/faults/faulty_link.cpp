#include "transport/faults/faulty_link.hpp"

#include <algorithm>

#include "actors/base/thread.hpp"

namespace tessera::transport::faults {

using bulk::completion;
using bulk::completion_kind;
using clock = std::chrono::steady_clock;

namespace {
bool heap_later(const auto& a, const auto& b) {
  return a.due != b.due ? a.due > b.due : a.seq > b.seq;
}
}  // namespace

faulty_link::faulty_link(std::unique_ptr<bulk::link> inner, std::shared_ptr<fault_injector> faults,
                         std::string local, std::string remote, partition_mode mode)
    : inner_(std::move(inner)),
      faults_(std::move(faults)),
      local_(std::move(local)),
      remote_(std::move(remote)),
      mode_(mode) {
  TESSERA_ASSERT(inner_ != nullptr && faults_ != nullptr, "faulty_link needs a link and faults");
}

faulty_link::~faulty_link() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  timer_cv_.notify_all();
  if (timer_.joinable()) timer_.join();
}

bool faulty_link::quiet() const {
  if (faults_->link_faults()) return false;
  std::lock_guard lock(mutex_);
  // Held operations go first: passing a later one by would reorder the link.
  return heap_.empty() && !down_;
}

bool faulty_link::has_timer_thread() const {
  std::lock_guard lock(mutex_);
  return timer_.joinable();
}

result<void> faulty_link::write_with_imm(bulk::buffer_handle local, std::uint64_t local_offset,
                                         const bulk::remote_buffer& remote,
                                         std::uint64_t remote_offset, std::uint64_t bytes,
                                         std::uint32_t imm, std::uint64_t wr_id) {
  // What can be checked without the inner link's private state is checked now, so a held or
  // dropped write refuses bad arguments exactly as an undecorated one does.
  if (bytes > limits().max_write_bytes || remote_offset > remote.size ||
      bytes > remote.size - remote_offset || quiet()) {
    return inner_->write_with_imm(local, local_offset, remote, remote_offset, bytes, imm, wr_id);
  }
  return submit(write_op({local, local_offset, remote, remote_offset, bytes, imm, wr_id}), wr_id);
}

faulty_link::op faulty_link::write_op(const bulk::write_request& w) {
  op o;
  o.is_write = true;
  o.local = w.local;
  o.local_offset = w.local_offset;
  o.remote = w.remote;
  o.remote_offset = w.remote_offset;
  o.bytes = w.bytes;
  o.imm = w.imm;
  return o;
}

result<bulk::buffer_handle> faulty_link::register_buffer(void* addr, std::size_t size) {
  auto h = inner_->register_buffer(addr, size);
  if (h) {
    std::lock_guard lock(mutex_);
    registered_[h->id] = size;
  }
  return h;
}

result<bulk::buffer_handle> faulty_link::register_buffer(const bulk::shared_buffer& buffer) {
  auto h = inner_->register_buffer(buffer);
  if (h) {
    std::lock_guard lock(mutex_);
    registered_[h->id] = buffer.size();
  }
  return h;
}

result<void> faulty_link::deregister_buffer(bulk::buffer_handle handle) {
  auto r = inner_->deregister_buffer(handle);
  if (r) {
    std::lock_guard lock(mutex_);
    registered_.erase(handle.id);
  }
  return r;
}

result<void> faulty_link::post_writes(std::span<const bulk::write_request> writes) {
  if (writes.empty()) return ok();
  if (quiet()) return inner_->post_writes(writes);  // one post, as undecorated
  const std::uint32_t limit = limits().max_outstanding;
  if (writes.size() > limit) {
    return make_error(errc::invalid_argument,
                      "post_writes: {} writes in one list exceed max_outstanding ({})",
                      writes.size(), limit);
  }
  {
    std::lock_guard lock(mutex_);
    if (!inner_->is_up() || down_) {
      return make_error(errc::closed, "faulty link {}->{}: link is down", local_, remote_);
    }
    for (std::size_t i = 0; i < writes.size(); ++i) {
      const bulk::write_request& w = writes[i];
      auto reg = registered_.find(w.local.id);
      if (reg == registered_.end()) {
        return make_error(errc::invalid_argument,
                          "post_writes: write {}: buffer handle {} is not registered", i,
                          w.local.id);
      }
      if (w.bytes > limits().max_write_bytes) {
        return make_error(errc::invalid_argument,
                          "post_writes: write {}: {} bytes exceeds the limit of {}", i, w.bytes,
                          limits().max_write_bytes);
      }
      if (w.local_offset > reg->second || w.bytes > reg->second - w.local_offset) {
        return make_error(errc::invalid_argument,
                          "post_writes: write {}: source range [{}, +{}) outside local buffer {} "
                          "of {} bytes",
                          i, w.local_offset, w.bytes, w.local.id, reg->second);
      }
      if (w.remote_offset > w.remote.size || w.bytes > w.remote.size - w.remote_offset) {
        return make_error(errc::invalid_argument,
                          "post_writes: write {}: target range [{}, +{}) outside remote buffer "
                          "{} of {} bytes",
                          i, w.remote_offset, w.bytes, w.remote.id, w.remote.size);
      }
    }
    if (writes.size() > limit - outstanding_) {
      return make_error(errc::overloaded,
                        "faulty link {}->{}: {} operations outstanding, {} more do not fit (limit "
                        "{}); poll first",
                        local_, remote_, outstanding_, writes.size(), limit);
    }
    outstanding_ += static_cast<std::uint32_t>(writes.size());
  }
  for (std::size_t i = 0; i < writes.size(); ++i) {
    if (auto r = submit(write_op(writes[i]), writes[i].wr_id, true); !r) {
      // Checked above, so only a link that went down meanwhile refuses one: the writes before
      // it were submitted, the rest give their reservations back.
      std::lock_guard lock(mutex_);
      outstanding_ -= static_cast<std::uint32_t>(writes.size() - i - 1);
      return make_error(r.error().code, "post_writes: {} of {} writes posted: {}", i,
                        writes.size(), r.error().message);
    }
  }
  return ok();
}

result<void> faulty_link::send(std::span<const std::byte> message, std::uint64_t wr_id) {
  if (message.size() > limits().max_send_bytes || quiet()) return inner_->send(message, wr_id);
  op o;
  o.message.assign(message.begin(), message.end());
  o.bytes = message.size();
  return submit(std::move(o), wr_id);
}

result<void> faulty_link::post_inner(const op& o, std::uint64_t internal_id) {
  if (o.is_write) {
    return inner_->write_with_imm(o.local, o.local_offset, o.remote, o.remote_offset, o.bytes,
                                  o.imm, internal_id);
  }
  return inner_->send(o.message, internal_id);
}

result<void> faulty_link::submit(op o, std::uint64_t wr_id, bool reserved) {
  const auto now = clock::now();
  const decision d = faults_->decide(local_, remote_, now.time_since_epoch());
  auto shared = std::make_shared<const op>(std::move(o));
  std::uint64_t id = 0;
  std::uint32_t immediate = 0;
  {
    std::lock_guard lock(mutex_);
    if (!inner_->is_up() || down_) {
      if (reserved) --outstanding_;
      return make_error(errc::closed, "faulty link {}->{}: link is down", local_, remote_);
    }
    if (!reserved && outstanding_ >= limits().max_outstanding) {
      return make_error(errc::overloaded,
                        "faulty link {}->{}: {} operations outstanding (limit {}); poll first",
                        local_, remote_, outstanding_, limits().max_outstanding);
    }
    id = kInternalId | next_id_++;
    if (!reserved) ++outstanding_;
    const auto kind = shared->is_write ? completion_kind::write_done : completion_kind::send_done;
    pending_[id] = pending{wr_id, kind, d.copies, false};
    if (d.lost()) {
      std::optional<error> failure;
      if (d.outcome == decision::fate::partitioned && mode_ == partition_mode::fail) {
        failure = make_error(errc::closed, "faulty link {}->{}: partitioned", local_, remote_);
      }
      pending_[id].copies_left = 1;  // the synthesized completion stands for the vanished one
      synthesize(id, std::move(failure));
      return ok();
    }
    for (std::uint8_t i = 0; i < d.copies; ++i) {
      const clock::time_point due{std::chrono::duration_cast<clock::duration>(d.deliver_at[i])};
      if (due <= now) {
        ++immediate;
      } else {
        heap_.push_back(held_op{due, next_seq_++, id, shared});
        std::push_heap(heap_.begin(), heap_.end(),
                       [](const held_op& a, const held_op& b) { return heap_later(a, b); });
        if (!timer_.joinable()) timer_ = std::thread([this] { timer_loop(); });
      }
    }
  }
  if (immediate < d.copies) timer_cv_.notify_all();
  for (std::uint32_t i = 0; i < immediate; ++i) {
    auto r = post_inner(*shared, id);
    if (r) continue;
    std::lock_guard lock(mutex_);
    auto it = pending_.find(id);
    if (i == 0 && immediate == d.copies) {
      // The only (or first) copy was refused outright: the caller sees the inner error, as
      // without the decorator.
      --outstanding_;
      pending_.erase(it);
      return r;
    }
    if (it != pending_.end() && --it->second.copies_left == 0 && !it->second.reported) {
      it->second.copies_left = 1;
      synthesize(id, r.error());
    }
  }
  return ok();
}

void faulty_link::timer_loop() {
  name_this_thread("fault-timer");
  std::unique_lock lock(mutex_);
  for (;;) {
    if (stopping_) return;
    if (heap_.empty()) {
      timer_cv_.wait(lock);
      continue;
    }
    const auto now = clock::now();
    if (const auto due = heap_.front().due; due > now) {
      // A copy, not a reference: wait_until reads it again after waking, and while we wait
      // another thread's push_back may reallocate the heap's storage.
      timer_cv_.wait_until(lock, due);
      continue;
    }
    std::pop_heap(heap_.begin(), heap_.end(),
                  [](const held_op& a, const held_op& b) { return heap_later(a, b); });
    held_op h = std::move(heap_.back());
    heap_.pop_back();
    lock.unlock();
    auto r = post_inner(*h.what, h.internal_id);
    lock.lock();
    if (!r && r.error().code == errc::overloaded && !stopping_) {
      // The inner link's own bound: try again shortly rather than lose the message.
      h.due = clock::now() + std::chrono::milliseconds(1);
      heap_.push_back(std::move(h));
      std::push_heap(heap_.begin(), heap_.end(),
                     [](const held_op& a, const held_op& b) { return heap_later(a, b); });
      continue;
    }
    if (!r) {
      auto it = pending_.find(h.internal_id);
      if (it != pending_.end() && --it->second.copies_left == 0 && !it->second.reported) {
        it->second.copies_left = 1;
        synthesize(h.internal_id, r.error());
      }
    }
  }
}

// Queues the user's completion for internal op `id` (mutex_ held). Consumes one copy.
void faulty_link::synthesize(std::uint64_t id, std::optional<error> failure) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  completion c;
  c.kind = it->second.kind;
  c.wr_id = it->second.user_wr_id;
  c.failure = std::move(failure);
  synthesized_.push_back(std::move(c));
  it->second.reported = true;
  if (--it->second.copies_left == 0) pending_.erase(it);
}

void faulty_link::fail_held(const error& reason) {
  for (const held_op& h : heap_) {
    auto it = pending_.find(h.internal_id);
    if (it == pending_.end()) continue;
    if (!it->second.reported) {
      it->second.copies_left = 1;
      synthesize(h.internal_id, reason);
    } else if (--it->second.copies_left == 0) {
      pending_.erase(it);
    }
  }
  heap_.clear();
}

std::size_t faulty_link::take_synthesized(std::span<completion> out) {
  std::size_t n = 0;
  while (n < out.size() && !synthesized_.empty()) {
    completion& c = synthesized_.front();
    if (c.kind == completion_kind::write_done || c.kind == completion_kind::send_done) {
      --outstanding_;
    }
    out[n++] = std::move(c);
    synthesized_.pop_front();
  }
  if (n < out.size() && synthesized_.empty() && down_ && !down_delivered_) {
    out[n++] = std::move(*down_);
    down_delivered_ = true;
  }
  return n;
}

std::size_t faulty_link::translate(std::span<completion> got) {
  std::size_t kept = 0;
  for (completion& c : got) {
    if (c.kind == completion_kind::link_down) {
      down_ = std::move(c);
      fail_held(down_->failure.value_or(error{errc::closed, "link down"}));
      continue;
    }
    if ((c.kind == completion_kind::write_done || c.kind == completion_kind::send_done) &&
        (c.wr_id & kInternalId) != 0) {
      auto it = pending_.find(c.wr_id);
      if (it == pending_.end()) continue;
      pending& p = it->second;
      const bool report = !p.reported;
      const std::uint64_t user_wr_id = p.user_wr_id;
      p.reported = true;
      if (--p.copies_left == 0) pending_.erase(it);
      if (!report) continue;  // the second copy of a duplicated operation
      c.wr_id = user_wr_id;
      --outstanding_;
    }
    if (&got[kept] != &c) got[kept] = std::move(c);
    ++kept;
  }
  return kept;
}

std::size_t faulty_link::poll(std::span<completion> out) {
  std::lock_guard lock(mutex_);
  std::size_t n = take_synthesized(out);
  if (n < out.size() && !down_) {
    const std::size_t got = inner_->poll(out.subspan(n));
    n += translate(out.subspan(n, got));
  }
  return n;
}

result<std::size_t> faulty_link::wait(std::span<completion> out,
                                      std::chrono::microseconds timeout) {
  if (out.empty()) return make_error(errc::invalid_argument, "wait: empty output span");
  const auto deadline = clock::now() + timeout;
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (down_delivered_ && synthesized_.empty()) {
        return make_error(errc::closed, "faulty link {}->{}: link is down", local_, remote_);
      }
      if (std::size_t n = take_synthesized(out); n > 0) return n;
    }
    // Wait on the inner link in slices: a completion we synthesize from another thread (a held
    // operation that failed) must not wait for the whole timeout.
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - clock::now());
    const auto slice = std::clamp(left, std::chrono::microseconds(0), std::chrono::microseconds(5000));
    std::size_t got = 0;
    {
      auto r = inner_->wait(out, slice);
      if (!r) {
        std::lock_guard lock(mutex_);
        if (!synthesized_.empty() || (down_ && !down_delivered_)) continue;
        return std::move(r).error();
      }
      got = *r;
    }
    std::lock_guard lock(mutex_);
    if (std::size_t n = translate(out.first(got)); n > 0) return n;
    if (!synthesized_.empty() || (down_ && !down_delivered_)) continue;
    if (clock::now() >= deadline) return std::size_t{0};
  }
}

std::size_t faulty_link::held() const {
  std::lock_guard lock(mutex_);
  return heap_.size();
}

}  // namespace tessera::transport::faults
