#include "actors/supervisor.hpp"

#include "actors/base/log.hpp"

#include <algorithm>

namespace tessera::actors {

supervisor::supervisor(supervisor_spec spec, std::vector<child_spec> children)
    : spec_(spec) {
  for (auto& c : children) {
    TESSERA_ASSERT(c.make != nullptr, "child_spec '{}' without a factory", c.name);
    children_.push_back(child{std::move(c), {}, {}});
  }
  on<child_exit>([this](child_exit& e) { on_child_exit(e); });
  on<restart_children>([this](restart_children& m) {
    for (auto i : m.indices) {
      if (i < children_.size() && !children_[i].ref.valid() && !start_child(i)) return;
    }
  });
  on<supervisor_query>([this](supervisor_query&) {
    supervisor_report report;
    for (auto& c : children_) report.children.push_back(c.ref);
    report.restarts = total_restarts_;
    return report;
  });
}

void supervisor::on_start() {
  for (std::size_t i = 0; i < children_.size(); ++i) {
    if (!start_child(i)) return;
  }
}

bool supervisor::start_child(std::size_t index) {
  child& c = children_[index];
  spawn_options opts = c.spec.options;
  opts.name = c.spec.name;
  opts.replace_name = true;
  opts.parent = self();
  auto r = system().spawn(c.spec.make(), std::move(opts));
  if (!r) {
    fail(fmt::format("cannot start child '{}': {}", c.spec.name, r.error().describe()));
    return false;
  }
  c.ref = *r;
  return true;
}

clock::duration supervisor::backoff(child& c) const {
  clock::duration d = spec_.backoff_initial;
  for (std::size_t k = 1; k < c.restarts.size() && d < spec_.backoff_max; ++k) d *= 2;
  return std::min(d, spec_.backoff_max);
}

void supervisor::on_child_exit(const child_exit& e) {
  auto it = std::find_if(children_.begin(), children_.end(),
                         [&](const child& c) { return c.ref == e.who; });
  if (it == children_.end()) return;  // a child we already replaced or stopped on purpose
  child& failed = *it;
  failed.ref = actor_ref();
  if (!e.reason.abnormal()) return;  // finished normally or at shutdown: not restarted
  auto t = now();
  auto prune = [&](std::deque<clock::time_point>& q) {
    while (!q.empty() && t - q.front() > spec_.window) q.pop_front();
  };
  prune(restarts_);
  prune(failed.restarts);
  if (restarts_.size() >= spec_.max_restarts) {
    fail(fmt::format("restart bound exceeded: {} restarts within {} ms; child '{}' {}",
                     restarts_.size(),
                     std::chrono::duration_cast<std::chrono::milliseconds>(spec_.window).count(),
                     failed.spec.name, e.reason.describe()));
    return;
  }
  restarts_.push_back(t);
  failed.restarts.push_back(t);
  ++total_restarts_;
  SPDLOG_INFO("supervisor {}: child '{}' {}; restart {} of {} in the window", self(),
              failed.spec.name, e.reason.describe(), restarts_.size(), spec_.max_restarts);
  restart_children msg;
  auto index = static_cast<std::uint32_t>(it - children_.begin());
  if (spec_.strategy == restart_strategy::one_for_one) {
    msg.indices.push_back(index);
  } else {
    for (std::uint32_t i = 0; i < children_.size(); ++i) {
      if (children_[i].ref.valid()) {
        (void)system().stop(children_[i].ref,
                            exit_reason{exit_kind::killed,
                                        fmt::format("sibling '{}' failed", failed.spec.name)});
        children_[i].ref = actor_ref();
      }
      msg.indices.push_back(i);
    }
  }
  after(backoff(failed), std::move(msg));
}

void supervisor::on_stop(const exit_reason& reason) {
  for (auto& c : children_) {
    if (c.ref.valid()) {
      (void)system().stop(c.ref, exit_reason{reason.kind == exit_kind::shutdown
                                                 ? exit_kind::shutdown
                                                 : exit_kind::killed,
                                             "supervisor stopping"});
    }
  }
}

}  // namespace tessera::actors
