// Threads by role: every thread a node starts says what it is (a name `top -H` and
// /proc/PID/task/*/comm show), and threads that compute give way to the ones that keep the node in
// the cluster.
//
// Why priorities: on a machine with fewer cores than busy threads, a peer's forward passes and its
// neighbours' fill every core, and the threads that answer membership probes (the control plane's
// I/O, the protocol loop) wait their turn behind them. A probe answered late is a peer suspected
// and, after the suspicion timeout, declared dead: the plan moves, weights are unloaded, streams
// resume elsewhere — for a peer that was only busy (issue 31). Compute threads therefore run at a
// higher nice value (`--compute-nice`, default 10: about a tenth of a nice-0 thread's weight under
// Linux's fair scheduler), so a protocol thread that wakes preempts them at once, while compute
// still gets every cycle nobody else wants.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>

namespace tessera {

/// Names the calling thread (at most 15 bytes are kept: the kernel's limit). Best effort.
void name_this_thread(std::string_view name) noexcept;

/// Sets the calling thread's nice value (Linux: per thread; 0..19, clamped; raising it needs no
/// privilege). 0 leaves the thread as it is. Best effort: returns false when the kernel refused.
bool set_this_thread_nice(int nice) noexcept;

/// The calling thread's nice value.
[[nodiscard]] int this_thread_nice() noexcept;

/// The calling process's threads by role, for status: a thread's name with a trailing `-N` or
/// `/N` (a slot number) removed, e.g. {"http": 3, "kpool": 2, "ZMQbg/IO": 2}. Read from
/// /proc/self/task; empty where that is unreadable.
[[nodiscard]] std::map<std::string, std::size_t> thread_roles();

}  // namespace tessera
