// The progress bar's line, and that it stays silent when stderr is not a terminal.
#include "cli/progress.hpp"

#include <cstdio>

#include <gtest/gtest.h>

namespace tessera::cli {
namespace {

TEST(Progress, TheLineShowsTheBarThePercentTheBytesAndTheRate) {
  const std::uint64_t mib = 1024 * 1024;
  EXPECT_EQ(render_progress("loading m.gguf", 0, 10 * mib, 0.0, 10),
            "loading m.gguf  [..........]    0%  0.0/10.0 MiB");
  EXPECT_EQ(render_progress("loading m.gguf", 5 * mib, 10 * mib, 0.5, 10),
            "loading m.gguf  [#####.....]   50%  5.0/10.0 MiB  10 MiB/s");
  EXPECT_EQ(render_progress("x", 10 * mib, 10 * mib, 1.0, 4),
            "x  [####]  100%  10.0/10.0 MiB  10 MiB/s");
  // Beyond the total (a caller's rounding) the bar stops at full; an empty total is done.
  EXPECT_EQ(render_progress("x", 12, 10, 0.0, 4), "x  [####]  100%  0.0/0.0 MiB");
  EXPECT_EQ(render_progress("x", 0, 0, 0.0, 4), "x  [####]  100%  0.0/0.0 MiB");
}

TEST(Progress, NothingIsDrawnWhenTheOutputIsNotATerminal) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    progress_bar bar("loading", f);
    EXPECT_FALSE(bar.enabled());
    bar.update(1, 2);
    bar.update(2, 2);
  }
  EXPECT_EQ(std::ftell(f), 0L);
  std::fclose(f);
}

}  // namespace
}  // namespace tessera::cli
