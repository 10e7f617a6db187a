#include "mesh/serving/connection_guard.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace tessera::mesh::serving {

bool connection_ledger::opened(int slot, int fd, const std::string& address) {
  // A descriptor libzmq reports again was closed without our seeing it (its monitor lost the
  // event): count it once.
  closed(slot, fd);
  address_of_[{slot, fd}] = address;
  const std::uint32_t from = ++per_address_[{slot, address}];
  ++total_;
  return from <= limits_.per_address && total_ <= limits_.total;
}

void connection_ledger::closed(int slot, int fd) {
  auto it = address_of_.find({slot, fd});
  if (it == address_of_.end()) return;
  auto pa = per_address_.find({slot, it->second});
  if (pa != per_address_.end() && --pa->second == 0) per_address_.erase(pa);
  --total_;
  address_of_.erase(it);
}

void connection_ledger::forget(int slot) {
  for (auto it = address_of_.begin(); it != address_of_.end();) {
    if (it->first.first == slot) {
      auto pa = per_address_.find({slot, it->second});
      if (pa != per_address_.end() && --pa->second == 0) per_address_.erase(pa);
      --total_;
      it = address_of_.erase(it);
    } else {
      ++it;
    }
  }
}

std::uint32_t connection_ledger::open_from(int slot, const std::string& address) const {
  auto it = per_address_.find({slot, address});
  return it == per_address_.end() ? 0 : it->second;
}

namespace {

/// The remote address of socket `fd` if it is a tcp connection accepted on local `port`, else
/// nullopt (the descriptor is no longer the connection the event named).
std::optional<std::string> accepted_peer(int fd, std::uint16_t port) {
  sockaddr_storage local{}, remote{};
  socklen_t ll = sizeof local, rl = sizeof remote;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &rl) != 0)
    return std::nullopt;
  char text[INET6_ADDRSTRLEN] = {};
  if (local.ss_family == AF_INET && remote.ss_family == AF_INET) {
    const auto& l = reinterpret_cast<const sockaddr_in&>(local);
    const auto& r = reinterpret_cast<const sockaddr_in&>(remote);
    if (ntohs(l.sin_port) != port) return std::nullopt;
    ::inet_ntop(AF_INET, &r.sin_addr, text, sizeof text);
    return std::string(text);
  }
  if (local.ss_family == AF_INET6 && remote.ss_family == AF_INET6) {
    const auto& l = reinterpret_cast<const sockaddr_in6&>(local);
    const auto& r = reinterpret_cast<const sockaddr_in6&>(remote);
    if (ntohs(l.sin6_port) != port) return std::nullopt;
    ::inet_ntop(AF_INET6, &r.sin6_addr, text, sizeof text);
    return std::string(text);
  }
  return std::nullopt;
}

/// The port of a tcp endpoint "tcp://host:port" (0 when there is none).
std::uint16_t listening_port_of(std::string_view endpoint) {
  const auto colon = endpoint.rfind(':');
  if (colon == std::string_view::npos) return 0;
  unsigned port = 0;
  for (char c : endpoint.substr(colon + 1)) {
    if (c < '0' || c > '9' || port > 65535) return 0;
    port = port * 10 + static_cast<unsigned>(c - '0');
  }
  return port <= 65535 ? static_cast<std::uint16_t>(port) : 0;
}

}  // namespace

void connection_guard::watch(int slot, zmq::socket_t& s) {
  forget(slot);
  const std::string ep =
      fmt::format("inproc://client-connections-{}-{}", static_cast<void*>(this), ++generation_);
  if (::zmq_socket_monitor(s.handle(), ep.c_str(), ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) !=
      0)
    throw zmq::error_t();
  watched_[slot] = s.handle();
  auto& m = monitors_[slot].emplace(ctx_, zmq::socket_type::pair);
  m.set(zmq::sockopt::linger, 0);
  m.set(zmq::sockopt::rcvhwm, kMaxQueuedEvents);
  m.connect(ep);
}

void connection_guard::forget(int slot) {
  // libzmq sends each event from its I/O thread with a blocking send on the monitor's PAIR
  // socket, under the watched socket's monitor lock. Closing our end first left that send with
  // no peer: the next event (the watched socket's connections ending as it closes) blocked the
  // context's only I/O thread for good, and no client socket of the node moved again (the
  // response-port reset hung every later request). So: read what is queued — a send blocked
  // on a full queue would hold the lock the stop below takes — then stop the monitor while
  // the socket is open, then close our end.
  if (watched_[slot] != nullptr) {
    if (monitors_[slot]) {
      for (int n = 0; n < kMaxQueuedEvents; ++n) {
        zmq::message_t frame;
        if (!monitors_[slot]->recv(frame, zmq::recv_flags::dontwait)) break;
        while (frame.more()) (void)monitors_[slot]->recv(frame, zmq::recv_flags::none);
      }
    }
    (void)::zmq_socket_monitor(watched_[slot], nullptr, 0);
    watched_[slot] = nullptr;
  }
  monitors_[slot].reset();
  ledger_.forget(slot);
}

void* connection_guard::monitor_handle(int slot) {
  return monitors_[slot] ? monitors_[slot]->handle() : nullptr;
}

void connection_guard::drain(int slot) {
  if (!monitors_[slot]) return;
  auto& m = *monitors_[slot];
  for (int n = 0; n < 1024; ++n) {  // bounded: the other endpoints are served in between
    zmq::message_t event, endpoint;
    if (!m.recv(event, zmq::recv_flags::dontwait)) return;
    if (event.more()) (void)m.recv(endpoint, zmq::recv_flags::none);
    if (event.size() < 6) continue;
    std::uint16_t what = 0;
    std::uint32_t value = 0;
    std::memcpy(&what, event.data(), 2);
    std::memcpy(&value, static_cast<const char*>(event.data()) + 2, 4);
    const int fd = static_cast<int>(value);
    if (what == ZMQ_EVENT_DISCONNECTED) {
      ledger_.closed(slot, fd);
      continue;
    }
    if (what != ZMQ_EVENT_ACCEPTED) continue;
    // The connection may have ended already (its DISCONNECTED is queued behind this event): then
    // the descriptor is not it any more, and it is neither counted nor touched.
    const auto peer = accepted_peer(fd, listening_port_of(endpoint.to_string_view()));
    if (!peer) continue;
    if (ledger_.opened(slot, fd, *peer)) continue;
    ::shutdown(fd, SHUT_RDWR);
    ++refused_;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_log_ >= std::chrono::seconds(1)) {
      last_log_ = now;
      spdlog::warn(
          "serving {}: refused a client connection from {} on {}: {} open from that address "
          "(bound {}), {} on the client endpoints (bound {}); {} refused so far",
          who_, *peer, endpoint.to_string_view(), ledger_.open_from(slot, *peer),
          ledger_.limits().per_address, ledger_.open(), ledger_.limits().total, refused_);
    }
  }
}

}  // namespace tessera::mesh::serving
