// `tessera keygen`: a new random cluster secret (32 bytes from getrandom), written to a 0600 file
// or printed. Nodes take it by --cluster-key FILE or TESSERA_CLUSTER_KEY (the secret or @file).
// `--client-key FILE` writes an existing cluster's client access key instead (--client-auth).
#include <cstdio>
#include <optional>
#include <string>

#include "actors/base/log.hpp"
#include "cli/command.hpp"
#include "transport/control/cluster_key.hpp"

namespace tessera::cli {
namespace {

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out.push_back(c);
    }
  }
  return out + "\"";
}

struct keygen_options {
  std::string output;
  std::string format = "hex";
  bool force = false;
  bool json = false;
  std::string client_key;   // write the cluster's client access key here (no new secret)
  std::string cluster_key;  // the cluster secret it derives from (else TESSERA_CLUSTER_KEY)
};

/// `--client-key FILE`: the access key clients of an existing cluster need when its peers run
/// with --client-auth. Derived from the cluster secret; does not reveal it.
int write_client_key(const keygen_options& o) {
  namespace tc = tessera::transport::control;
  auto fail = [](const std::string& why) {
    log::say(fmt::format("tessera keygen: {}", why), true);
    return 1;
  };
  std::optional<std::string> from;
  if (!o.cluster_key.empty()) from = o.cluster_key;
  auto secret = tc::load_cluster_secret(from);
  if (!secret) {
    return fail(secret.error().code == errc::not_found
                    ? std::string("--client-key derives from the cluster secret: pass "
                                  "--cluster-key FILE or set TESSERA_CLUSTER_KEY")
                    : secret.error().describe());
  }
  auto keys = tc::derive_cluster_keys(*secret);
  if (!keys) return fail(keys.error().describe());
  auto w = tc::write_secret_file(o.client_key, tc::format_client_access(keys->access), o.force);
  if (!w) return fail(w.error().describe());
  if (o.json) {
    std::printf("{\"client_key\":%s,\"cluster_id\":\"%s\"}\n", json_string(o.client_key).c_str(),
                keys->cluster_id.c_str());
  } else {
    std::printf(
        "wrote the client access key of cluster %s to %s (mode 0600): clients pass it "
        "with --client-key or %s to peers started with --client-auth\n",
        keys->cluster_id.c_str(), o.client_key.c_str(), tc::kClientKeyEnv);
  }
  return 0;
}

int run_keygen(const keygen_options& o) {
  namespace tc = tessera::transport::control;
  if (!o.client_key.empty()) return write_client_key(o);
  if (!o.cluster_key.empty()) {
    log::sayf(true,
              "tessera keygen: --cluster-key is the source of --client-key; alone it "
              "would do nothing (a new secret is written with -o FILE)\n");
    return 2;
  }
  auto secret = tc::generate_cluster_secret();
  if (!secret) {
    log::say(fmt::format("tessera keygen: {}", secret.error().describe()), true);
    return 1;
  }
  auto keys = tc::derive_cluster_keys(*secret);
  if (!keys) {
    log::say(fmt::format("tessera keygen: {}", keys.error().describe()), true);
    return 1;
  }
  const auto fmt = o.format == "z85" ? tc::secret_format::z85 : tc::secret_format::hex;
  const std::string text = tc::format_cluster_secret(*secret, fmt);
  if (!o.output.empty()) {
    auto w = tc::write_secret_file(o.output, text, o.force);
    if (!w) {
      log::say(fmt::format("tessera keygen: {}", w.error().describe()), true);
      return 1;
    }
    if (o.json) {
      std::printf("{\"file\":%s,\"format\":\"%s\",\"cluster_id\":\"%s\"}\n",
                  json_string(o.output).c_str(), o.format.c_str(), keys->cluster_id.c_str());
    } else {
      std::printf("wrote a new cluster secret to %s (mode 0600, cluster id %s)\n",
                  o.output.c_str(), keys->cluster_id.c_str());
    }
    return 0;
  }
  if (o.json) {
    std::printf("{\"secret\":\"%s\",\"format\":\"%s\",\"cluster_id\":\"%s\"}\n", text.c_str(),
                o.format.c_str(), keys->cluster_id.c_str());
  } else {
    std::printf("%s\n", text.c_str());
    log::sayf(false, "cluster id %s; keep the secret private (key files must be mode 0600)\n",
              keys->cluster_id.c_str());
  }
  return 0;
}

}  // namespace

void register_keygen(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("keygen", "write a new cluster secret");
  auto opts = std::make_shared<keygen_options>();
  cmd->add_option("-o,--output", opts->output, "write the secret to FILE (mode 0600) instead of stdout");
  cmd->add_option("--format", opts->format, "hex (64 chars) or z85 (40 chars)")
      ->check(CLI::IsMember({"hex", "z85"}))
      ->capture_default_str();
  cmd->add_flag("--force", opts->force, "replace FILE if it exists");
  cmd->add_flag("--json", opts->json, "print a JSON object (file or secret, format, cluster id)");
  cmd->add_option("--client-key", opts->client_key,
                  "instead: write the client access key of an existing cluster to FILE (mode "
                  "0600), for clients of peers started with --client-auth");
  cmd->add_option("--cluster-key", opts->cluster_key,
                  "with --client-key: the cluster secret file (default: TESSERA_CLUSTER_KEY)");
  cmd->callback([opts, &exit_code] { exit_code = run_keygen(*opts); });
}

}  // namespace tessera::cli
