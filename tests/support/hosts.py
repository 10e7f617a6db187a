"""Hosts that look like hosts, on one machine: the project's multi-host test harness.

    h = Hosts(3)                     # three "hosts" on one bridge (root only)
    p = h.spawn(0, ["tessera", "node", ...], log="node0.log")   # runs as host 0
    h.run(1, ["tessera", "status", "--json"])                    # a command on host 1
    h.isolate(2); h.rejoin(2)        # cut one host off the others, and heal
    h.close()

Each host is
  - a network namespace with `eth0` (10.N.M.<i+1>/24) on a bridge, `lo` up, and a default route
    out of eth0 (on-link: packets for anywhere else go nowhere, but the kernel picks routes and
    source addresses as it does on a LAN host);
  - for every process started on it, a mount and a UTS namespace of the process's own in which
    the host has its own hostname (`host-a`, `host-b`, ...), its own /etc/hosts naming every host,
    and its own /proc/sys/kernel/random/boot_id, so that Tessera sees several machines (no shm
    links between them: the bulk transport is tcp, as between real hosts).

The bridge lives in the root namespace with address .254, so this process (a "laptop" on the
LAN) reaches every host; nothing else is routed. Optionally each host runs its own D-Bus system
bus and avahi-daemon (`start_avahi()`), so that mDNS discovery crosses the bridge as it would
between machines; processes spawned afterwards get DBUS_SYSTEM_BUS_ADDRESS for it.

Names carry our pid; close() removes every namespace, link and file the harness made.
"""
import os
import shutil
import subprocess
import tempfile
import time
import uuid

# Inside a host: bind its files over the machine's, set its name, then become the command.
_ENTER = ('mount --bind "$1/hosts" /etc/hosts && '
          'mount --bind "$1/boot_id" /proc/sys/kernel/random/boot_id && '
          'hostname "$2" && shift 2 && exec "$@"')


def unavailable():
    """Why the harness cannot run here ('' when it can)."""
    if os.geteuid() != 0:
        return "multi-host tests need root (network, mount and UTS namespaces)"
    for tool in ("ip", "unshare", "mount", "hostname"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (scripts/bootstrap installs it)"
    return ""


def _ip(*args):
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def _remove_leftovers():
    """Namespaces and bridges of harness processes that died without close() (kill -9, a CI
    timeout): their names carry the dead pid."""
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    links = subprocess.run(["ip", "-o", "link", "show", "type", "bridge"], capture_output=True,
                           text=True).stdout
    bridges = [l.split(":")[1].strip() for l in links.splitlines() if ":" in l]
    for name in ns + bridges:
        if not name.startswith("th"):
            continue
        digits = ""
        for c in name[2:]:
            if not c.isdigit():
                break
            digits += c
        if not digits or os.path.exists(f"/proc/{digits}"):
            continue
        if name in ns:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        else:
            subprocess.run(["ip", "link", "del", name], capture_output=True)


class Hosts:
    _made = 0  # harnesses made by this process (names stay unique while old ones are torn down)
    def __init__(self, n, name_prefix="host"):
        why = unavailable()
        if why:
            raise RuntimeError(why)
        pid = os.getpid()
        _remove_leftovers()
        self.n = n
        self._name_prefix = name_prefix
        # Interface names have 15 characters at most: th<pid>x<k>v<i> fits any pid and 99 hosts.
        Hosts._made += 1
        self.tag = f"th{pid}x{Hosts._made % 100}"
        # 10.80-99.x.0/24: apart from netns_lab (10.77), the chaos runner (10.79) and each other.
        self.net = f"10.{80 + pid % 20}.{(pid // 20) % 250}"
        self.bridge = f"{self.tag}br"
        self.names = []  # namespace of host i
        self.dir = tempfile.mkdtemp(prefix="tessera-hosts-")
        self.avahi = {}  # host -> (dbus Popen, avahi Popen)
        self._cut = set()  # (i, j) pairs with blackhole routes
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.net}.254/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(n):
                self._add_host(i)
        except Exception:
            self.close()
            raise

    def _add_host(self, i):
        ns = f"{self.tag}h{i}"
        _ip("netns", "add", ns)
        self.names.append(ns)
        veth = f"{self.tag}v{i}"
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", veth, "master", self.bridge, "up")
        _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "route", "add", "default", "dev", "eth0")
        d = self.host_dir(i)
        os.makedirs(d)
        with open(os.path.join(d, "boot_id"), "w") as f:
            f.write(str(uuid.uuid4()) + "\n")
        self._write_hosts_files()

    def _write_hosts_files(self):
        lines = ["127.0.0.1\tlocalhost"]
        lines += [f"{self.address(j)}\t{self.hostname(j)}" for j in range(len(self.names))]
        for i in range(len(self.names)):
            with open(os.path.join(self.host_dir(i), "hosts"), "w") as f:
                f.write("\n".join(lines + [f"127.0.1.1\t{self.hostname(i)}"]) + "\n")

    # --- naming -----------------------------------------------------------------------------

    def address(self, i):
        return f"{self.net}.{i + 1}"

    def hostname(self, i):
        return f"{self._name_prefix}-{chr(ord('a') + i)}"

    def host_dir(self, i):
        return os.path.join(self.dir, self.hostname(i))

    def boot_id(self, i):
        with open(os.path.join(self.host_dir(i), "boot_id")) as f:
            return f.read().strip()

    # --- running commands on a host ---------------------------------------------------------

    def command(self, i, argv):
        """argv as host i runs it (its network, its name, its /etc/hosts, its boot id)."""
        return ["ip", "netns", "exec", self.names[i], "unshare", "--mount", "--uts",
                "--propagation", "private", "sh", "-c", _ENTER, "sh", self.host_dir(i),
                self.hostname(i), *argv]

    def env(self, i, extra=None):
        e = dict(os.environ)
        if i in self.avahi:
            e["DBUS_SYSTEM_BUS_ADDRESS"] = f"unix:path={self._bus_socket(i)}"
        e.update(extra or {})
        return e

    def spawn(self, i, argv, log, env=None):
        """Starts argv on host i, output to `log`; the Popen's pid is the command's own (every
        wrapper execs), so signals reach it directly."""
        out = open(log, "ab")
        try:
            return subprocess.Popen(self.command(i, argv), stdout=out, stderr=subprocess.STDOUT,
                                    env=self.env(i, env), start_new_session=True)
        finally:
            out.close()

    def run(self, i, argv, timeout=60, env=None):
        return subprocess.run(self.command(i, argv), capture_output=True, text=True,
                              timeout=timeout, env=self.env(i, env))

    # --- faults -----------------------------------------------------------------------------

    def cut(self, i, j):
        """No packet between hosts i and j, either way (blackhole routes in both)."""
        for a, b in ((i, j), (j, i)):
            if (a, b) not in self._cut:
                _ip("-n", self.names[a], "route", "add", "blackhole", f"{self.address(b)}/32")
                self._cut.add((a, b))

    def heal(self, i, j):
        for a, b in ((i, j), (j, i)):
            if (a, b) in self._cut:
                _ip("-n", self.names[a], "route", "del", "blackhole", f"{self.address(b)}/32")
                self._cut.discard((a, b))

    def isolate(self, i):
        for j in range(self.n):
            if j != i:
                self.cut(i, j)

    def rejoin(self, i):
        for j in range(self.n):
            if j != i:
                self.heal(i, j)

    # --- mDNS: a bus and an avahi-daemon per host -------------------------------------------

    def _bus_socket(self, i):
        return os.path.join(self.host_dir(i), "bus.sock")

    def start_avahi(self, i, timeout_s=30):
        """Starts host i's own system bus and avahi-daemon (publishing `hostname(i)`.local on its
        eth0). Processes spawned on host i afterwards use that bus."""
        d = self.host_dir(i)
        sock = self._bus_socket(i)
        with open(os.path.join(d, "bus.conf"), "w") as f:
            f.write('<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration '
                    '1.0//EN" "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">\n'
                    f'<busconfig><type>system</type><listen>unix:path={sock}</listen>'
                    '<auth>EXTERNAL</auth><policy context="default"><allow user="*"/>'
                    '<allow own="*"/><allow send_destination="*" eavesdrop="true"/>'
                    '<allow eavesdrop="true"/></policy></busconfig>\n')
        with open(os.path.join(d, "avahi.conf"), "w") as f:
            f.write(f"[server]\nhost-name={self.hostname(i)}\nuse-ipv4=yes\nuse-ipv6=no\n"
                    "allow-interfaces=eth0\nenable-dbus=yes\n"
                    "ratelimit-interval-usec=1000000\nratelimit-burst=1000\n"
                    "[wide-area]\nenable-wide-area=no\n"
                    "[publish]\npublish-hinfo=no\npublish-workstation=no\n")
        bus = subprocess.Popen(["dbus-daemon", f"--config-file={d}/bus.conf", "--nofork",
                                "--nopidfile"], stdout=subprocess.DEVNULL,
                               stderr=open(os.path.join(d, "dbus.log"), "ab"))
        end = time.time() + timeout_s
        while not os.path.exists(sock):
            if time.time() > end or bus.poll() is not None:
                bus.kill()
                raise RuntimeError(f"dbus-daemon for {self.hostname(i)} did not start")
            time.sleep(0.02)
        # Its pid file goes to /run/avahi-daemon: a tmpfs of this host's own, so that one
        # daemon per host (and the machine's own, if any) do not clash.
        log = os.path.join(d, "avahi.log")
        avahi = self.spawn(i, ["sh", "-c",
                               "mount -t tmpfs tmpfs /run && mkdir -p /run/avahi-daemon && "
                               f"exec avahi-daemon -f {d}/avahi.conf --no-drop-root --no-chroot "
                               "--no-rlimits --no-proc-title"], log,
                           env={"DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={sock}"})
        while True:
            with open(log, errors="replace") as f:
                if "Server startup complete" in f.read():
                    break
            if time.time() > end or avahi.poll() is not None:
                avahi.kill()
                bus.kill()
                raise RuntimeError(f"avahi-daemon on {self.hostname(i)} did not start: see {log}")
            time.sleep(0.05)
        self.avahi[i] = (bus, avahi)

    # --- teardown ---------------------------------------------------------------------------

    def close(self, keep_files=False):
        for bus, avahi in self.avahi.values():
            for p in (avahi, bus):
                p.terminate()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
        self.avahi = {}
        for i, ns in enumerate(self.names):
            # The root end first: a namespace's deletion (and with it its veth end) completes
            # asynchronously in the kernel.
            subprocess.run(["ip", "link", "del", f"{self.tag}v{i}"], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.names = []
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        if not keep_files:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
