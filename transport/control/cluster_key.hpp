// The cluster secret and everything derived from it (see
// docs/design/007-control-plane-security.md).
//
//   secret (32 random bytes, from `tessera keygen`)
//     ├─ crypto_kdf(id 1, ctx "TSclstid") → 16 bytes → cluster id (public: discovery TXT records)
//     ├─ crypto_kdf(id 2, ctx "TScurvsv") → Curve25519 server secret key → server public key
//     ├─ crypto_kdf(id 3, ctx "TScurvcl") → Curve25519 client secret key → client public key
//     ├─ crypto_kdf(id 4, ctx "TSclisrv") → client endpoints' server keypair (--client-auth)
//     └─ crypto_kdf(id 5, ctx "TSclikey") → the clients' keypair (the client access key)
//
// Every member holds the same server and client keypairs: a CURVE handshake proves the peer knows
// the secret (or a key derived from it), which is all a shared-secret cluster can prove.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "actors/base/result.hpp"

namespace tessera::transport::control {

inline constexpr std::size_t kClusterSecretSize = 32;
/// Environment variable holding the secret itself (hex or z85) or "@/path/to/file".
inline constexpr const char* kClusterKeyEnv = "TESSERA_CLUSTER_KEY";

/// The raw cluster secret. Never logged; `describe` prints only the cluster id.
struct cluster_secret {
  std::array<std::uint8_t, kClusterSecretSize> bytes{};
};

/// A Curve25519 keypair, raw 32-byte keys.
struct curve_keypair {
  std::array<std::uint8_t, 32> public_key{};
  std::array<std::uint8_t, 32> secret_key{};
};

/// Environment variable naming a client access key file (or "@file").
inline constexpr const char* kClientKeyEnv = "TESSERA_CLIENT_KEY";

/// What a client needs to reach peers started with `--client-auth` (docs/PROTOCOL.md): the
/// client endpoints' server public key and the clients' keypair. It is derived from the cluster
/// secret but does not reveal it (one-way KDF): its holder can submit requests and read token
/// streams, never join the cluster or read the peers' control traffic.
struct client_access {
  std::string cluster_id;
  std::array<std::uint8_t, 32> server_public{};
  curve_keypair client;
};

/// Everything a node needs for CURVE, derived deterministically from one secret.
struct cluster_keys {
  std::string cluster_id;         ///< 32 hex chars; public
  curve_keypair server;           ///< the ROUTER's keypair (same on every member)
  curve_keypair client;           ///< every DEALER's keypair (same on every member)
  curve_keypair client_endpoint;  ///< the request SUB / response XPUB keypair (--client-auth)
  client_access access;           ///< what `tessera keygen --client-key` hands to clients
};

enum class secret_format { hex, z85 };

/// 32 bytes from the kernel's CSPRNG (getrandom).
[[nodiscard]] result<cluster_secret> generate_cluster_secret();

/// Text form of a secret: 64 hex chars or 40 z85 chars.
[[nodiscard]] std::string format_cluster_secret(const cluster_secret& s, secret_format f);

/// Parses a secret from text (surrounding whitespace ignored): 64 hex chars or 40 z85 chars.
/// `origin` names where the text came from, for the error message (never echoes the text).
[[nodiscard]] result<cluster_secret> parse_cluster_secret(std::string_view text,
                                                          std::string_view origin);

/// Reads a secret file. Refuses files readable or writable by group or others (like ssh does).
[[nodiscard]] result<cluster_secret> read_cluster_secret_file(const std::string& path);

/// The text of another small secret file (`what` names it in errors; e.g. the HTTP API key),
/// under the same rule as the cluster key: refused when group or others may read or write it;
/// at most `max_bytes`.
[[nodiscard]] result<std::string> read_private_text_file(const std::string& path,
                                                         std::string_view what,
                                                         std::size_t max_bytes = 64 * 1024);

/// Writes `text` to a new file with mode 0600. Fails if the file exists unless `overwrite`.
[[nodiscard]] result<void> write_secret_file(const std::string& path, std::string_view text,
                                             bool overwrite);

/// The node's secret: from `file` when given, else from $TESSERA_CLUSTER_KEY (the secret or
/// "@file"). errc::not_found when neither is set.
[[nodiscard]] result<cluster_secret> load_cluster_secret(const std::optional<std::string>& file);

/// Derives the cluster id and the CURVE keypairs (libsodium crypto_kdf + crypto_scalarmult_base).
[[nodiscard]] result<cluster_keys> derive_cluster_keys(const cluster_secret& secret);

/// The text of a client access key file (comment lines, then "name z85" lines).
[[nodiscard]] std::string format_client_access(const client_access& a);
/// Parses that text; `origin` names it in errors. Checks the keypair belongs together.
[[nodiscard]] result<client_access> parse_client_access(std::string_view text,
                                                        std::string_view origin);
/// Reads a client access key file (mode 0600 or stricter, like the cluster key).
[[nodiscard]] result<client_access> read_client_access_file(const std::string& path);
/// A client's access key: from `file` when given, else $TESSERA_CLIENT_KEY (a path, or "@path");
/// none (nullopt) when neither is set. A named file that cannot be read is an error.
[[nodiscard]] result<std::optional<client_access>> load_client_access(
    const std::optional<std::string>& file);

/// The z85 text form of a 32-byte key (40 chars), as libzmq's CURVE options take it.
[[nodiscard]] std::string z85_key(const std::array<std::uint8_t, 32>& key);

}  // namespace tessera::transport::control
