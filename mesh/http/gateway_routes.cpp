// What each route answers: the pages, /health, /status, /cluster, /metrics, the model list and
// Ollama's /api/show; authorization and CORS; a request body read within its bound; and the
// answers cpp-httplib makes itself (no route, a wrong method, many ranges, an exception), in the
// API's error shape.
#include "mesh/http/gateway_impl.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <set>

#include <fmt/format.h>
#include <sodium.h>

namespace tessera::mesh::http {

using gateway_detail::send_error;
using gateway_detail::send_json;

namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

/// Equal-time comparison: how long a wrong token takes to refuse says nothing about the right one.
bool same_secret(std::string_view a, std::string_view b) {
  // libsodium's constant-time comparison (the compiler cannot turn it into an early exit); the
  // length is not secret.
  return a.size() == b.size() && sodium_memcmp(a.data(), b.data(), a.size()) == 0;
}

/// The routes counted by name; anything else is "other" (a scanner must not grow the label set).
std::string route_of(const std::string& path) {
  for (const char* r : {"/", "/chat", "/health", "/status", "/cluster", "/metrics", "/v1/models",
                        "/v1/completions", "/v1/chat/completions", "/api/generate", "/api/chat",
                        "/api/tags", "/api/show", "/api/version"})
    if (path == r) return path;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

/// The methods a known path takes (for 405 and its Allow header); empty for an unknown path.
std::string methods_of(const std::string& path) {
  if (path == "/v1/completions" || path == "/v1/chat/completions" || path == "/api/generate" ||
      path == "/api/chat" || path == "/api/show")
    return "POST";
  if (route_of(path) != "other") return "GET";
  return "";
}

}  // namespace

/// The Access-Control-Allow-Origin value for `req`: its Origin when allowed ("*" when any is),
/// else empty.
std::string gateway::impl::allowed_origin(const httplib::Request& req) const {
  if (opt.cors_origins.empty() || !req.has_header("Origin")) return {};
  const std::string origin = req.get_header_value("Origin");
  for (const auto& o : opt.cors_origins) {
    if (o == "*") return "*";
    if (o == origin) return origin;
  }
  return {};
}

bool gateway::impl::authorized(const httplib::Request& req, httplib::Response& res) {
  if (opt.api_key.empty()) return true;
  const auto header = req.get_header_value("Authorization");
  // The scheme is case-insensitive (RFC 9110 11.1): "bearer KEY" is as good as "Bearer KEY".
  constexpr std::string_view scheme = "bearer ";
  const bool bearer = header.size() > scheme.size() &&
                      std::equal(scheme.begin(), scheme.end(), header.begin(), [](char a, char b) {
                        return a == static_cast<char>(std::tolower(static_cast<unsigned char>(b)));
                      });
  if (!bearer) {
    send_error(res, error_of(error{errc::unauthorized,
                                   "this peer requires an API key: send "
                                   "'Authorization: Bearer <key>'"}));
    return false;
  }
  if (!same_secret(std::string_view(header).substr(scheme.size()), opt.api_key)) {
    send_error(res, error_of(error{errc::unauthorized, "the API key is not this cluster's"}));
    return false;
  }
  return true;
}

json gateway::impl::status_doc() const {
  return opt.status ? opt.status() : json(nullptr);
}

json gateway::impl::cluster_doc() {
  std::lock_guard lock(cache_mu);
  const auto now = clock_type::now();
  if (!cluster_at || now - *cluster_at >= std::chrono::milliseconds(opt.cluster_cache_ms)) {
    cluster_cache = opt.cluster_status ? opt.cluster_status() : json::object();
    cluster_at = clock_type::now();
  }
  return cluster_cache;
}

void gateway::impl::models(httplib::Response& res) {
  send_json(res, 200, {{"object", "list"}, {"data", model_list()}});
}

/// GET /v1/models/{id}: the model object, or 404 model_not_found naming what is served.
void gateway::impl::model(const std::string& id, httplib::Response& res) {
  const json list = model_list();
  std::string names;
  for (const auto& m : list) {
    if (m["id"] == id) return send_json(res, 200, m);
    names += (names.empty() ? "" : ", ") + m["id"].get<std::string>();
  }
  send_error(res, error_of(make_error(errc::not_found,
                                      "the model '{}' does not exist in this cluster (served: {})",
                                      id, names.empty() ? "none yet" : names)));
}

/// POST /api/show (Ollama): what is known of a model, or 404 {"error"} naming those served.
void gateway::impl::show(httplib::Response& res, const httplib::ContentReader& reader) {
  auto body = read_body(reader, res);
  if (!body) return;
  const json b = json::parse(*body, nullptr, false);
  const json name = b.is_object() ? b.value("model", b.value("name", json(nullptr))) : json();
  api_error e;
  if (!name.is_string()) {
    e.message = "'model' must name a model (GET /api/tags lists them)";
    return send_error(res, e, api_dialect::ollama_chat);
  }
  const std::string want = ollama_model_name(name.get<std::string>());
  std::string names;
  for (const auto& m : model_list()) {
    if (m["id"] == want)
      return send_json(res, 200,
                       {{"modelfile", ""},
                        {"parameters", ""},
                        {"template", ""},
                        {"details",
                         {{"format", "gguf"},
                          {"family", ""},
                          {"parameter_size", ""},
                          {"quantization_level", ""}}},
                        {"model_info",
                         {{"tessera.groups", m.value("groups", 0)},
                          {"tessera.bytes", m.value("bytes", std::uint64_t{0})},
                          {"tessera.content", m.value("content", "")}}},
                        {"capabilities", {"completion"}}});
    names += (names.empty() ? "" : ", ") + m["id"].get<std::string>();
  }
  e.status = 404;
  e.message = fmt::format("model '{}' not found (served: {})", name.get<std::string>(),
                          names.empty() ? "none yet" : names);
  send_error(res, e, api_dialect::ollama_chat);
}

/// The models the cluster serves (the plan's) and those loaded here; a model that the plan
/// cannot place still shows, with its reason, so "why is my model missing" has an answer.
json gateway::impl::model_list() {
  const json s = status_doc();
  json data = json::array();
  std::set<std::string> seen;
  const auto add = [&](const std::string& name, const json& extra) {
    if (!seen.insert(name).second) return;
    json m{{"id", name}, {"object", "model"}, {"created", 0}, {"owned_by", "tessera"}};
    m.update(extra);
    data.push_back(m);
  };
  if (s.contains("plan") && s["plan"].is_object())
    for (const auto& m : s["plan"]["models"])
      add(m.value("name", ""),
          {{"groups", m["groups"].size()},
           {"no_capacity", m.contains("no_capacity") ? m["no_capacity"] : json(nullptr)}});
  if (s.contains("serving") && s["serving"].is_object())
    for (const auto& m : s["serving"]["models"]) {
      add(m.value("name", ""), {{"groups", 0}, {"no_capacity", "no plan yet"}});
      // What this peer knows of the file (its size and content id), for Ollama's tags.
      for (auto& d : data)
        if (d["id"] == m.value("name", "")) {
          d["bytes"] = m.value("bytes", std::uint64_t{0});
          d["content"] = m.value("content", "");
        }
    }
  return data;
}

/// Reads an API request's body through the route's content reader, stopping at max_body_bytes
/// whatever the framing: cpp-httplib's own limit does not hold for chunked bodies (a 1 GiB
/// chunked body was read whole), and it refuses form-encoded bodies above 8 KiB — what curl's
/// `-d` sends without `-H Content-Type` — while the body is JSON whatever the header says.
/// Nullopt: too large, answered 413 (the connection is closed, the rest never read).
std::optional<std::string> gateway::impl::read_body(const httplib::ContentReader& reader,
                                                    httplib::Response& res) {
  std::string body;
  bool too_large = false;
  const bool complete = reader([&](const char* data, std::size_t n) {
    if (body.size() + n > opt.max_body_bytes) {
      too_large = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
  if (too_large || !complete) {
    api_error e;
    e.status = too_large ? 413 : 400;
    e.message = too_large ? fmt::format("the request body is above {} bytes", opt.max_body_bytes)
                          : "the request body ended early";
    send_error(res, e);
    res.set_header("Connection", "close");
    return std::nullopt;
  }
  return body;
}

void gateway::impl::routes() {
  page_routes();
  api_routes();
  pre_routing();
  error_handlers();
  svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    std::lock_guard lock(mu);
    ++counters.requests[{route_of(req.path), res.status}];
  });
}

// The pages, /health and the documents (/status, /cluster, /metrics).
void gateway::impl::page_routes() {
  svr.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(std::string(dashboard_html()), "text/html; charset=utf-8");
  });
  svr.Get("/chat", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(std::string(chat_html()), "text/html; charset=utf-8");
  });
  // Browsers ask for it with every page: no icon, and no 404 in the logs and counters.
  svr.Get("/favicon.ico",
          [](const httplib::Request&, httplib::Response& res) { res.status = 204; });
  svr.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"ok", true}});
  });
  svr.Get("/status", [this](const httplib::Request& req, httplib::Response& res) {
    if (authorized(req, res)) send_json(res, 200, status_doc());
  });
  svr.Get("/cluster", [this](const httplib::Request& req, httplib::Response& res) {
    if (authorized(req, res)) send_json(res, 200, cluster_doc());
  });
  svr.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    gateway_counters c;
    {
      std::lock_guard lock(mu);
      c = counters;
    }
    c.in_flight = in_flight.load();
    res.set_content(render_metrics(status_doc(), c, read_process_facts()),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
}

// The APIs: OpenAI's (/v1/...) and Ollama's (/api/...).
void gateway::impl::api_routes() {
  svr.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (authorized(req, res)) models(res);
  });
  svr.Get(R"(/v1/models/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    if (authorized(req, res)) model(req.matches[1].str(), res);
  });
  // With a content reader: the body is read by read_body(), bounded, whatever its framing.
  svr.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res,
                                     const httplib::ContentReader& reader) {
    if (authorized(req, res)) api(api_kind::completion, res, reader);
  });
  svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res,
                                          const httplib::ContentReader& reader) {
    if (authorized(req, res)) api(api_kind::chat, res, reader);
  });
  // Ollama's API (mesh/http/ollama.hpp): the same serving path, Ollama's shapes.
  svr.Post("/api/generate", [this](const httplib::Request& req, httplib::Response& res,
                                   const httplib::ContentReader& reader) {
    if (authorized(req, res)) api(api_kind::completion, res, reader, api_dialect::ollama_generate);
  });
  svr.Post("/api/chat", [this](const httplib::Request& req, httplib::Response& res,
                               const httplib::ContentReader& reader) {
    if (authorized(req, res)) api(api_kind::chat, res, reader, api_dialect::ollama_chat);
  });
  svr.Get("/api/tags", [this](const httplib::Request& req, httplib::Response& res) {
    if (authorized(req, res)) send_json(res, 200, ollama_tags(model_list()));
  });
  svr.Post("/api/show", [this](const httplib::Request& req, httplib::Response& res,
                               const httplib::ContentReader& reader) {
    if (authorized(req, res)) show(res, reader);
  });
  svr.Get("/api/version", [this](const httplib::Request& req, httplib::Response& res) {
    if (authorized(req, res)) send_json(res, 200, {{"version", "0.1.0"}});
  });
}

// Before any route: CORS preflights and the names of allowed origins, and many ranges refused.
void gateway::impl::pre_routing() {
  // Ranges: every answer here is a small document; a Range header with thousands of ranges
  // made an 8 KB request into a 14.7 MB multipart answer (cpp-httplib serves them all). One
  // range is served, more are refused.
  // The refusal has no body: cpp-httplib applies the ranges to whatever body an answer has,
  // this one included (a JSON error would come back 2,700 times).
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // CORS: an allowed origin's preflight is answered here (before authentication: browsers
    // send no credentials with it), and every other answer to it names the origin.
    if (const auto origin = allowed_origin(req); !origin.empty()) {
      res.set_header("Access-Control-Allow-Origin", origin);
      res.set_header("Vary", "Origin");
      if (req.method == "OPTIONS" && req.has_header("Access-Control-Request-Method")) {
        res.status = 204;
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        // The headers the browser asks for (bounded: an echo, not a way to grow answers).
        const std::string asked = req.get_header_value("Access-Control-Request-Headers");
        res.set_header("Access-Control-Allow-Headers", !asked.empty() && asked.size() <= 256
                                                           ? asked
                                                           : "Authorization, Content-Type");
        res.set_header("Access-Control-Max-Age", "600");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (req.ranges.size() <= 1) return httplib::Server::HandlerResponse::Unhandled;
    res.status = 416;
    res.set_header("X-Tessera-Error",
                   fmt::format("{} ranges requested; at most 1 is served", req.ranges.size()));
    return httplib::Server::HandlerResponse::Handled;
  });
}

// What cpp-httplib answers itself, and a handler's exception, in the API's error shape.
void gateway::impl::error_handlers() {
  // Errors httplib raises itself (no route, body too large, ...) get the API's error shape.
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler wrote its own error
    if (res.status == 416) return;  // many ranges: no body to multiply (pre-routing handler)
    // A known path asked with another method: 405 and what it allows, not "no route".
    if (const auto allow = methods_of(req.path); res.status == 404 && !allow.empty()) {
      res.status = 405;
      res.set_header("Allow", allow);
      api_error e;
      e.status = 405;
      e.code = "method_not_allowed";
      e.message = fmt::format("{} {}: this route takes {}", req.method, req.path, allow);
      res.set_content(dump(e.to_json()), "application/json");
      return;
    }
    api_error e;
    e.status = res.status;
    e.code = res.status == 404 ? "not_found" : "";
    e.message = res.status == 404   ? fmt::format("no route {} {}", req.method, req.path)
                : res.status == 413 ? "the request body is too large"
                                    : fmt::format("HTTP {}", res.status);
    res.set_content(dump(e.to_json()), "application/json");
  });
  svr.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        api_error e;
        e.status = 500;
        e.type = "server_error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& x) {
          e.message = fmt::format("internal error: {}", x.what());
        } catch (...) {
          e.message = "internal error";
        }
        send_error(res, e);
      });
}

}  // namespace tessera::mesh::http
