#include "mesh/runtime/runtime.hpp"

#include "mesh/runtime/node_impl.hpp"

namespace tessera::mesh::runtime {

namespace fs = std::filesystem;

node_runtime::node_runtime(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

node_runtime::~node_runtime() {
  if (!impl_) return;
  // The gateway's threads read the snapshot and ask the engine's endpoints: it goes first.
  if (impl_->gateway) impl_->gateway->stop(0);
  if (impl_->engine) impl_->engine->stop();
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->actors) impl_->actors->shutdown(std::chrono::nanoseconds(0));
  if (impl_->prober) impl_->prober->stop();
  for (auto& s : impl_->sources)
    s->stop();
  if (impl_->control) impl_->control->stop();
}

namespace {

/// The HTTP gateway: API requests go to this peer's own client endpoint (over loopback when it
/// listens on every address), the status comes from the control actor's snapshot.
result<std::unique_ptr<http::gateway>> start_gateway(node_runtime::impl& p,
                                                     const ctl::cluster_keys& keys) {
  const auto& cfg = p.opt.config;
  http::gateway_options go;
  if (cfg.client_auth) go.client_access = keys.access;
  go.bind_address = cfg.listen.http_address;
  go.cors_origins = cfg.http.cors_origins;
  go.port = cfg.listen.http_port;
  go.threads = std::min(go.threads, budget_of(p.descriptor_limit).http_threads);
  if (!cfg.http.api_key_file.empty()) {
    auto key = read_api_key(cfg.http.api_key_file);
    if (!key) return key.error();
    go.api_key = std::move(*key);
  }
  // Our own endpoints: where they are bound (an advertised address may be a NAT's).
  const std::string host =
      cfg.listen.client_address == "0.0.0.0" ? "127.0.0.1" : cfg.listen.client_address;
  go.peers.push_back({host, p.engine->request_port(), p.engine->response_port()});
  const node_runtime::impl* raw = &p;
  go.status = [raw] { return raw->status_snapshot(); };
  go.cluster_status = [raw] { return raw->members_docs.read(raw->status_snapshot(), raw->hex); };
  return http::gateway::start(std::move(go));
}

}  // namespace

namespace {

/// The control plane (ROUTER, fault layer, link timing), the peer directory over it, the bulk
/// port, the bandwidth prober and this node's capabilities.
result<void> start_control_plane(node_runtime::impl& p, const ctl::cluster_keys& keys) {
  const node_config& cfg = p.opt.config;
  node_runtime::impl* raw = &p;
  ctl::node_config cc;
  cc.node_id = p.hex;
  cc.transient_prefix = std::string(status_client_prefix);
  cc.bind_endpoint = fmt::format("tcp://{}:{}", cfg.listen.address, cfg.listen.control_port);
  {
    auto adv = choose_advertise_address({.advertise = cfg.listen.advertise,
                                         .listen_address = cfg.listen.address,
                                         .seeds = cfg.discovery.seeds,
                                         .beacon_interface = cfg.discovery.beacon_interface});
    if (!adv) return adv.error();
    p.advertise = std::move(*adv);
  }
  const std::string adv_host = p.advertise.address;
  cc.keys = keys;
  // The fault layer is always in: `tessera fault` changes a live cluster without restarts. It
  // judges frames between members only: the operator's own channel (status and fault clients,
  // whose ids are not node ids) must keep working inside any partition it sets up.
  p.injector = std::make_shared<transport::faults::fault_injector>(std::random_device{}());
  {
    auto hooks = ctl::make_fault_hooks(p.injector, p.hex);
    auto member_decide = std::move(hooks.decide);
    hooks.decide = [member_decide](std::string_view to, std::int64_t now_ns,
                                   std::array<std::int64_t, 2>& due_ns) -> std::uint8_t {
      if (!is_node_id_text(to)) {
        due_ns[0] = now_ns;
        return 1;
      }
      return member_decide(to, now_ns, due_ns);
    };
    cc.faults = std::move(hooks);
  }
  // A control link is declared down (and redialled) after this much silence: never sooner than a
  // suspected peer may still refute (the suspicion timeout), so that clusters configured with long
  // timeouts (slow or lossy networks, sanitizer builds) do not redial links to peers membership
  // still counts; 1 s at least, the link's own liveness floor.
  cc.timing.heartbeat_interval_ms = 100;
  cc.timing.dead_after_ms = std::max<std::uint32_t>(1000, cfg.timeouts.suspect_timeout_ms);
  p.link_dead_after_ms = cc.timing.dead_after_ms;
  cc.timing.backoff_max_ms = 1000;
  ctl::node_handlers handlers;
  handlers.on_message = [raw](ctl::inbound_message&& m) {
    raw->push(node_runtime::impl::ev_message{std::move(m)}, true);
  };
  handlers.on_peer_event = [raw](const ctl::peer_event& e) {
    raw->push(node_runtime::impl::ev_peer{e}, false);
  };
  if (cfg.listen.control_port != 0) {
    cc.advertise_endpoint = fmt::format("tcp://{}:{}", adv_host, cfg.listen.control_port);
  }
  auto control = ctl::control_node::start(cc, handlers);
  if (!control) return control.error();
  p.control = std::move(control).value();
  p.endpoint = p.control->endpoint();
  if (cfg.listen.control_port != 0) p.endpoint = cc.advertise_endpoint;
  p.self_address = p.hex + "@" + p.endpoint;
  p.directory.emplace(*p.control, p.hex, p.self, p.endpoint);

  p.bulk_caps = transport::bulk::probe_capabilities();
  // The bulk port: every tcp bulk link of this node (split groups, model shares, bandwidth
  // probes) listens on it, so a firewall needs one known port. Bound now so that a taken port
  // fails the start with a clear error; 0 keeps a port per link (ephemeral).
  {
    auto held = transport::bulk::reserve_bulk_port(cfg.listen.address, cfg.listen.bulk_port);
    if (!held) return held.error();
    p.bulk_port_hold = std::move(held).value();
  }
  {
    ctl::control_node* cn = p.control.get();
    p.prober = std::make_unique<bandwidth_prober>(
        transport::bulk::link_addresses{cfg.listen.address, adv_host, cfg.listen.bulk_port},
        [cn](const std::string& peer, std::uint16_t type, const std::string& body) {
          (void)cn->send(peer, type, bytes_of(body));
        },
        static_cast<std::uint16_t>(runtime_msg::bulk_offer),
        static_cast<std::uint16_t>(runtime_msg::bulk_answer));
  }
  p.caps = local_caps(cfg, p.hex, p.opt.version, p.bulk_caps);
  return ok();
}

/// Serving and the HTTP gateway.
result<void> start_serving(node_runtime::impl& p, const ctl::cluster_keys& keys) {
  const node_config& cfg = p.opt.config;
  const std::string& adv_host = p.advertise.address;
  // Serving: the models and the client endpoints. A model that does not load stops the node
  // with the error naming the file (better than joining the mesh unable to serve it).
  {
    serving::engine_options so;
    so.node_hex = p.hex;
    so.self = p.self;
    so.model_paths = cfg.model_paths;
    so.threads = cfg.threads != 0 ? cfg.threads : std::max(1u, std::thread::hardware_concurrency());
    so.max_batch_streams = cfg.max_batch_streams;
    so.kv_cache = inference::parse_kv_cache_type(cfg.kv_cache).value_or(inference::kv_cache_type::f16);
    so.client_connections_per_address = cfg.client_connections_per_address;
    so.client_connections_total = budget_of(p.descriptor_limit).client_connections;
    so.compute_nice = static_cast<int>(cfg.compute_nice);
    so.bind_address = cfg.listen.address;
    so.advertise_address = adv_host;
    so.bulk_port = cfg.listen.bulk_port;
    so.client_bind_address = cfg.listen.client_address;
    so.request_port = cfg.listen.client_request_port;
    so.response_port = cfg.listen.client_response_port;
    so.bulk_caps = p.bulk_caps;
    so.faults = p.injector;
    so.on_load_progress = p.opt.on_model_load;
    ctl::control_node* cn = p.control.get();
    so.send_group_link = [cn](const std::string& peer_hex, std::string body) {
      (void)cn->send(peer_hex, static_cast<std::uint16_t>(runtime_msg::group_link), bytes_of(body));
    };
    so.send_share = [cn](const std::string& peer_hex, std::string body) {
      (void)cn->send(peer_hex, static_cast<std::uint16_t>(runtime_msg::model_share),
                     bytes_of(body));
    };
    so.fetch_models = cfg.fetch_models;
    so.fetch_dir = (fs::path(cfg.data_dir) / "models").string();
    so.on_fetch_progress = p.opt.on_model_fetch;
    if (cfg.client_auth) {
      so.client_auth = serving::engine_options::client_auth_keys{keys.client_endpoint,
                                                                 keys.access.client.public_key};
    }
    auto eng = serving::engine::start(so);
    if (!eng) return eng.error();
    p.engine = std::move(*eng);
    for (const auto& m : p.engine->models())
      p.caps.model_specs.push_back(m.spec);
    p.caps.client_endpoint = fmt::format("{}:{}:{}", client_host_for_peers(cfg, adv_host),
                                         p.engine->request_port(), p.engine->response_port());
  }
  if (cfg.http.enabled) {
    auto g = start_gateway(p, keys);
    if (!g) return g.error();
    p.gateway = std::move(*g);
  }
  return ok();
}

result<void> make_core(node_runtime::impl& p, const durable_election_state& restored) {
  const node_config& cfg = p.opt.config;
  // State machines: the control core, configured from the node's settings as the simulator's
  // nodes are (control_settings_for).
  core_options co;
  co.self = p.self;
  co.self_address = p.self_address;
  co.hex = p.hex;
  co.settings = control_settings_for(cfg);
  co.membership_seed = std::random_device{}() ^ p.self;
  co.election_seed = std::random_device{}() ^ (p.self * 31);
  co.incarnation = static_cast<std::uint64_t>(unix_ms());
  co.restored = restored;
  co.caps = p.caps;
  p.core_base = co;
  auto core = control_core::create(std::move(co), p);
  if (!core) return core.error();
  p.core = std::move(core).value();
  return ok();
}

/// The discovery sources (started last, once the control actor takes their hints).
result<void> add_discovery(node_runtime::impl& p, const ctl::cluster_keys& keys,
                           const ctl::cluster_secret& secret) {
  const node_config& cfg = p.opt.config;
  const std::string& adv_host = p.advertise.address;
  // Discovery.
  auto seeds = seed_source::create(cfg.discovery.seeds);
  if (!seeds) return seeds.error();
  p.sources.push_back(std::move(seeds).value());
  if (cfg.discovery.beacon) {
    beacon_options bo;
    bo.cluster_id = keys.cluster_id;
    bo.node_id = p.hex;
    bo.control_port =
        static_cast<std::uint16_t>(std::stoi(p.endpoint.substr(p.endpoint.rfind(':') + 1)));
    bo.advertise_host = adv_host;
    bo.interface_name = cfg.discovery.beacon_interface;
    bo.address = cfg.discovery.beacon_address;
    bo.port = cfg.discovery.beacon_port;
    bo.interval_ms = cfg.discovery.beacon_interval_ms;
    bo.key = derive_beacon_key(secret.bytes);
    auto b = beacon_source::create(bo);
    if (!b) return b.error();
    p.sources.push_back(std::move(b).value());
  }
  if (cfg.discovery.mdns) {
    mdns_options mo;
    mo.cluster_id = keys.cluster_id;
    mo.node_id = p.hex;
    mo.control_port =
        static_cast<std::uint16_t>(std::stoi(p.endpoint.substr(p.endpoint.rfind(':') + 1)));
    auto s = mdns_source::create(mo);
    if (!s) return s.error();
    p.sources.push_back(std::move(s).value());
  }
  return ok();
}

void log_start(const node_runtime::impl& p, const ctl::cluster_keys& keys) {
  const node_config& cfg = p.opt.config;
  const std::string& adv_host = p.advertise.address;
  spdlog::info("node {}: control {} (cluster {}), data dir {}", p.hex, p.endpoint, keys.cluster_id,
               p.dir->path().string());
  if (p.advertise.loopback_only) {
    spdlog::warn(
        "advertising {} ({}): peers on other hosts cannot reach this node; pass "
        "--advertise ADDRESS",
        adv_host, p.advertise.source);
  } else {
    spdlog::info("advertising {} to peers ({}); binding {}", adv_host, p.advertise.source,
                 cfg.listen.address);
  }
  if (auto w = insecure_clients_warning(cfg)) spdlog::warn("{}", *w);
}

/// The node's actor system: the supervised control actor, its watch, the identity check.
result<void> start_actors(node_runtime::impl& p, const ctl::cluster_keys& keys) {
  const node_config& cfg = p.opt.config;
  const std::string& adv_host = p.advertise.address;
  node_runtime::impl* raw = &p;
  {
    // The control actor on its own actor system: one worker (`actor-0`), mailbox above the
    // frames' bound so that peer events and hints always fit.
    actors::config ac;
    ac.workers = 1;
    ac.data_capacity = kMaxQueuedEvents + 1024;
    p.actors = std::make_unique<actors::actor_system>(ac);
    // Supervised: a control actor that fails (a handler throws) is restarted with its core
    // remade from the durable election state, at most 3 times in 5 s.
    actors::child_spec child;
    child.name = "control";
    child.make = [raw] { return make_control_actor(*raw); };
    child.options.data_capacity = ac.data_capacity;
    auto sup = p.actors->spawn(
        std::make_unique<actors::supervisor>(actors::supervisor_spec{},
                                             std::vector<actors::child_spec>{std::move(child)}),
        actors::spawn_options{.name = "control-supervisor"});
    if (!sup)
      return make_error(sup.error().code, "cannot start the control actor: {}",
                        sup.error().message);
    auto watch = p.actors->spawn(make_control_watch(*raw, *sup));
    if (!watch)
      return make_error(watch.error().code, "cannot start the control actor's watch: {}",
                        watch.error().message);
    // The duplicate-identity check: 1 s and 5 s from now, an actor beside the control actor.
    identity_check_options io;
    io.self = p.instance;
    io.hex = p.hex;
    io.endpoint = p.endpoint;
    io.data_dir = p.dir->path().string();
    io.seeds = cfg.discovery.seeds;
    io.client.keys = keys;
    io.client.bind_address =
        is_address_of_this_host(adv_host) ? adv_host : std::string(cfg.listen.address);
    io.client.reply_address = adv_host;
    io.client.id_seed = p.instance.nonce;
    io.refuse = [raw](std::string why) { raw->fail(std::move(why)); };
    auto identity = p.actors->spawn(make_identity_check(std::move(io)),
                                    actors::spawn_options{.name = "identity"});
    if (!identity)
      return make_error(identity.error().code, "cannot start the duplicate-identity check: {}",
                        identity.error().message);
  }
  return ok();
}

}  // namespace

result<std::unique_ptr<node_runtime>> node_runtime::start(runtime_options options) {
  auto p = std::make_unique<impl>();
  p->opt = std::move(options);
  // A config built in code rather than by resolve_config (tests, library users) may leave the
  // client address empty: the endpoints then bind where the control plane does, as they did
  // before the setting existed.
  if (p->opt.config.listen.client_address.empty())
    p->opt.config.listen.client_address = p->opt.config.listen.address;
  const node_config& cfg = p->opt.config;

  // The secret first: without it nothing else may happen (no identity file created either).
  std::optional<std::string> key_file;
  if (!cfg.cluster_key_file.empty()) key_file = cfg.cluster_key_file;
  auto secret = ctl::load_cluster_secret(key_file);
  if (!secret) {
    if (secret.error().code == errc::not_found)
      return make_error(errc::unauthorized,
                        "no cluster secret: pass --cluster-key FILE or set {} (create one with "
                        "`tessera keygen`)",
                        ctl::kClusterKeyEnv);
    return secret.error();
  }
  auto keys = ctl::derive_cluster_keys(*secret);
  if (!keys) return keys.error();

  auto dir = data_dir::open(cfg.data_dir, data_dir_options{cfg.reset_identity});
  if (!dir) return dir.error();
  p->dir.emplace(std::move(dir).value());
  if (!p->dir->warning().empty()) spdlog::warn("{}", p->dir->warning());
  p->descriptor_limit = raise_descriptor_limit();
  if (auto w = descriptor_warning(p->descriptor_limit)) spdlog::warn("{}", *w);
  p->hex = p->dir->id().to_string();
  p->self = p->dir->id().lo;
  p->feed.emplace(p->hex);

  // Restore the election's durable state.
  auto restored = read_election_state(p->dir->path() / p->opt.election_state_file);
  if (!restored) return restored.error();

  TESSERA_TRY(start_control_plane(*p, *keys));
  TESSERA_TRY(start_serving(*p, *keys));
  TESSERA_TRY(make_core(*p, *restored));
  TESSERA_TRY(add_discovery(*p, *keys, *secret));
  log_start(*p, *keys);
  p->instance.id = p->dir->id();
  p->instance.control_endpoint = p->endpoint;
  p->instance.started_unix_ms = unix_ms();
  p->instance.nonce =
      (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  TESSERA_TRY(start_actors(*p, *keys));
  impl* raw = p.get();
  for (auto& s : p->sources) {
    auto r = s->start([raw](const peer_hint& h) { raw->push(impl::ev_hint{h}, false); });
    if (!r) {
      auto rt = std::unique_ptr<node_runtime>(new node_runtime(std::move(p)));
      return make_error(r.error().code, "discovery: {}", r.error().message);
    }
  }
  return std::unique_ptr<node_runtime>(new node_runtime(std::move(p)));
}

void node_runtime::leave_and_stop(std::uint32_t flush_ms) {
  // Streams first: each in-flight request ends with "unavailable", and its client resumes it on
  // another peer while this one is still announcing its leave.
  if (impl_->engine) impl_->engine->stop();
  if (!impl_->failed) impl_->push(impl::ev_leave{}, false);
  {
    std::unique_lock lock(impl_->mu);
    impl_->cv.wait_for(lock, std::chrono::milliseconds(flush_ms),
                       [&] { return impl_->left || impl_->stopping; });
  }
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  impl_->actors->shutdown(std::chrono::nanoseconds(0));
  // HTTP streams running here were resumed on other peers when the engine stopped (the gateway
  // is a pub-sub client); the mesh knows we left, so let them finish, within a bound.
  if (impl_->gateway) impl_->gateway->stop(kHttpDrainMs);
  impl_->prober->stop();
  for (auto& s : impl_->sources)
    s->stop();
  // Flush: wait (bounded) until the leave messages left the send queues.
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(flush_ms);
  while (std::chrono::steady_clock::now() < end) {
    bool empty = true;
    for (const auto& p : impl_->control->peers())
      if (p.queued > 0 && p.state == transport::control::link_state::up) empty = false;
    if (empty) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // libzmq hands frames to the kernel asynchronously: give the I/O thread a moment (linger).
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  impl_->control->stop();
}

bool node_runtime::failed() const {
  return impl_->failed;
}

std::string node_runtime::fatal_error() const {
  std::lock_guard lock(impl_->mu);
  return impl_->fatal;
}

result<void> node_runtime::subscribe_members(actors::actor_system& system,
                                             const actors::actor_ref& subscriber) {
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->stopping)
      return make_error(errc::closed, "node {}: the runtime has stopped", impl_->hex);
    if (impl_->member_subscriptions >= kMaxMemberSubscribers)
      return make_error(errc::overloaded,
                        "node {}: {} membership subscriptions already (the bound)", impl_->hex,
                        kMaxMemberSubscribers);
    ++impl_->member_subscriptions;
  }
  impl_->push(impl::ev_subscribe{&system, subscriber}, false);
  return ok();
}

void node_runtime::unsubscribe_members(const actors::actor_ref& subscriber) {
  impl_->push(impl::ev_subscribe{nullptr, subscriber}, false);
}

std::string node_runtime::node_id() const {
  return impl_->hex;
}
std::string node_runtime::endpoint() const {
  return impl_->endpoint;
}

}  // namespace tessera::mesh::runtime
