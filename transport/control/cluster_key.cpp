#include "transport/control/cluster_key.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <sodium.h>
#include <zmq.h>

namespace tessera::transport::control {
namespace {

constexpr char kHex[] = "0123456789abcdef";

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n' || s.front() == '\t' ||
                        s.front() == '\r'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\t' ||
                        s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

result<void> derive(std::uint8_t* out, std::size_t len, std::uint64_t id, const char (&ctx)[9],
                    const cluster_secret& secret) {
  static_assert(crypto_kdf_CONTEXTBYTES == 8 && crypto_kdf_KEYBYTES == kClusterSecretSize);
  if (crypto_kdf_derive_from_key(out, len, id, ctx, secret.bytes.data()) != 0) {
    return make_error(errc::internal, "crypto_kdf_derive_from_key failed for context {}", ctx);
  }
  return ok();
}

result<curve_keypair> derive_keypair(std::uint64_t id, const char (&ctx)[9],
                                     const cluster_secret& secret) {
  curve_keypair kp;
  TESSERA_TRY(derive(kp.secret_key.data(), kp.secret_key.size(), id, ctx, secret));
  // crypto_scalarmult_base clamps the scalar itself, exactly as libzmq's CURVE does with it.
  if (crypto_scalarmult_base(kp.public_key.data(), kp.secret_key.data()) != 0) {
    return make_error(errc::internal, "crypto_scalarmult_base failed for context {}", ctx);
  }
  return kp;
}

}  // namespace

result<cluster_secret> generate_cluster_secret() {
  cluster_secret s;
  std::size_t got = 0;
  while (got < s.bytes.size()) {
    ssize_t n = ::getrandom(s.bytes.data() + got, s.bytes.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_error(errc::io, "getrandom: {}", std::strerror(errno));
    }
    got += static_cast<std::size_t>(n);
  }
  return s;
}

std::string format_cluster_secret(const cluster_secret& s, secret_format f) {
  if (f == secret_format::z85) return z85_key(s.bytes);
  std::string out;
  out.reserve(2 * s.bytes.size());
  for (auto b : s.bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 0xf]);
  }
  return out;
}

result<cluster_secret> parse_cluster_secret(std::string_view text, std::string_view origin) {
  text = trim(text);
  cluster_secret s;
  if (text.size() == 2 * kClusterSecretSize) {
    for (std::size_t i = 0; i < kClusterSecretSize; ++i) {
      int hi = hex_value(text[2 * i]);
      int lo = hex_value(text[2 * i + 1]);
      if (hi < 0 || lo < 0) {
        return make_error(errc::invalid_argument,
                          "{}: cluster secret has a non-hex character at position {}", origin,
                          hi < 0 ? 2 * i : 2 * i + 1);
      }
      s.bytes[i] = static_cast<std::uint8_t>(hi << 4 | lo);
    }
    return s;
  }
  if (text.size() == 40) {
    std::string z(text);
    if (zmq_z85_decode(s.bytes.data(), z.c_str()) == nullptr) {
      return make_error(errc::invalid_argument, "{}: cluster secret is not valid z85", origin);
    }
    return s;
  }
  return make_error(errc::invalid_argument,
                    "{}: cluster secret must be 64 hex or 40 z85 characters, found {} characters "
                    "(write one with `tessera keygen`)",
                    origin, text.size());
}

result<cluster_secret> read_cluster_secret_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error(errc::io, "{}: cannot open cluster key: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return make_error(errc::io, "{}: stat: {}", path, std::strerror(e));
  }
  if ((st.st_mode & 077) != 0) {
    ::close(fd);
    return make_error(errc::unauthorized,
                      "{}: cluster key is accessible by group or others (mode {:o}); run chmod 600",
                      path, st.st_mode & 0777);
  }
  char buf[256];
  std::size_t len = 0;
  while (len < sizeof buf) {
    ssize_t n = ::read(fd, buf + len, sizeof buf - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += static_cast<std::size_t>(n);
  }
  ::close(fd);
  if (len == sizeof buf) {
    return make_error(errc::invalid_argument, "{}: cluster key file is larger than {} bytes", path,
                      sizeof buf - 1);
  }
  auto r = parse_cluster_secret(std::string_view(buf, len), path);
  sodium_memzero(buf, sizeof buf);
  return r;
}

result<void> write_secret_file(const std::string& path, std::string_view text, bool overwrite) {
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (overwrite ? O_TRUNC : O_EXCL);
  int fd = ::open(path.c_str(), flags, 0600);
  if (fd < 0) {
    if (errno == EEXIST) {
      return make_error(errc::invalid_argument, "{}: file exists (use --force to replace it)", path);
    }
    return make_error(errc::io, "{}: cannot create: {}", path, std::strerror(errno));
  }
  // An existing file keeps its mode on O_TRUNC: tighten it before writing the secret.
  if (::fchmod(fd, 0600) != 0) {
    int e = errno;
    ::close(fd);
    return make_error(errc::io, "{}: chmod 600: {}", path, std::strerror(e));
  }
  std::string line(text);
  line.push_back('\n');
  std::size_t done = 0;
  while (done < line.size()) {
    ssize_t n = ::write(fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::close(fd);
      return make_error(errc::io, "{}: write: {}", path, std::strerror(e));
    }
    done += static_cast<std::size_t>(n);
  }
  sodium_memzero(line.data(), line.size());
  if (::close(fd) != 0) return make_error(errc::io, "{}: close: {}", path, std::strerror(errno));
  return ok();
}

result<cluster_secret> load_cluster_secret(const std::optional<std::string>& file) {
  if (file) return read_cluster_secret_file(*file);
  const char* env = std::getenv(kClusterKeyEnv);
  if (env == nullptr || *env == '\0') {
    return make_error(errc::not_found, "no cluster key: pass --cluster-key FILE or set {}",
                      kClusterKeyEnv);
  }
  if (env[0] == '@') return read_cluster_secret_file(std::string(env + 1));
  return parse_cluster_secret(env, kClusterKeyEnv);
}

result<cluster_keys> derive_cluster_keys(const cluster_secret& secret) {
  if (sodium_init() < 0) return make_error(errc::internal, "sodium_init failed");
  cluster_keys keys;
  std::array<std::uint8_t, 16> id{};
  TESSERA_TRY(derive(id.data(), id.size(), 1, "TSclstid", secret));
  for (auto b : id) {
    keys.cluster_id.push_back(kHex[b >> 4]);
    keys.cluster_id.push_back(kHex[b & 0xf]);
  }
  auto server = derive_keypair(2, "TScurvsv", secret);
  if (!server) return std::move(server).error();
  auto client = derive_keypair(3, "TScurvcl", secret);
  if (!client) return std::move(client).error();
  keys.server = *server;
  keys.client = *client;
  return keys;
}

std::string z85_key(const std::array<std::uint8_t, 32>& key) {
  char out[41] = {};
  zmq_z85_encode(out, key.data(), key.size());
  return std::string(out, 40);
}

}  // namespace tessera::transport::control
