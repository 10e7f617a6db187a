#include "mesh/discovery/mdns_source.hpp"

#include <avahi-client/client.h>
#include <avahi-client/lookup.h>
#include <avahi-client/publish.h>
#include <avahi-common/address.h>
#include <avahi-common/alternative.h>
#include <avahi-common/error.h>
#include <avahi-common/malloc.h>
#include <avahi-common/strlst.h>
#include <avahi-common/thread-watch.h>
#include <avahi-common/timeval.h>

#include <algorithm>

#include "actors/base/log.hpp"
#include "actors/base/thread.hpp"
#include "mesh/discovery/mdns_txt.hpp"

namespace tessera::mesh {

const char* to_string(mdns_state s) noexcept {
  switch (s) {
    case mdns_state::stopped:
      return "stopped";
    case mdns_state::connecting:
      return "connecting";
    case mdns_state::running:
      return "running";
  }
  return "unknown";
}

// The C callbacks avahi calls on its poll thread; each forwards to the mdns_source.
struct mdns_callbacks {
  // The first callback avahi's poll thread runs (the timer is due at start): it names the thread.
  static void retry_timer(AvahiTimeout*, void* self) {
    name_this_thread("mdns");
    static_cast<mdns_source*>(self)->connect();
  }

  static void client(AvahiClient* c, AvahiClientState state, void* userdata) {
    auto* self = static_cast<mdns_source*>(userdata);
    switch (state) {
      case AVAHI_CLIENT_S_RUNNING:
        if (self->outage_logged_) spdlog::info("mdns: connected to avahi-daemon again");
        self->outage_logged_ = false;
        self->backoff_ms_ = 0;
        self->state_.store(mdns_state::running);
        if (self->options_.publish) self->publish(c);
        if (self->options_.browse) self->browse(c);
        break;
      case AVAHI_CLIENT_S_COLLISION:
      case AVAHI_CLIENT_S_REGISTERING:
        // The daemon's host name changed or collided: our records go away until it settles,
        // then S_RUNNING re-publishes them.
        if (self->group_) avahi_entry_group_reset(self->group_);
        break;
      case AVAHI_CLIENT_CONNECTING:
        self->state_.store(mdns_state::connecting);
        break;
      case AVAHI_CLIENT_FAILURE:
        // Daemon or bus gone. Freeing the client inside its own callback is unsafe; a zero-delay
        // timer does it from the poll loop.
        self->client_ = c;
        self->state_.store(mdns_state::connecting);
        self->counters_.reconnects.fetch_add(1, std::memory_order_relaxed);
        if (!self->outage_logged_) {
          spdlog::warn("mdns: lost avahi-daemon ({}); retrying, other discovery sources go on",
                       avahi_strerror(avahi_client_errno(c)));
          self->outage_logged_ = true;
        }
        self->schedule_retry(0);
        break;
    }
  }

  static void group(AvahiEntryGroup* g, AvahiEntryGroupState state, void* userdata) {
    auto* self = static_cast<mdns_source*>(userdata);
    if (state == AVAHI_ENTRY_GROUP_COLLISION) {
      char* alt = avahi_alternative_service_name(self->current_name_.c_str());
      spdlog::info("mdns: service name '{}' taken, using '{}'", self->current_name_, alt);
      self->current_name_ = alt;
      avahi_free(alt);
      avahi_entry_group_reset(g);
      self->publish(avahi_entry_group_get_client(g));
    } else if (state == AVAHI_ENTRY_GROUP_FAILURE) {
      spdlog::warn("mdns: publishing '{}' failed: {}", self->current_name_,
                   avahi_strerror(avahi_client_errno(avahi_entry_group_get_client(g))));
    }
  }

  static void browse(AvahiServiceBrowser* b, AvahiIfIndex iface, AvahiProtocol proto,
                     AvahiBrowserEvent event, const char* name, const char* type,
                     const char* domain, AvahiLookupResultFlags, void* userdata) {
    auto* self = static_cast<mdns_source*>(userdata);
    if (event == AVAHI_BROWSER_FAILURE) {
      spdlog::warn("mdns: browsing failed: {}",
                   avahi_strerror(avahi_client_errno(avahi_service_browser_get_client(b))));
      return;  // a daemon restart shows up as a client FAILURE, which rebuilds everything
    }
    if (event != AVAHI_BROWSER_NEW) return;  // REMOVE: hints only; membership judges liveness
    if (self->pending_resolves_ >= self->options_.max_pending_resolves) {
      self->counters_.dropped.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    // Only IPv4 addresses: the control plane binds IPv4 (listen.address).
    if (avahi_service_resolver_new(avahi_service_browser_get_client(b), iface, proto, name, type,
                                   domain, AVAHI_PROTO_INET, AvahiLookupFlags(0), resolve, self)) {
      ++self->pending_resolves_;
    } else {
      self->counters_.dropped.fetch_add(1, std::memory_order_relaxed);
    }
  }

  static void resolve(AvahiServiceResolver* r, AvahiIfIndex, AvahiProtocol,
                      AvahiResolverEvent event, const char* name, const char*, const char*,
                      const char*, const AvahiAddress* address, std::uint16_t port,
                      AvahiStringList* txt, AvahiLookupResultFlags, void* userdata) {
    auto* self = static_cast<mdns_source*>(userdata);
    --self->pending_resolves_;
    if (event == AVAHI_RESOLVER_FOUND) self->on_resolved(name, address, port, txt);
    avahi_service_resolver_free(r);
  }
};

result<std::unique_ptr<mdns_source>> mdns_source::create(mdns_options options) {
  if (!is_node_id_text(options.node_id)) {
    return make_error(errc::invalid_argument, "mdns: node id '{}' is not 32 hex digits",
                      options.node_id);
  }
  if (!is_cluster_id_text(options.cluster_id)) {
    return make_error(errc::invalid_argument, "mdns: bad cluster id '{}'", options.cluster_id);
  }
  if (options.control_port == 0) return make_error(errc::invalid_argument, "mdns: control port 0");
  if (options.retry_min_ms == 0 || options.retry_max_ms < options.retry_min_ms) {
    return make_error(errc::invalid_argument, "mdns: retry_min_ms must be 1..retry_max_ms");
  }
  if (options.service_name.empty())
    options.service_name = "tessera-" + options.node_id.substr(0, 12);
  if (options.service_name.size() > 63) {
    return make_error(errc::invalid_argument, "mdns: service name longer than 63 bytes");
  }
  return std::unique_ptr<mdns_source>(new mdns_source(std::move(options)));
}

mdns_source::mdns_source(mdns_options options)
    : options_(std::move(options)), current_name_(options_.service_name) {}

mdns_source::~mdns_source() {
  stop();
}

result<void> mdns_source::start(hint_sink sink) {
  TESSERA_ASSERT(poll_ == nullptr, "mdns_source::start called twice");
  TESSERA_ASSERT(sink != nullptr, "mdns_source::start without a sink");
  sink_ = std::move(sink);
  poll_ = avahi_threaded_poll_new();
  if (!poll_) return make_error(errc::io, "mdns: cannot create avahi's poll thread");
  const AvahiPoll* api = avahi_threaded_poll_get(poll_);
  timeval now{};
  avahi_elapse_time(&now, 0, 0);
  retry_timer_ = api->timeout_new(api, &now, mdns_callbacks::retry_timer, this);
  state_.store(mdns_state::connecting);
  if (avahi_threaded_poll_start(poll_) < 0) {
    avahi_threaded_poll_free(poll_);
    poll_ = nullptr;
    state_.store(mdns_state::stopped);
    return make_error(errc::io, "mdns: cannot start avahi's poll thread");
  }
  return ok();
}

void mdns_source::stop() {
  if (!poll_) return;
  avahi_threaded_poll_stop(poll_);  // joins the poll thread; nothing runs concurrently after this
  if (client_) avahi_client_free(client_);  // frees the group, browser and resolvers too
  client_ = nullptr;
  group_ = nullptr;
  browser_ = nullptr;
  avahi_threaded_poll_free(poll_);  // frees the timer with it
  poll_ = nullptr;
  retry_timer_ = nullptr;
  state_.store(mdns_state::stopped);
}

discovery_stats mdns_source::stats() const {
  discovery_stats s;
  s.hints = counters_.hints.load();
  s.foreign_cluster = counters_.foreign.load();
  s.malformed = counters_.malformed.load();
  s.self = counters_.self.load();
  s.reconnects = counters_.reconnects.load();
  s.dropped = counters_.dropped.load();
  return s;
}

std::string mdns_source::published_name() const {
  if (!poll_) return current_name_;
  avahi_threaded_poll_lock(poll_);
  std::string name = current_name_;
  avahi_threaded_poll_unlock(poll_);
  return name;
}

void mdns_source::schedule_retry(std::uint32_t delay_ms) {
  timeval when{};
  avahi_elapse_time(&when, delay_ms, 0);
  avahi_threaded_poll_get(poll_)->timeout_update(retry_timer_, &when);
}

void mdns_source::drop_client_and_retry(const char* why) {
  if (client_) avahi_client_free(client_);
  client_ = nullptr;
  group_ = nullptr;
  browser_ = nullptr;
  pending_resolves_ = 0;
  state_.store(mdns_state::connecting);
  backoff_ms_ =
      backoff_ms_ == 0 ? options_.retry_min_ms : std::min(backoff_ms_ * 2, options_.retry_max_ms);
  if (!outage_logged_) {
    spdlog::warn(
        "mdns: avahi unavailable ({}); retrying every {}..{} ms, other discovery "
        "sources go on",
        why, options_.retry_min_ms, options_.retry_max_ms);
    outage_logged_ = true;
  }
  schedule_retry(backoff_ms_);
}

void mdns_source::connect() {
  if (client_) {
    // A FAILURE left the old client for us to free; the retry comes after the backoff.
    drop_client_and_retry("connection lost");
    return;
  }
  int error = 0;
  // NO_FAIL: if the bus is up but the daemon is not, the client waits for it (CONNECTING).
  AvahiClient* c = avahi_client_new(avahi_threaded_poll_get(poll_), AVAHI_CLIENT_NO_FAIL,
                                    mdns_callbacks::client, this, &error);
  if (!c) {
    drop_client_and_retry(avahi_strerror(error));
    return;
  }
  if (state_.load() == mdns_state::connecting && client_ == c) {
    // FAILURE was reported during construction; the zero-delay retry frees it.
    return;
  }
  client_ = c;
}

void mdns_source::publish(AvahiClient* c) {
  if (!group_) {
    group_ = avahi_entry_group_new(c, mdns_callbacks::group, this);
    if (!group_) {
      spdlog::warn("mdns: cannot create entry group: {}", avahi_strerror(avahi_client_errno(c)));
      return;
    }
  }
  if (!avahi_entry_group_is_empty(group_)) return;
  AvahiStringList* txt = nullptr;
  for (const auto& entry : encode_txt({options_.cluster_id, options_.node_id, options_.control_port,
                                       options_.protocol_version})) {
    txt = avahi_string_list_add(txt, entry.c_str());
  }
  int rc = avahi_entry_group_add_service_strlst(
      group_, AVAHI_IF_UNSPEC, AVAHI_PROTO_INET, AvahiPublishFlags(0), current_name_.c_str(),
      mdns_service_type, nullptr, nullptr, options_.control_port, txt);
  avahi_string_list_free(txt);
  if (rc == AVAHI_ERR_COLLISION) {
    char* alt = avahi_alternative_service_name(current_name_.c_str());
    current_name_ = alt;
    avahi_free(alt);
    avahi_entry_group_reset(group_);
    publish(c);
    return;
  }
  if (rc < 0 || avahi_entry_group_commit(group_) < 0) {
    spdlog::warn("mdns: publishing '{}' failed: {}", current_name_,
                 avahi_strerror(avahi_client_errno(c)));
  }
}

void mdns_source::on_resolved(const char* name, const AvahiAddress* address, std::uint16_t port,
                              AvahiStringList* txt) {
  std::vector<std::string> entries;
  std::size_t count = 0;
  for (AvahiStringList* l = txt; l; l = avahi_string_list_get_next(l)) {
    if (++count > max_txt_entries) break;  // decode_txt rejects the oversized record
    entries.emplace_back(reinterpret_cast<const char*>(avahi_string_list_get_text(l)),
                         avahi_string_list_get_size(l));
  }
  if (count > max_txt_entries) entries.resize(max_txt_entries + 1);
  auto a = decode_txt(entries);
  if (!a) {
    counters_.malformed.fetch_add(1, std::memory_order_relaxed);
    spdlog::debug("mdns: ignoring service '{}': {}", name, a.error().message);
    return;
  }
  if (a->node_id == options_.node_id) {
    counters_.self.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (a->cluster_id != options_.cluster_id) {
    counters_.foreign.fetch_add(1, std::memory_order_relaxed);
    spdlog::debug("mdns: ignoring service '{}' of cluster '{}'", name, a->cluster_id);
    return;
  }
  char text[AVAHI_ADDRESS_STR_MAX] = {};
  avahi_address_snprint(text, sizeof(text), address);
  peer_hint hint;
  hint.node_id = a->node_id;
  hint.cluster_id = a->cluster_id;
  // The SRV port is what DNS-SD clients dial; ctl in TXT must agree or the record is suspect.
  if (a->control_port != port) {
    counters_.malformed.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  hint.control.push_back({text, port});
  hint.source = hint_source::mdns;
  hint.protocol_version = a->protocol_version;
  hint.seen_at = std::chrono::system_clock::now();
  counters_.hints.fetch_add(1, std::memory_order_relaxed);
  sink_(hint);
}

void mdns_source::browse(AvahiClient* c) {
  if (browser_) return;
  browser_ = avahi_service_browser_new(c, AVAHI_IF_UNSPEC, AVAHI_PROTO_INET, mdns_service_type,
                                       nullptr, AvahiLookupFlags(0), mdns_callbacks::browse, this);
  if (!browser_) {
    spdlog::warn("mdns: cannot browse {}: {}", mdns_service_type,
                 avahi_strerror(avahi_client_errno(c)));
  }
}

}  // namespace tessera::mesh
