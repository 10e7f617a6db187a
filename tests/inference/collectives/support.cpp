#include "tests/inference/collectives/support.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <iostream>
#include <sstream>
#include <thread>

namespace tessera::inference::collectives::testing {

namespace {

std::string to_hex(const std::vector<std::byte>& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (std::byte b : bytes) {
    s += digits[std::to_integer<unsigned>(b) >> 4];
    s += digits[std::to_integer<unsigned>(b) & 15];
  }
  return s;
}

std::vector<std::byte> from_hex(const std::string& text) {
  std::vector<std::byte> out;
  auto val = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (std::size_t i = 0; i + 1 < text.size(); i += 2) {
    const int hi = val(text[i]), lo = val(text[i + 1]);
    if (hi < 0 || lo < 0) return {};
    out.push_back(static_cast<std::byte>(hi * 16 + lo));
  }
  return out;
}

bool write_all(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    const ssize_t w = ::write(fd, s.data() + off, s.size() - off);
    if (w <= 0) return false;
    off += static_cast<std::size_t>(w);
  }
  return true;
}

// Connects every set-up with its peer's params, all at once (a sequential order could wait on a
// peer that is itself waiting on a third).
result<std::vector<std::unique_ptr<bulk::link>>> connect_all(
    std::vector<std::unique_ptr<bulk::link_setup>>& setups,
    const std::vector<bulk::connect_params>& remote) {
  const std::size_t n = setups.size();
  std::vector<std::unique_ptr<bulk::link>> links(n);
  std::vector<std::optional<error>> errors(n);
  std::vector<std::thread> threads;
  for (std::size_t j = 0; j < n; ++j) {
    if (!setups[j]) continue;
    threads.emplace_back([&, j] {
      auto l = setups[j]->connect(remote[j]);
      if (l) {
        links[j] = std::move(*l);
      } else {
        errors[j] = l.error();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (std::size_t j = 0; j < n; ++j) {
    if (errors[j]) return make_error(errors[j]->code, "connect to rank {}: {}", j, errors[j]->describe());
  }
  return links;
}

}  // namespace

bulk::link_options link_options_for(bulk::backend_kind kind) {
  (void)kind;
  bulk::link_options o;
  o.limits.max_buffers = 8;
  o.limits.max_outstanding = 64;
  o.limits.max_received = 64;
  o.connect_timeout_ms = std::chrono::milliseconds(30'000);
  o.peer_timeout_ms = std::chrono::milliseconds(20'000);
  return o;
}

result<mesh_links> make_local_mesh(bulk::backend_kind kind, std::uint32_t n) {
  mesh_links mesh(n);
  for (auto& r : mesh) r.resize(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    for (std::uint32_t j = i + 1; j < n; ++j) {
      auto a = bulk::prepare_link(kind, link_options_for(kind));
      if (!a) return a.error();
      auto b = bulk::prepare_link(kind, link_options_for(kind));
      if (!b) return b.error();
      const auto pa = (*a)->local_params();
      const auto pb = (*b)->local_params();
      result<std::unique_ptr<bulk::link>> lb = make_error(errc::internal, "not run");
      std::thread t([&] { lb = (*b)->connect(pa); });
      auto la = (*a)->connect(pb);
      t.join();
      if (!la) return la.error();
      if (!lb) return lb.error();
      mesh[i][j] = std::move(*la);
      mesh[j][i] = std::move(*lb);
    }
  }
  return mesh;
}

std::vector<bulk::link*> row(const mesh_links& mesh, std::uint32_t i) {
  return pointers(mesh[i]);
}

std::vector<bulk::link*> pointers(const std::vector<std::unique_ptr<bulk::link>>& links) {
  std::vector<bulk::link*> out;
  for (const auto& l : links) out.push_back(l.get());
  return out;
}

child::~child() {
  if (to_child >= 0) ::close(to_child);
  if (from_child >= 0) ::close(from_child);
  if (pid > 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
}

int child::reap() {
  int status = 0;
  ::waitpid(pid, &status, 0);
  pid = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string child::read_line() const {
  std::string line;
  char ch = 0;
  while (::read(from_child, &ch, 1) == 1 && ch != '\n') line += ch;
  return line;
}

result<launched_mesh> launch_mesh(bulk::backend_kind kind, std::uint32_t n,
                                  const std::vector<std::vector<std::string>>& argv_for) {
  launched_mesh m;
  for (std::uint32_t r = 1; r < n; ++r) {
    int in[2], out[2];
    if (::pipe(in) != 0 || ::pipe(out) != 0) return make_error(errc::io, "pipe failed");
    auto c = std::make_unique<child>();
    std::vector<std::string> args = argv_for[r];
    c->pid = ::fork();
    if (c->pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::close(in[0]);
      ::close(in[1]);
      ::close(out[0]);
      ::close(out[1]);
      std::vector<char*> cargs;
      for (auto& a : args) cargs.push_back(a.data());
      cargs.push_back(nullptr);
      ::execv(cargs[0], cargs.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    c->to_child = in[1];
    c->from_child = out[0];
    m.children.push_back(std::move(c));
  }
  std::vector<std::unique_ptr<bulk::link_setup>> setups(n);
  for (std::uint32_t j = 1; j < n; ++j) {
    auto s = bulk::prepare_link(kind, link_options_for(kind));
    if (!s) return s.error();
    setups[j] = std::move(*s);
  }
  // params[i][j]: what rank i prepared for rank j.
  std::vector<std::vector<std::string>> params(n, std::vector<std::string>(n));
  for (std::uint32_t j = 1; j < n; ++j) params[0][j] = to_hex(bulk::encode(setups[j]->local_params()));
  for (std::uint32_t r = 1; r < n; ++r) {
    for (std::uint32_t k = 0; k + 1 < n; ++k) {
      std::istringstream line(m.children[r - 1]->read_line());
      std::uint32_t j = 0;
      std::string hex;
      if (!(line >> j >> hex) || j >= n || j == r) {
        return make_error(errc::protocol, "rank {} process sent no usable params", r);
      }
      params[r][j] = hex;
    }
  }
  for (std::uint32_t r = 1; r < n; ++r) {
    std::string text;
    for (std::uint32_t j = 0; j < n; ++j) {
      if (j != r) text += std::to_string(j) + " " + params[j][r] + "\n";
    }
    if (!write_all(m.children[r - 1]->to_child, text)) {
      return make_error(errc::io, "cannot write to the rank {} process", r);
    }
  }
  std::vector<bulk::connect_params> remote(n);
  for (std::uint32_t j = 1; j < n; ++j) {
    auto p = bulk::decode_connect_params(from_hex(params[j][0]));
    if (!p) return p.error();
    remote[j] = *p;
  }
  auto links = connect_all(setups, remote);
  if (!links) return links.error();
  m.links = std::move(*links);
  return m;
}

result<std::vector<std::unique_ptr<bulk::link>>> join_mesh(bulk::backend_kind kind,
                                                           std::uint32_t n, std::uint32_t rank) {
  std::vector<std::unique_ptr<bulk::link_setup>> setups(n);
  for (std::uint32_t j = 0; j < n; ++j) {
    if (j == rank) continue;
    auto s = bulk::prepare_link(kind, link_options_for(kind));
    if (!s) return s.error();
    setups[j] = std::move(*s);
    std::cout << j << " " << to_hex(bulk::encode(setups[j]->local_params())) << "\n";
  }
  std::cout << std::flush;
  std::vector<bulk::connect_params> remote(n);
  for (std::uint32_t k = 0; k + 1 < n; ++k) {
    std::string line;
    if (!std::getline(std::cin, line)) return make_error(errc::protocol, "no params on stdin");
    std::istringstream in(line);
    std::uint32_t j = 0;
    std::string hex;
    if (!(in >> j >> hex) || j >= n || j == rank) return make_error(errc::protocol, "bad params line");
    auto p = bulk::decode_connect_params(from_hex(hex));
    if (!p) return p.error();
    remote[j] = *p;
  }
  return connect_all(setups, remote);
}

std::vector<float> input(std::uint32_t rank, std::uint32_t round, std::size_t len) {
  std::vector<float> v(len);
  std::uint64_t s = 0x9e3779b97f4a7c15ull * (rank + 1) + 0x632be59bd9b4e5d7ull * (round + 1);
  for (std::size_t i = 0; i < len; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const double unit = static_cast<double>(s >> 11) / static_cast<double>(1ull << 53);  // [0,1)
    const int exponent = static_cast<int>((s >> 3) % 24) - 12;
    v[i] = static_cast<float>((unit - 0.5) * std::ldexp(1.0, exponent));
  }
  return v;
}

std::vector<float> rank_order_sum(std::uint32_t n, std::uint32_t round, std::size_t len) {
  std::vector<float> acc = input(0, round, len);
  for (std::uint32_t r = 1; r < n; ++r) {
    const auto x = input(r, round, len);
    for (std::size_t i = 0; i < len; ++i) acc[i] = acc[i] + x[i];
  }
  return acc;
}

std::vector<float> ring_order_sum(std::uint32_t n, std::uint32_t round, std::size_t len,
                                  std::size_t max_floats) {
  std::vector<std::vector<float>> x(n);
  for (std::uint32_t r = 0; r < n; ++r) x[r] = input(r, round, len);
  std::vector<float> out(len);
  for (std::size_t off = 0; off < len; off += max_floats) {
    const std::size_t piece = std::min(max_floats, len - off);
    for (std::uint32_t c = 0; c < n; ++c) {
      const std::size_t b = piece * c / n, e = piece * (c + 1) / n;
      for (std::size_t i = b; i < e; ++i) {
        float acc = x[c][off + i];
        for (std::uint32_t k = 1; k < n; ++k) acc = acc + x[(c + k) % n][off + i];
        out[off + i] = acc;
      }
    }
  }
  return out;
}

std::uint64_t fingerprint(std::span<const float> values) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(values.data());
  for (std::size_t i = 0; i < values.size_bytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace tessera::inference::collectives::testing
