#include "mesh/node/data_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace tessera::mesh {
namespace fs = std::filesystem;

namespace {

constexpr const char* identity_file_name = "node.id";
constexpr const char* lock_file_name = "lock";
// node.id is a few hundred bytes; anything far larger is not ours.
constexpr std::size_t max_identity_file_bytes = 64 * 1024;

std::string read_first_line(const char* file) {
  std::ifstream in(file);
  std::string line;
  if (in) std::getline(in, line);
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ' || line.back() == '\r')) {
    line.pop_back();
  }
  return line;
}

std::string errno_text() {
  return std::strerror(errno);
}

result<std::string> read_small_file(const fs::path& file) {
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error(errc::io, "{}: cannot open: {}", file.string(), errno_text());
  std::string data;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      auto err = make_error(errc::io, "{}: read failed: {}", file.string(), errno_text());
      ::close(fd);
      return err;
    }
    if (n == 0) break;
    data.append(buf, static_cast<std::size_t>(n));
    if (data.size() > max_identity_file_bytes) {
      ::close(fd);
      return make_error(errc::corrupt, "{}: larger than {} bytes; not a node identity file",
                        file.string(), max_identity_file_bytes);
    }
  }
  ::close(fd);
  return data;
}

result<void> write_file_atomically(const fs::path& file, const std::string& text) {
  fs::path tmp = file;
  tmp += ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return make_error(errc::io, "{}: cannot create: {}", tmp.string(), errno_text());
  std::size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      auto err = make_error(errc::io, "{}: write failed: {}", tmp.string(), errno_text());
      ::close(fd);
      return err;
    }
    done += static_cast<std::size_t>(n);
  }
  // fsync before rename so a crash leaves either no node.id or a whole one, never a torn one.
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    return make_error(errc::io, "{}: fsync failed: {}", tmp.string(), errno_text());
  }
  if (::rename(tmp.c_str(), file.c_str()) != 0) {
    return make_error(errc::io, "{}: rename to {} failed: {}", tmp.string(), file.string(),
                      errno_text());
  }
  int dfd = ::open(file.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return ok();
}

}  // namespace

result<dir_fingerprint> fingerprint_of(const fs::path& dir) {
  std::error_code ec;
  fs::path canonical = fs::canonical(dir, ec);
  if (ec) return make_error(errc::io, "{}: cannot resolve path: {}", dir.string(), ec.message());
  struct stat st {};
  if (::stat(canonical.c_str(), &st) != 0) {
    return make_error(errc::io, "{}: stat failed: {}", canonical.string(), errno_text());
  }
  dir_fingerprint fp;
  fp.path = canonical.string();
  fp.device = static_cast<std::uint64_t>(st.st_dev);
  fp.inode = static_cast<std::uint64_t>(st.st_ino);
  fp.machine_id = read_first_line("/etc/machine-id");
  if (fp.machine_id.empty()) fp.machine_id = read_first_line("/var/lib/dbus/machine-id");
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0) fp.hostname = host;
  fp.boot_id = read_first_line("/proc/sys/kernel/random/boot_id");
  return fp;
}

result<void> check_identity_home(const identity_record& record, const dir_fingerprint& here,
                                 const fs::path& node_id_file) {
  const dir_fingerprint& then = record.created_in;
  std::string why;
  if (!then.machine_id.empty() || !here.machine_id.empty()) {
    if (then.machine_id != here.machine_id) {
      why = fmt::format("it was created on machine {} (host {}), this is machine {} (host {})",
                        then.machine_id.empty() ? "<none>" : then.machine_id, then.hostname,
                        here.machine_id.empty() ? "<none>" : here.machine_id, here.hostname);
    }
  } else if (then.hostname != here.hostname) {
    why = fmt::format("it was created on host {}, this is host {}", then.hostname, here.hostname);
  }
  if (why.empty() && then.path != here.path) {
    why = fmt::format("it was created in {}, this directory is {}", then.path, here.path);
  }
  if (why.empty() && then.inode != here.inode) {
    why = fmt::format(
        "it was created in {} with inode {}, the directory there now has inode {} "
        "(replaced by a copy or a restored backup)",
        then.path, then.inode, here.inode);
  }
  if (why.empty()) return ok();
  return make_error(errc::invalid_argument,
                    "duplicate node identity: {} belongs to another data directory: {}. A copied "
                    "data directory would make two nodes share node id {}. Remove {} (or pass "
                    "--reset-identity) to give this node a new identity",
                    node_id_file.string(), why, record.id.to_string(), node_id_file.string());
}

std::string encode_identity(const identity_record& r) {
  nlohmann::ordered_json j;
  j["format"] = r.format;
  j["node_id"] = r.id.to_string();
  j["created_unix_ms"] = r.created_unix_ms;
  j["created_in"] = {{"path", r.created_in.path},         {"device", r.created_in.device},
                     {"inode", r.created_in.inode},       {"machine_id", r.created_in.machine_id},
                     {"hostname", r.created_in.hostname}, {"boot_id", r.created_in.boot_id}};
  return j.dump(2) + "\n";
}

result<identity_record> decode_identity(std::string_view text, const fs::path& file) {
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](std::string_view what) {
    return make_error(errc::corrupt,
                      "{}: {}; remove the file (or pass --reset-identity) to create a new identity",
                      file.string(), what);
  };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  identity_record r;
  auto field = [&](const nlohmann::json& obj, const char* key,
                   nlohmann::json::value_t type) -> const nlohmann::json* {
    auto it = obj.find(key);
    if (it == obj.end()) return nullptr;
    bool numeric = type == nlohmann::json::value_t::number_unsigned ||
                   type == nlohmann::json::value_t::number_integer;
    if (numeric ? !it->is_number_integer() : it->type() != type) return nullptr;
    return &*it;
  };
  using vt = nlohmann::json::value_t;
  const auto* format = field(j, "format", vt::number_integer);
  if (!format) return bad("field 'format' missing or not an integer");
  if (format->get<int>() != 1) {
    return make_error(errc::unsupported, "{}: format {} is not supported (this build reads 1)",
                      file.string(), format->get<int>());
  }
  const auto* id = field(j, "node_id", vt::string);
  if (!id) return bad("field 'node_id' missing or not a string");
  auto parsed = node_id::parse(id->get<std::string>());
  if (!parsed) return bad(parsed.error().message);
  if (parsed->is_zero()) return bad("node_id is all zeros");
  r.id = *parsed;
  if (const auto* ms = field(j, "created_unix_ms", vt::number_integer)) {
    r.created_unix_ms = ms->get<std::int64_t>();
  }
  const auto* in = field(j, "created_in", vt::object);
  if (!in) return bad("field 'created_in' missing or not an object");
  const auto* path = field(*in, "path", vt::string);
  const auto* inode = field(*in, "inode", vt::number_unsigned);
  if (!path || !inode) return bad("field 'created_in.path' or 'created_in.inode' missing");
  r.created_in.path = path->get<std::string>();
  r.created_in.inode = inode->get<std::uint64_t>();
  if (const auto* v = field(*in, "device", vt::number_unsigned)) {
    r.created_in.device = v->get<std::uint64_t>();
  }
  for (auto [key, out] : {std::pair{"machine_id", &r.created_in.machine_id},
                          std::pair{"hostname", &r.created_in.hostname},
                          std::pair{"boot_id", &r.created_in.boot_id}}) {
    const auto* v = field(*in, key, vt::string);
    if (!v) return bad(fmt::format("field 'created_in.{}' missing or not a string", key));
    *out = v->get<std::string>();
  }
  return r;
}

data_dir::data_dir(data_dir&& other) noexcept
    : path_(std::move(other.path_)),
      record_(std::move(other.record_)),
      lock_fd_(std::exchange(other.lock_fd_, -1)),
      created_(other.created_),
      warning_(std::move(other.warning_)) {}

data_dir& data_dir::operator=(data_dir&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    record_ = std::move(other.record_);
    lock_fd_ = std::exchange(other.lock_fd_, -1);
    created_ = other.created_;
    warning_ = std::move(other.warning_);
  }
  return *this;
}

data_dir::~data_dir() {
  release();
}

void data_dir::release() noexcept {
  if (lock_fd_ >= 0) {
    ::close(lock_fd_);  // closing the last descriptor drops the flock
    lock_fd_ = -1;
  }
}

namespace {

// Takes <dir>/lock exclusively and writes our pid into it (for the error the next process sees).
result<int> take_lock(const fs::path& dir) {
  fs::path file = dir / lock_file_name;
  int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return make_error(errc::io, "{}: cannot open: {}", file.string(), errno_text());
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    char buf[32] = {};
    ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    ::close(fd);
    std::string holder = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "unknown";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' '))
      holder.pop_back();
    if (err == EWOULDBLOCK) {
      return make_error(errc::io,
                        "data dir {} is in use by another process (pid {} holds {}); each node "
                        "needs its own data directory",
                        dir.string(), holder, file.string());
    }
    return make_error(errc::io, "{}: flock failed: {}", file.string(), std::strerror(err));
  }
  std::string pid = fmt::format("{}\n", ::getpid());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    auto e = make_error(errc::io, "{}: cannot write pid: {}", file.string(), errno_text());
    ::close(fd);
    return e;
  }
  return fd;
}

result<identity_record> create_identity(const fs::path& file, const dir_fingerprint& here) {
  identity_record r;
  auto id = node_id::random();
  if (!id) return std::move(id).error();
  r.id = *id;
  r.created_in = here;
  r.created_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  TESSERA_TRY(write_file_atomically(file, encode_identity(r)));
  return r;
}

}  // namespace

result<data_dir> data_dir::open(const fs::path& dir, const data_dir_options& options) {
  if (dir.empty()) return make_error(errc::invalid_argument, "data dir: empty path");
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    return make_error(errc::invalid_argument, "data dir {}: exists and is not a directory",
                      dir.string());
  }
  bool created = fs::create_directories(dir, ec);
  if (ec) return make_error(errc::io, "data dir {}: cannot create: {}", dir.string(), ec.message());
  // The identity is private to the node; an existing directory keeps the permissions it has.
  if (created) fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, ec);
  auto here = fingerprint_of(dir);
  if (!here) return std::move(here).error();

  data_dir d;
  d.path_ = here->path;
  if (!created) {
    const auto perms = fs::status(dir, ec).permissions();
    if (!ec && (perms & (fs::perms::group_write | fs::perms::others_write)) != fs::perms::none)
      d.warning_ = fmt::format(
          "data dir {} is writable by group or others (mode {:o}): they can replace this node's "
          "identity and election state; run chmod 700 on it",
          dir.string(), static_cast<unsigned>(perms) & 0777u);
  }
  auto fd = take_lock(d.path_);
  if (!fd) return std::move(fd).error();
  d.lock_fd_ = *fd;  // from here on, d's destructor releases the lock on every error path

  fs::path file = d.path_ / identity_file_name;
  if (options.reset_identity) {
    fs::remove(file, ec);
    if (ec) return make_error(errc::io, "{}: cannot remove: {}", file.string(), ec.message());
  }
  if (!fs::exists(file, ec)) {
    auto r = create_identity(file, *here);
    if (!r) return std::move(r).error();
    d.record_ = std::move(r).value();
    d.created_ = true;
    return d;
  }
  auto text = read_small_file(file);
  if (!text) return std::move(text).error();
  auto r = decode_identity(*text, file);
  if (!r) return std::move(r).error();
  TESSERA_TRY(check_identity_home(*r, *here, file));
  d.record_ = std::move(r).value();
  return d;
}

}  // namespace tessera::mesh
