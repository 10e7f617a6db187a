#include "tests/support/private_avahi.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace tessera::test {
namespace {

std::atomic<int> counter{0};

bool on_path(const char* program) {
  return run_command({"sh", "-c", fmt::format("command -v {}", program)}).has_value();
}

}  // namespace

std::string private_avahi::unavailable_reason() {
  if (::geteuid() != 0) {
    return "the private avahi fixture needs root (network + mount namespaces); skipped";
  }
  for (const char* p : {"dbus-daemon", "avahi-daemon", "ip", "unshare"}) {
    if (!on_path(p)) return fmt::format("{} not installed (scripts/bootstrap installs it)", p);
  }
  return "";
}

result<std::unique_ptr<private_avahi>> private_avahi::start_bus() {
  if (auto why = unavailable_reason(); !why.empty())
    return make_error(errc::unsupported, "{}", why);
  auto self = std::unique_ptr<private_avahi>(new private_avahi());
  char tmpl[] = "/tmp/tessera-avahi-XXXXXX";
  if (!::mkdtemp(tmpl)) return make_error(errc::io, "mkdtemp failed");
  self->dir_ = tmpl;
  self->netns_ = fmt::format("tsr{}-av{}", ::getpid(), counter.fetch_add(1));
  std::string sock = self->dir_ + "/bus.sock";
  {
    std::ofstream bus(self->dir_ + "/bus.conf");
    bus << "<!DOCTYPE busconfig PUBLIC \"-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN\"\n"
           " \"http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd\">\n"
           "<busconfig>\n  <type>system</type>\n  <listen>unix:path="
        << sock
        << "</listen>\n  <auth>EXTERNAL</auth>\n"
           "  <policy context=\"default\">\n    <allow user=\"*\"/>\n    <allow own=\"*\"/>\n"
           "    <allow send_destination=\"*\" eavesdrop=\"true\"/>\n"
           "    <allow eavesdrop=\"true\"/>\n  </policy>\n</busconfig>\n";
    std::ofstream avahi(self->dir_ + "/avahi.conf");
    avahi << "[server]\nhost-name=tessera-test\nuse-ipv4=yes\nuse-ipv6=no\nallow-interfaces=lo\n"
             "enable-dbus=yes\nratelimit-interval-usec=1000000\nratelimit-burst=1000\n"
             "[wide-area]\nenable-wide-area=no\n"
             "[publish]\npublish-hinfo=no\npublish-workstation=no\npublish-addresses=yes\n";
  }
  self->bus_address_ = "unix:path=" + sock;
  auto dbus = child_process::spawn(
      {"dbus-daemon", "--config-file=" + self->dir_ + "/bus.conf", "--nofork", "--nopidfile"}, {},
      self->dir_ + "/dbus.log");
  if (!dbus) return std::move(dbus).error();
  self->dbus_ = std::move(dbus).value();
  if (!wait_until([&] { return std::filesystem::exists(sock); })) {
    return make_error(errc::timeout, "dbus-daemon did not create {}: {}", sock,
                      read_file(self->dir_ + "/dbus.log"));
  }
  for (auto args : {std::vector<std::string>{"ip", "netns", "add", self->netns_},
                    {"ip", "-n", self->netns_, "link", "set", "lo", "up"},
                    {"ip", "-n", self->netns_, "link", "set", "lo", "multicast", "on"}}) {
    auto r = run_command(args);
    if (!r) return std::move(r).error();
  }
  return self;
}

result<void> private_avahi::start_avahi() {
  TESSERA_ASSERT(!avahi_.running(), "avahi-daemon already running");
  std::string log = fmt::format("{}/avahi.{}.log", dir_, ++avahi_starts_);
  std::string script = fmt::format(
      "mount -t tmpfs tmpfs /run && mkdir -p /run/avahi-daemon && exec avahi-daemon -f "
      "{}/avahi.conf --no-drop-root --no-chroot --no-rlimits --no-proc-title",
      dir_);
  auto child = child_process::spawn({"ip", "netns", "exec", netns_, "unshare", "--mount",
                                     "--propagation", "private", "sh", "-c", script},
                                    {"DBUS_SYSTEM_BUS_ADDRESS=" + bus_address_}, log);
  if (!child) return std::move(child).error();
  avahi_ = std::move(child).value();
  bool up = wait_until([&] {
    return read_file(log).find("Server startup complete") != std::string::npos || !avahi_.running();
  });
  if (!up || !avahi_.running()) {
    return make_error(errc::timeout, "avahi-daemon did not start: {}", read_file(log));
  }
  return ok();
}

void private_avahi::stop_avahi() {
  avahi_.terminate();
}

std::string private_avahi::avahi_log() const {
  return read_file(fmt::format("{}/avahi.{}.log", dir_, avahi_starts_));
}

private_avahi::~private_avahi() {
  avahi_.terminate();
  dbus_.terminate();
  if (!netns_.empty()) (void)run_command({"ip", "netns", "del", netns_});
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

}  // namespace tessera::test
