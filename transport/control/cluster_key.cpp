#include "transport/control/cluster_key.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <span>

#include <fmt/format.h>
#include <sodium.h>
#include <zmq.h>

#include "actors/base/random.hpp"

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
  TESSERA_TRY(fill_random(std::as_writable_bytes(std::span(s.bytes))));
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

namespace {
/// Reads a small secret file (`what` names it in errors) into `buf`, refusing files readable or
/// writable by group or others; returns the length.
result<std::size_t> read_private_file(const std::string& path, std::string_view what, char* buf,
                                      std::size_t cap) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return make_error(errc::io, "{}: cannot open {}: {}", path, what, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return make_error(errc::io, "{}: stat: {}", path, std::strerror(e));
  }
  if ((st.st_mode & 077) != 0) {
    ::close(fd);
    return make_error(errc::unauthorized,
                      "{}: {} is accessible by group or others (mode {:o}); run chmod 600", path,
                      what, st.st_mode & 0777);
  }
  std::size_t len = 0;
  while (len < cap) {
    ssize_t n = ::read(fd, buf + len, cap - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += static_cast<std::size_t>(n);
  }
  ::close(fd);
  if (len == cap) {
    sodium_memzero(buf, cap);
    return make_error(errc::invalid_argument, "{}: {} file is larger than {} bytes", path, what,
                      cap - 1);
  }
  return len;
}
}  // namespace

result<std::string> read_private_text_file(const std::string& path, std::string_view what,
                                           std::size_t max_bytes) {
  std::string text(max_bytes + 1, '\0');
  auto len = read_private_file(path, what, text.data(), text.size());
  if (!len) return len.error();
  text.resize(*len);
  return text;
}

result<cluster_secret> read_cluster_secret_file(const std::string& path) {
  char buf[256];
  auto len = read_private_file(path, "cluster key", buf, sizeof buf);
  if (!len) return len.error();
  auto r = parse_cluster_secret(std::string_view(buf, *len), path);
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
  auto endpoint = derive_keypair(4, "TSclisrv", secret);
  if (!endpoint) return std::move(endpoint).error();
  auto access = derive_keypair(5, "TSclikey", secret);
  if (!access) return std::move(access).error();
  keys.server = *server;
  keys.client = *client;
  keys.client_endpoint = *endpoint;
  keys.access.cluster_id = keys.cluster_id;
  keys.access.server_public = endpoint->public_key;
  keys.access.client = *access;
  return keys;
}

std::string format_client_access(const client_access& a) {
  return fmt::format(
      "# tessera client access key of cluster {}: lets a client submit requests and read token\n"
      "# streams on peers started with --client-auth; it cannot join the cluster. Keep it "
      "private.\n"
      "cluster-id {}\nserver-public {}\nclient-public {}\nclient-secret {}",
      a.cluster_id, a.cluster_id, z85_key(a.server_public), z85_key(a.client.public_key),
      z85_key(a.client.secret_key));
}

result<client_access> parse_client_access(std::string_view text, std::string_view origin) {
  if (sodium_init() < 0) return make_error(errc::internal, "sodium_init failed");
  client_access a;
  bool have_server = false, have_public = false, have_secret = false;
  std::size_t line_no = 0;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    std::string_view line = trim(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    ++line_no;
    if (line.empty() || line.front() == '#') continue;
    const std::size_t sp = line.find(' ');
    const std::string_view key = line.substr(0, sp);
    const std::string_view value = sp == std::string_view::npos ? "" : trim(line.substr(sp + 1));
    if (key == "cluster-id") {
      a.cluster_id = std::string(value);
      continue;
    }
    std::array<std::uint8_t, 32>* out = nullptr;
    if (key == "server-public") {
      out = &a.server_public;
      have_server = true;
    } else if (key == "client-public") {
      out = &a.client.public_key;
      have_public = true;
    } else if (key == "client-secret") {
      out = &a.client.secret_key;
      have_secret = true;
    } else {
      // Never echo the line: a cluster key file given by mistake would print the secret.
      return make_error(errc::invalid_argument,
                        "{}: line {}: not a line of a client access key (a cluster key file? "
                        "clients take the file `tessera keygen --client-key FILE` writes)",
                        origin, line_no);
    }
    const std::string z85(value);
    if (z85.size() != 40 || zmq_z85_decode(out->data(), z85.c_str()) == nullptr) {
      return make_error(errc::invalid_argument, "{}: line {}: {} is not a 40-character z85 key",
                        origin, line_no, key);
    }
  }
  if (!have_server || !have_public || !have_secret) {
    return make_error(errc::invalid_argument,
                      "{}: not a client access key (needs server-public, client-public and "
                      "client-secret; write one with `tessera keygen --client-key FILE`)",
                      origin);
  }
  std::array<std::uint8_t, 32> derived{};
  if (crypto_scalarmult_base(derived.data(), a.client.secret_key.data()) != 0 ||
      derived != a.client.public_key) {
    return make_error(errc::invalid_argument,
                      "{}: client-public does not belong to client-secret (a damaged key file)",
                      origin);
  }
  return a;
}

result<client_access> read_client_access_file(const std::string& path) {
  char buf[1024];
  auto len = read_private_file(path, "client access key", buf, sizeof buf);
  if (!len) return len.error();
  auto r = parse_client_access(std::string_view(buf, *len), path);
  sodium_memzero(buf, sizeof buf);
  return r;
}

result<std::optional<client_access>> load_client_access(const std::optional<std::string>& file) {
  if (file) {
    auto a = read_client_access_file(*file);
    if (!a) return a.error();
    return std::optional<client_access>(std::move(*a));
  }
  if (const char* env = std::getenv(kClientKeyEnv); env != nullptr && *env != '\0') {
    auto a = read_client_access_file(env[0] == '@' ? std::string(env + 1) : std::string(env));
    if (!a) return a.error();
    return std::optional<client_access>(std::move(*a));
  }
  // Not derived from $TESSERA_CLUSTER_KEY when that is set: a host of an open cluster would
  // then speak CURVE to peers that do not, and be refused.
  return std::optional<client_access>{};
}

std::string z85_key(const std::array<std::uint8_t, 32>& key) {
  char out[41] = {};
  zmq_z85_encode(out, key.data(), key.size());
  return std::string(out, 40);
}

}  // namespace tessera::transport::control
