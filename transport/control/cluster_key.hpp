// The cluster secret and everything derived from it (see docs/design/001-control-plane-security.md).
//
//   secret (32 random bytes, from `tessera keygen`)
//     ├─ crypto_kdf(id 1, ctx "TSclstid") → 16 bytes → cluster id (public: discovery TXT records)
//     ├─ crypto_kdf(id 2, ctx "TScurvsv") → Curve25519 server secret key → server public key
//     └─ crypto_kdf(id 3, ctx "TScurvcl") → Curve25519 client secret key → client public key
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

/// Everything a node needs for CURVE, derived deterministically from one secret.
struct cluster_keys {
  std::string cluster_id;  ///< 32 hex chars; public
  curve_keypair server;    ///< the ROUTER's keypair (same on every member)
  curve_keypair client;    ///< every DEALER's keypair (same on every member)
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

/// Writes `text` to a new file with mode 0600. Fails if the file exists unless `overwrite`.
[[nodiscard]] result<void> write_secret_file(const std::string& path, std::string_view text,
                                             bool overwrite);

/// The node's secret: from `file` when given, else from $TESSERA_CLUSTER_KEY (the secret or
/// "@file"). errc::not_found when neither is set.
[[nodiscard]] result<cluster_secret> load_cluster_secret(const std::optional<std::string>& file);

/// Derives the cluster id and the CURVE keypairs (libsodium crypto_kdf + crypto_scalarmult_base).
[[nodiscard]] result<cluster_keys> derive_cluster_keys(const cluster_secret& secret);

/// The z85 text form of a 32-byte key (40 chars), as libzmq's CURVE options take it.
[[nodiscard]] std::string z85_key(const std::array<std::uint8_t, 32>& key);

}  // namespace tessera::transport::control
