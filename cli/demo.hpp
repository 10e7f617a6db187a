// The two demos behind `tessera demo`: serving across peers (default) and the actor runtime.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::cli {

struct demo_options {
  std::uint32_t peers = 3;
  std::uint16_t base_port = 17600;  ///< peer i uses base + 10 i .. base + 10 i + 4
  std::uint32_t wait_s = 60;        ///< how long the mesh may take to form
  bool keep = false;                ///< keep the working directory (logs, model)
  /// After the checks, keep the peers up (their HTTP API, dashboard and pub-sub endpoints) until
  /// SIGINT or SIGTERM, then shut them down as usual.
  bool serve = false;
  /// GGUF model to serve; empty: the trained demo model (examples/demo-model/kjv.gguf in the
  /// source tree, or where `cmake --install` put it), else a synthesised one.
  std::string model;
};

/// The trained demo model if this build can find it ($TESSERA_DEMO_MODEL, the source tree, the
/// install prefix), else empty.
[[nodiscard]] std::string find_demo_model();

/// N peers on loopback serving the demo model (or a synthesised one) through the pub-sub client.
int run_serving_demo(const demo_options& o);
/// The actor runtime across threads and through the remote seam.
int run_actor_demo();

}  // namespace tessera::cli
