// The members' status documents for the dashboard's /cluster view. Asking (status_request over
// each member's own authenticated link, once a second) runs only while someone reads them: no
// thread and no connection per poll. The HTTP gateway's threads read; the control actor asks and
// stores the answers. A member whose answer is older than 3 s shows as null.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace tessera::mesh::runtime {

class cluster_docs {
 public:
  static constexpr std::uint64_t kAskMs = 1000;       ///< asks at most this often
  static constexpr std::uint64_t kWantMs = 5000;      ///< asks this long after the last read
  static constexpr std::uint64_t kStaleMs = 3000;     ///< older answers show as null
  static constexpr std::uint64_t kForgetMs = 60'000;  ///< older answers are dropped (the bound)
  static constexpr std::uint64_t kFirstReadWaitMs = 800;

  /// `now_ms`: a monotonic clock in ms (the node's real time, not the protocols' skewable one).
  explicit cluster_docs(std::function<std::uint64_t()> now_ms) : now_ms_(std::move(now_ms)) {}

  /// Any thread: every alive member of `self_doc`'s view by node id, `self_doc` itself under
  /// `self_hex`. The first read after a quiet spell waits (kFirstReadWaitMs at most) for the
  /// answers the control actor now asks for; later reads take what is there.
  [[nodiscard]] nlohmann::json read(const nlohmann::json& self_doc,
                                    const std::string& self_hex) const;

  /// The control actor's turns: true when the members are to be asked now (someone read within
  /// kWantMs and the last ask is kAskMs old).
  [[nodiscard]] bool ask_due();

  /// The control actor's turns: member `hex`'s answer.
  void on_answer(const std::string& hex, std::string doc);

 private:
  std::function<std::uint64_t()> now_ms_;
  mutable std::mutex mu_;
  mutable std::condition_variable answered_;
  std::map<std::string, std::pair<std::string, std::uint64_t>> docs_;  // hex -> (doc, at)
  mutable std::atomic<std::uint64_t> wanted_until_{0};
  std::uint64_t next_ask_ = 0;  // the control actor's turns only
};

}  // namespace tessera::mesh::runtime
