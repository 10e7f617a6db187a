// The engine's life as the node runtime drives it: the control actor goes on reading the engine's
// status and handing it plans while a leaving node announces its leave, after engine::stop().
// (The split by concern once freed the client port in stop(): the next status snapshot read
// through a null pointer, seen by UBSan in CI, 2026-12-07.)
#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "inference/gguf/synth.hpp"
#include "mesh/serving/engine.hpp"

namespace tessera::mesh::serving {
namespace {

namespace fs = std::filesystem;
namespace gguf = inference::gguf;

TEST(EngineLifecycle, StatusAndPlansAfterStopAreServedWithoutTheEndpoints) {
  const fs::path dir = fs::temp_directory_path() / ("tessera-engine-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  gguf::synth_config c;
  c.dim = 64;
  c.layers = 1;
  c.heads = 2;
  c.kv_heads = 1;
  c.ffn = 128;
  c.vocab = 512;
  c.context = 64;
  const std::string model = (dir / "m.gguf").string();
  ASSERT_TRUE(gguf::write_synthetic_model(c, model));
  engine_options o;
  o.node_hex = "0123456789abcdef0123456789abcdef";
  o.self = 0x0123456789abcdefULL;
  o.model_paths = {model};
  o.bind_address = "127.0.0.1";
  o.fetch_dir = (dir / "models").string();
  auto e = engine::start(o);
  ASSERT_TRUE(e) << e.error().describe();
  const auto request_port = (*e)->request_port();
  EXPECT_NE(request_port, 0);
  (*e)->stop();
  const auto st = (*e)->status();
  EXPECT_EQ(st["request_port"].get<std::uint16_t>(), request_port) << st.dump();
  EXPECT_TRUE(st["streams"].empty()) << st.dump();
  (*e)->set_plan(nullptr, {}, {}, {});  // a leave's last view: no plan
  EXPECT_EQ((*e)->response_port(), st["response_port"].get<std::uint16_t>());
  (*e)->stop();  // idempotent
  e->reset();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera::mesh::serving
