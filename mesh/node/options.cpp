#include "mesh/node/options.hpp"

#include "mesh/node/config_keys.hpp"

extern char** environ;  // NOLINT: POSIX

namespace tessera::mesh {

std::unique_ptr<node_options> add_node_options(CLI::App& app, node_config& config) {
  auto opts = std::unique_ptr<node_options>(new node_options());
  opts->config_ = &config;
  opts->config_option_ = app.add_option("--config", opts->config_file_,
                                        fmt::format("TOML config file (env {})", config_file_env));
  nlohmann::ordered_json defaults = to_json(config);
  for (const auto& k : detail::keys()) {
    auto flag = std::make_unique<node_options::bound_flag>();
    flag->key = std::string(k.key);
    std::string help = fmt::format("{} [key {}, env {}]", k.help, k.key, env_name_of(k.key));
    std::string name(k.flag);
    switch (k.kind) {
      case detail::value_kind::boolean:
        // --mdns / --no-mdns; a value may also be given: --mdns=false.
        if (k.key == "reset_identity") {
          flag->option = app.add_flag(name, flag->scalar, help);
        } else {
          flag->option = app.add_flag(
              fmt::format("{}{{true}},--no-{}{{false}}", name, name.substr(2)), flag->scalar, help);
        }
        break;
      case detail::value_kind::list:
        flag->option = app.add_option(name, flag->items, help)
                           ->take_all()
                           ->allow_extra_args(false)
                           ->type_name(k.key == "discovery.seeds" ? "HOST:PORT" : "PATH");
        flag->is_list = true;
        break;
      default: {
        // Show the effective default in --help.
        std::string key(k.key);
        nlohmann::ordered_json* at = &defaults;
        std::size_t start = 0;
        for (auto dot = key.find('.'); dot != std::string::npos; dot = key.find('.', start)) {
          at = &(*at)[key.substr(start, dot - start)];
          start = dot + 1;
        }
        const auto& v = (*at)[key.substr(start)];
        flag->option = app.add_option(name, flag->scalar, help)
                           ->default_str(v.is_string() ? v.get<std::string>() : v.dump())
                           ->type_name(k.kind == detail::value_kind::port    ? "PORT"
                                       : k.kind == detail::value_kind::count ? "N"
                                                                             : "TEXT");
        break;
      }
    }
    opts->flags_.push_back(std::move(flag));
  }
  return opts;
}

std::vector<std::pair<std::string, std::string>> node_options::given_flags() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& f : flags_) {
    if (f->option->count() == 0) continue;
    if (f->is_list) {
      for (const auto& item : f->items)
        out.emplace_back(f->key, item);
    } else {
      out.emplace_back(f->key, f->scalar);
    }
  }
  return out;
}

result<resolved_config> node_options::resolve(const std::vector<std::string>& environment) {
  config_layers layers;
  if (config_option_->count() > 0) layers.file = config_file_;
  layers.environment = environment;
  layers.flags = given_flags();
  auto r = resolve_config(layers);
  if (r) *config_ = r->config;
  return r;
}

std::vector<std::string> process_environment() {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e)
    env.emplace_back(*e);
  return env;
}

}  // namespace tessera::mesh
