#include "actors/base/random.hpp"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

namespace tessera {

result<void> fill_random(std::span<std::byte> out) {
  std::size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::getrandom(out.data() + got, out.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_error(errc::io, "getrandom: {}", std::strerror(errno));
    }
    got += static_cast<std::size_t>(n);
  }
  return ok();
}

}  // namespace tessera
