// data_dir: the node's data directory, holding its persistent identity and a lock.
//
// Layout:   <dir>/node.id   JSON: node id + where it was created (path, inode, machine, boot)
//           <dir>/lock      flock(LOCK_EX) held for the life of the process; contains its pid
//
// A node id must name exactly one running process. Two ways to break that are refused:
//   * two processes on one data dir      -> the second cannot take the flock  (errc::io)
//   * a copied data dir (cp -a, rsync, restored backup, cloned VM image)
//                                        -> node.id records the absolute path and inode of the
//                                           directory and the machine id it was created on; a
//                                           mismatch is a copy, refused (errc::invalid_argument)
//                                           until the user removes node.id or passes
//                                           --reset-identity.
// The device number is recorded but not compared: it can change across reboots (e.g. btrfs,
// device renumbering) while the directory is the same.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "actors/base/result.hpp"
#include "mesh/node/node_id.hpp"

namespace tessera::mesh {

/// Where a data directory lives: what node.id records at creation and compares on every start.
struct dir_fingerprint {
  std::string path;  ///< absolute, canonical path of the directory
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  std::string machine_id;  ///< /etc/machine-id; empty where the system has none
  std::string hostname;
  std::string boot_id;  ///< informational: changes on every boot, never compared
};

/// The contents of node.id.
struct identity_record {
  int format = 1;
  node_id id;
  dir_fingerprint created_in;
  std::int64_t created_unix_ms = 0;
};

/// Reads the fingerprint of an existing directory (stat, canonical path, machine id, hostname).
[[nodiscard]] result<dir_fingerprint> fingerprint_of(const std::filesystem::path& dir);

/// The copy rule, pure: ok when `record` was created in the directory described by `here`;
/// otherwise an error naming node.id, both places and the way out (remove node.id or
/// --reset-identity). Compared: path, inode, machine id (hostname when neither has a machine id).
[[nodiscard]] result<void> check_identity_home(const identity_record& record,
                                               const dir_fingerprint& here,
                                               const std::filesystem::path& node_id_file);

/// Encodes / decodes node.id (JSON). decode names the file and the field that is wrong.
[[nodiscard]] std::string encode_identity(const identity_record& record);
[[nodiscard]] result<identity_record> decode_identity(std::string_view text,
                                                      const std::filesystem::path& file);

struct data_dir_options {
  /// Discard an existing node.id (a copied one included) and create a fresh identity.
  bool reset_identity = false;
};

/// An opened, locked data directory. Move-only; the lock is released on destruction.
class data_dir {
 public:
  /// Creates `dir` (0700) if missing, takes the lock, then loads node.id or creates it.
  /// Errors: lock held by another process (io, names the pid), copied directory
  /// (invalid_argument), unreadable or corrupt node.id (corrupt), file system errors (io).
  [[nodiscard]] static result<data_dir> open(const std::filesystem::path& dir,
                                             const data_dir_options& options = {});

  data_dir(data_dir&& other) noexcept;
  data_dir& operator=(data_dir&& other) noexcept;
  data_dir(const data_dir&) = delete;
  data_dir& operator=(const data_dir&) = delete;
  ~data_dir();

  [[nodiscard]] node_id id() const noexcept { return record_.id; }
  [[nodiscard]] const identity_record& identity() const noexcept { return record_; }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  /// True when this open created node.id (first start or --reset-identity).
  [[nodiscard]] bool created_identity() const noexcept { return created_; }
  /// Set when the directory existed and group or others may write it: whoever can may replace
  /// the node's identity and election state. The node starts anyway (the operator chose the
  /// directory) and says so in its log.
  [[nodiscard]] const std::string& warning() const noexcept { return warning_; }

 private:
  data_dir() = default;
  void release() noexcept;

  std::filesystem::path path_;
  identity_record record_;
  int lock_fd_ = -1;
  bool created_ = false;
  std::string warning_;
};

}  // namespace tessera::mesh
