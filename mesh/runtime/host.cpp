#include "mesh/runtime/host.hpp"

#include <fcntl.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include <fmt/format.h>

#include "actors/base/msgpack_bounded.hpp"
#include "mesh/node/advertise.hpp"
#include "mesh/runtime/messages.hpp"
#include "transport/control/cluster_key.hpp"

namespace tessera::mesh::runtime {

namespace fs = std::filesystem;
namespace ctl = transport::control;

std::int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

result<durable_election_state> read_election_state(const fs::path& file) {
  if (!fs::exists(file)) return durable_election_state{};
  std::ifstream in(file, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto d = unpack<durable_election_state>(data);
  if (!d)
    return make_error(errc::corrupt,
                      "{} does not decode as the election state; remove it to start over (this "
                      "node then forgets its term and vote)",
                      file.string());
  return *d;
}

bool same_listener(const std::string& a, const std::string& b) {
  if (a == b) return true;
  const auto ca = a.rfind(':'), cb = b.rfind(':');
  if (a.rfind("tcp://", 0) != 0 || b.rfind("tcp://", 0) != 0 || ca == std::string::npos ||
      cb == std::string::npos || a.substr(ca) != b.substr(cb))
    return false;
  return is_address_of_this_host(a.substr(6, ca - 6)) &&
         is_address_of_this_host(b.substr(6, cb - 6));
}

result<void> write_durable(const fs::path& dir, const std::string& name, const std::string& data) {
  const fs::path tmp = dir / (name + ".tmp");
  const fs::path dst = dir / name;
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    return make_error(errc::io, "cannot write {}: {}", tmp.string(), std::strerror(errno));
  std::size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      return make_error(errc::io, "cannot write {}: {}", tmp.string(), std::strerror(errno));
    }
    off += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    return make_error(errc::io, "fsync {}: {}", tmp.string(), std::strerror(errno));
  }
  ::close(fd);
  if (::rename(tmp.c_str(), dst.c_str()) != 0)
    return make_error(errc::io, "rename {} -> {}: {}", tmp.string(), dst.string(),
                      std::strerror(errno));
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  return ok();
}

topology::capabilities local_caps(const node_config& cfg, const std::string& hex,
                                  const std::string& version,
                                  const transport::bulk::local_capabilities& bulk) {
  topology::capabilities c;
  c.node_id = hex;
  c.version = version;
  c.cores = std::max(1u, std::thread::hardware_concurrency());
  struct sysinfo si {};
  if (::sysinfo(&si) == 0) {
    c.memory_total_mb = static_cast<std::uint64_t>(si.totalram) * si.mem_unit / (1024 * 1024);
    c.memory_free_mb = static_cast<std::uint64_t>(si.freeram) * si.mem_unit / (1024 * 1024);
  }
  if (cfg.memory_limit_mb != 0) {
    c.memory_total_mb = std::min<std::uint64_t>(c.memory_total_mb, cfg.memory_limit_mb);
    c.memory_free_mb = std::min<std::uint64_t>(c.memory_free_mb, cfg.memory_limit_mb);
  }
  c.host_id = bulk.host_id;
  c.has_rdma = bulk.has_rdma;
  c.pid = ::getpid();
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  c.hostname = host;
  c.fetches_models = cfg.fetch_models;
  // Each active port with the GID its links would use (empty without the rdma backend).
  c.rdma_devices = transport::bulk::describe_rdma_ports();
  for (const auto& m : cfg.model_paths)
    c.models.push_back(fs::path(m).filename().string());
  return c;
}

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::optional<std::string> insecure_clients_warning(const node_config& cfg) {
  if (is_loopback_address(cfg.listen.client_address) || cfg.client_auth) return std::nullopt;
  return fmt::format(
      "the client endpoints on {} (ports {}, {}) serve anyone who reaches them, without "
      "authentication (--insecure-clients): they may submit requests and cancel or read others'; "
      "--client-auth admits only holders of the cluster's client key",
      cfg.listen.client_address, cfg.listen.client_request_port, cfg.listen.client_response_port);
}

rlim_t raise_descriptor_limit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 0;
  const rlim_t want = std::min<rlim_t>(lim.rlim_max, kWantedDescriptors);
  if (lim.rlim_cur < want) {
    rlimit raised = lim;
    raised.rlim_cur = want;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) return want;
  }
  return lim.rlim_cur;
}

descriptor_budget budget_of(rlim_t limit) {
  if (limit == 0 || limit == RLIM_INFINITY) return {};
  const rlim_t reserved = std::min<rlim_t>(limit / 2, 4096);
  descriptor_budget b;
  b.client_connections = static_cast<std::uint32_t>(std::min<rlim_t>(limit - reserved, 1u << 20));
  b.http_threads = static_cast<std::uint32_t>(std::clamp<rlim_t>(reserved / 4, 4, 1024));
  return b;
}

std::optional<std::string> descriptor_warning(rlim_t limit) {
  if (limit == 0 || limit >= kFewDescriptors) return std::nullopt;
  return fmt::format(
      "only {} file descriptors (hard limit): connections held open by clients or strangers "
      "can exhaust them and cut this node off; raise it (ulimit -Hn, systemd LimitNOFILE) to "
      "{} or more",
      limit, kFewDescriptors);
}

long open_descriptors() {
  std::error_code ec;
  long n = 0;
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end;
       it.increment(ec))
    ++n;
  return ec ? -1 : n;
}

std::string client_host_for_peers(const node_config& cfg, const std::string& adv_host) {
  return is_loopback_address(cfg.listen.client_address) ? std::string("127.0.0.1") : adv_host;
}

result<std::string> read_api_key(const std::string& path) {
  auto text = ctl::read_private_text_file(path, "http.api_key_file");
  if (!text) return text.error();
  const std::string line = text->substr(0, text->find('\n'));
  const auto first = line.find_first_not_of(" \t\r\n");
  const auto last = line.find_last_not_of(" \t\r\n");
  if (first == std::string::npos)
    return make_error(errc::invalid_argument, "http.api_key_file {}: the first line is empty",
                      path);
  return line.substr(first, last - first + 1);
}

}  // namespace tessera::mesh::runtime
