#include "mesh/runtime/status_client.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <mutex>

#include <fmt/format.h>

#include "mesh/discovery/peer_hint.hpp"
#include "mesh/runtime/runtime.hpp"

namespace tessera::mesh::runtime {

namespace ctl = transport::control;

result<std::string> local_address_towards(const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0)
    return make_error(errc::not_found, "cannot resolve '{}': {}", host, ::gai_strerror(rc));
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  std::string out;
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf);
      out = buf;
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  if (out.empty()) return make_error(errc::io, "no local address reaches '{}'", host);
  return out;
}

struct status_client::impl {
  std::unique_ptr<ctl::control_node> node;
  std::string request;  // every status.request's body: where the node asked dials back
  std::mutex mu;        // guards node and targets (ask() and stop() may run on any thread)
  std::map<std::string, std::string> targets;  // "tcp://host:port" -> our peer name for it
};

status_client::status_client(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

status_client::~status_client() {
  stop();
}

result<std::unique_ptr<status_client>> status_client::start(status_client_options options,
                                                            reply_fn on_reply) {
  auto p = std::make_unique<impl>();
  ctl::node_config cc;
  cc.node_id = fmt::format("{}{:016x}", status_client_prefix, options.id_seed);
  cc.bind_endpoint = fmt::format("tcp://{}:*", options.bind_address);
  cc.keys = options.keys;
  // The nodes asked dial us back; nobody else is let in (a heartbeat from a stranger adds no
  // peer), and the replies come from links we did not dial (delivered all the same).
  cc.accept_unknown_peers = false;
  cc.max_peers = kMaxStatusTargets;
  cc.timing.heartbeat_interval_ms = 100;
  ctl::node_handlers handlers;
  handlers.on_message = [on_reply = std::move(on_reply)](ctl::inbound_message&& m) {
    if (m.type != static_cast<std::uint16_t>(runtime_msg::status_reply)) return;
    auto doc = unpack<std::string>(m.body);
    if (!doc) return;  // not a status document: the asked node is broken or not a tessera node
    on_reply(m.sender, std::move(*doc));
  };
  auto node = ctl::control_node::start(cc, handlers);
  if (!node) return node.error();
  p->node = std::move(node).value();
  const std::string bound = p->node->endpoint();
  p->request =
      pack(options.reply_address.empty() ? bound
                                         : fmt::format("tcp://{}:{}", options.reply_address,
                                                       bound.substr(bound.rfind(':') + 1)));
  return std::unique_ptr<status_client>(new status_client(std::move(p)));
}

result<void> status_client::ask(const std::string& target,
                                const std::vector<std::string>& fault_commands) {
  std::string text = target;
  if (text.rfind("tcp://", 0) == 0) text = text.substr(6);
  auto ep = parse_endpoint(text);
  if (!ep) return make_error(errc::invalid_argument, "status target: {}", ep.error().message);
  const std::string url = "tcp://" + ep->to_string();
  // Under the lock throughout: stop() may run on another thread, and send() never blocks.
  std::lock_guard lock(impl_->mu);
  if (!impl_->node) return make_error(errc::closed, "the status client has stopped");
  std::string peer;
  if (auto it = impl_->targets.find(url); it != impl_->targets.end()) {
    peer = it->second;
  } else {
    if (impl_->targets.size() >= kMaxStatusTargets)
      return make_error(errc::no_capacity, "status client: {} nodes asked already (the bound)",
                        kMaxStatusTargets);
    peer = fmt::format("target-{}", impl_->targets.size());
    TESSERA_TRY(impl_->node->add_peer(peer, url));
    impl_->targets.emplace(url, peer);
  }
  for (const auto& f : fault_commands)
    TESSERA_TRY(impl_->node->send(peer, ctl::msg_type::fault_set, bytes_of(f)));
  return impl_->node->send(peer, static_cast<std::uint16_t>(runtime_msg::status_request),
                           bytes_of(impl_->request));
}

std::uint64_t status_client::handshakes_refused() const {
  std::lock_guard lock(impl_->mu);
  return impl_->node ? impl_->node->stats().handshake_failed_outbound : 0;
}

void status_client::stop() {
  std::unique_ptr<ctl::control_node> node;
  {
    std::lock_guard lock(impl_->mu);
    node = std::move(impl_->node);
  }
  if (node) node->stop();
}

}  // namespace tessera::mesh::runtime
