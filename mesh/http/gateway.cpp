// The gateway's life: binding (the error names the address and port), cpp-httplib's settings
// (timeouts, the socket options, the listen backlog), the handler pool, and stopping with a drain.
#include "mesh/http/gateway.hpp"

#include <sys/socket.h>

#include <chrono>
#include <thread>

#include <spdlog/spdlog.h>

#include "actors/base/thread.hpp"
#include "mesh/http/elastic_pool.hpp"
#include "mesh/http/gateway_impl.hpp"

namespace tessera::mesh::http {
namespace {

using clock_type = std::chrono::steady_clock;

/// Connections the kernel completes and holds for the accept loop (capped by net.core.somaxconn).
constexpr int kListenBacklog = 1024;

/// cpp-httplib's task queue on the elastic pool: one idle handler thread, up to `threads` while
/// connections are open, and as many accepted connections waiting for one; beyond that the accept
/// loop waits and connections stay in the kernel's backlog (elastic_pool.hpp says why).
/// `release`: the gateway is stopping (waits end).
class pool_queue final : public httplib::TaskQueue {
 public:
  pool_queue(std::size_t threads, const std::atomic<bool>* release)
      : pool_(elastic_pool_options{
            .min_threads = 1, .max_threads = threads, .max_queued = threads, .release = release}) {}
  void enqueue(std::function<void()> fn) override { pool_.enqueue(std::move(fn)); }
  void shutdown() override { pool_.shutdown(); }

 private:
  elastic_pool pool_;
};

}  // namespace

gateway::gateway(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

gateway::~gateway() {
  stop();
}

result<std::unique_ptr<gateway>> gateway::start(gateway_options options) {
  if (options.peers.empty())
    return make_error(errc::invalid_argument, "http gateway: no client endpoint to send to");
  auto p = std::make_unique<impl>();
  p->opt = std::move(options);
  const auto threads = p->opt.threads;
  const std::atomic<bool>* release = &p->stopping;
  p->svr.new_task_queue = [threads, release] { return new pool_queue(threads, release); };
  p->svr.set_payload_max_length(p->opt.max_body_bytes);
  // cpp-httplib's default sets SO_REUSEPORT: a second process could then bind the same port and
  // take every other connection (even another cluster's node). SO_REUSEADDR only: a taken port
  // is refused with a clear error.
  impl* raw = p.get();
  p->svr.set_socket_options([raw](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    raw->listen_fd = sock;
  });
  // A client that stops sending (a PUT without its body, a slow drip) holds a handler for at
  // most this long per read.
  p->svr.set_read_timeout(10);
  p->svr.set_write_timeout(30);
  // An open connection that sends no request holds its handler this long.
  p->svr.set_keep_alive_timeout(5);
  p->svr.set_keep_alive_max_count(100);
  p->routes();
  const auto& addr = p->opt.bind_address;
  if (p->opt.port == 0) {
    const int port = p->svr.bind_to_any_port(addr);
    if (port <= 0) return make_error(errc::io, "http gateway: cannot bind {}:<any port>", addr);
    p->port = static_cast<std::uint16_t>(port);
  } else {
    if (!p->svr.bind_to_port(addr, p->opt.port))
      return make_error(errc::io,
                        "http gateway: cannot bind {}:{} (in use, or not an address of "
                        "this machine); set listen.http_port",
                        addr, p->opt.port);
    p->port = p->opt.port;
  }
  // cpp-httplib listens with a backlog of 5: a burst of connections (a stranger's, or many
  // clients at once) overflowed it and every later connect, an honest one too, waited for SYN
  // retries (1 s, 3 s, 7 s, ...). listen() again on the bound socket only raises the backlog.
  if (p->listen_fd >= 0) (void)::listen(p->listen_fd, kListenBacklog);
  p->listener = std::thread([raw] {
    name_this_thread("http-accept");
    raw->svr.listen_after_bind();
  });
  // cpp-httplib's stop() does nothing until the listener thread has marked the server running:
  // a gateway stopped right after it started would leave that thread in accept() for good (and
  // stop() joining it). Wait for it (bounded; it takes microseconds).
  for (int i = 0; i < 5000 && !p->svr.is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  spdlog::info("http gateway: http://{}:{}/ ({})", addr, p->port,
               p->opt.api_key.empty() ? "no API key" : "API key required");
  return std::unique_ptr<gateway>(new gateway(std::move(p)));
}

void gateway::stop(std::uint32_t drain_ms) {
  if (!impl_ || impl_->closing.exchange(true)) return;
  const auto end = clock_type::now() + std::chrono::milliseconds(drain_ms);
  while (impl_->in_flight.load() > 0 && clock_type::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  impl_->stopping = true;
  impl_->svr.stop();
  if (impl_->listener.joinable()) impl_->listener.join();
}

std::uint16_t gateway::port() const {
  return impl_->port;
}

}  // namespace tessera::mesh::http
