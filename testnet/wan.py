"""WAN emulation: one network namespace per node, links shaped with tc or held by a delay line.

`probe(spec)` says whether this machine can do it (root, iproute2's `ip` and `tc`, a namespace and a
veth pair that can actually be created, and a qdisc or delay line that can express the link) and, if not,
why, in one line. `WanNetwork` builds the namespaces and tears them down; the supervisor runs each node under
`exec_prefix(i)`, bound to `host(i)`.

Topology: node `i` lives in namespace `dlc-<tag>-<i>` with address 10.213.X.(i+2)/24; the root namespace
has 10.213.X.1 (so the supervisor reaches every node's HTTP port). The link spec shapes each node's *egress*
inside its namespace, so a packet between two nodes crosses exactly one shaped link: `delay` is one-way
(round trip = 2 × delay), `rate` is per node. How the namespaces are joined depends on the kernel:

- with tc netem (rate, delay, loss) or for a rate-only link (tbf), every namespace has a veth pair enslaved
  to the bridge `dlc<tag>br`;
- where the kernel lacks netem and the link has a delay or loss, every namespace has a TUN device instead,
  joined by `testnet.delayline` (a user-space switch that holds each packet for the delay; its module says
  what it models and what not); the rate is tbf on the TUN device (the uplink) and a token bucket in the
  switch (the downlink: several senders to one node share its rate). The root namespace's device keeps the
  name `dlc<tag>br`.

Partitions are `prohibit` routes inside the namespaces (a real network cut: packets are refused, not
delivered). `plug` joins another namespace (a NAT gateway, `testnet.nat`) at an address of the subnet.

Safety: only 127.0.0.0/8 and the addresses of namespaces created here are valid targets (`allows`).
`teardown` removes everything created, is idempotent, and never raises.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import secrets
import shutil
import socket
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from testnet.delayline import SwitchProcess, open_tun

__all__ = ["LinkSpec", "WanError", "WanNetwork", "WanSupport", "is_loopback", "probe"]

Runner = Callable[[Sequence[str]], tuple[int, str]]
ETC_NETNS = Path("/etc/netns")  # `ip netns exec NS` mounts the files of /etc/netns/NS over those of /etc


class WanError(RuntimeError):
    """Setting up the emulated network failed (the message names the command and its error)."""


def _run(cmd: Sequence[str]) -> tuple[int, str]:
    """Run a command quietly; (exit status, stderr stripped)."""
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 127, str(e)
    return done.returncode, done.stderr.strip()


_UNIT = {"bit": 1e-6, "kbit": 1e-3, "mbit": 1.0, "gbit": 1e3, "tbit": 1e6}


@dataclasses.dataclass(frozen=True)
class LinkSpec:
    """One node's emulated link: `rate_mbit` (None = unlimited), one-way `delay_ms`, `loss_pct`."""

    rate_mbit: float | None = 2000.0
    delay_ms: float = 30.0
    loss_pct: float = 0.0

    def __post_init__(self) -> None:
        if (self.rate_mbit is not None and not self.rate_mbit > 0) or self.delay_ms < 0 \
                or not 0 <= self.loss_pct < 100:
            raise ValueError(f"invalid link: {self}")

    @classmethod
    def parse(cls, text: str) -> LinkSpec:
        """Comma-separated, any order: a rate (`2gbit`, `500mbit`), a delay (`30ms`, `0.03s`), a loss
        (`0.1%`). Missing parts take the defaults (2 Gbit/s, 30 ms, no loss). Raises ValueError."""
        rate, delay, loss = cls.rate_mbit, cls.delay_ms, cls.loss_pct
        for part in (p.strip().lower() for p in text.split(",") if p.strip()):
            if m := re.fullmatch(r"([0-9.]+)\s*(tbit|gbit|mbit|kbit|bit)", part):
                rate = float(m[1]) * _UNIT[m[2]]
            elif m := re.fullmatch(r"([0-9.]+)\s*(ms|s)", part):
                delay = float(m[1]) * (1000.0 if m[2] == "s" else 1.0)
            elif m := re.fullmatch(r"([0-9.]+)\s*%", part):
                loss = float(m[1])
            else:
                raise ValueError(f"--wan: cannot read {part!r} (expected e.g. 2gbit, 30ms, 0.1%)")
        return cls(rate, delay, loss)

    @property
    def unshaped(self) -> bool:
        """No rate, delay or loss: namespaces only (separate hosts on a plain switch), no tc."""
        return self.rate_mbit is None and not self.needs_netem

    @property
    def needs_netem(self) -> bool:
        return self.delay_ms > 0 or self.loss_pct > 0

    def qdisc_args(self, qdisc: str) -> list[str] | None:
        """Arguments after `tc qdisc add dev DEV root` (None: no qdisc, the delay line alone shapes the link)."""
        if qdisc == "netem":
            args = ["netem", "delay", f"{self.delay_ms:g}ms"]
            if self.loss_pct:
                args += ["loss", f"{self.loss_pct:g}%"]
            if self.rate_mbit is not None:
                args += ["rate", f"{self.rate_mbit:g}mbit"]
            return args
        if qdisc == "delayline":
            return None if self.rate_mbit is None else self.qdisc_args("tbf")
        if qdisc == "tbf" and self.rate_mbit is not None:
            burst = max(32_000, int(self.rate_mbit * 1e6 / 8 / 250))  # >= rate / HZ(250)
            return ["tbf", "rate", f"{self.rate_mbit:g}mbit", "burst", str(burst), "latency", "50ms"]
        raise ValueError(f"qdisc {qdisc!r} cannot express {self}")

    def __str__(self) -> str:
        rate = "unlimited" if self.rate_mbit is None else f"{self.rate_mbit / 1000:g} Gbit/s"
        return f"{rate}, {self.delay_ms:g} ms one-way, {self.loss_pct:g}% loss"


@dataclasses.dataclass(frozen=True)
class WanSupport:
    """Whether WAN emulation can run here; `reason` says why not (or which qdisc will be used)."""

    available: bool
    reason: str
    qdisc: str | None = None


def _tun_problem() -> str | None:
    """Why this process cannot create a TUN device (None: it can)."""
    try:
        os.close(open_tun(f"dlcp{secrets.token_hex(2)}t", offload=True))
    except OSError as e:
        return f"cannot create a TUN device ({e})"
    return None


def probe(spec: LinkSpec, *, runner: Runner = _run, euid: int | None = None,
          which: Callable[[str], str | None] = shutil.which,
          tun_problem: Callable[[], str | None] = _tun_problem) -> WanSupport:
    """Check root, `ip`, `tc`, namespace + veth creation and the qdisc (or the delay line's TUN devices),
    cleaning up what it made."""
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        return WanSupport(False, f"needs root to create network namespaces (running as uid {euid})")
    for tool in ("ip", "tc"):
        if which(tool) is None:
            return WanSupport(False, f"iproute2's `{tool}` is not installed")
    tag = secrets.token_hex(2)
    ns, host_if, ns_if = f"dlc-probe-{tag}", f"dlcp{tag}h", f"dlcp{tag}n"
    try:
        for cmd in (["ip", "netns", "add", ns], ["ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if],
                    ["ip", "link", "set", ns_if, "netns", ns], ["ip", "netns", "exec", ns, "true"]):
            rc, err = runner(cmd)
            if rc:
                return WanSupport(False, f"cannot create a network namespace here (`{' '.join(cmd)}`: {err})")
        if spec.unshaped:
            return WanSupport(True, "no shaping (each node its own host)", "none")
        errors = []
        for qdisc in ("netem", "tbf"):
            if qdisc == "tbf" and (spec.needs_netem or spec.rate_mbit is None):
                break
            rc, err = runner(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", ns_if, "root",
                              *spec.qdisc_args(qdisc)])
            if rc == 0:
                return WanSupport(True, f"tc {qdisc}" + ("" if qdisc == "netem" else " (netem unavailable; rate only)"),
                                  qdisc)
            errors.append(f"{qdisc}: {err}")
        if spec.needs_netem:
            problem = tun_problem()
            if problem is None:
                rate = "" if spec.rate_mbit is None else "; rate by tc tbf"
                return WanSupport(True, f"delay line over TUN devices (the kernel lacks netem{rate})", "delayline")
            errors.append(f"delay line: {problem}")
        return WanSupport(False, f"tc cannot emulate {spec} here ({'; '.join(errors)}; the kernel may lack "
                                 f"sch_netem)")
    finally:
        runner(["ip", "netns", "del", ns])
        runner(["ip", "link", "del", host_if])


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host) in ipaddress.ip_network("127.0.0.0/8")
    except ValueError:
        return False


def _used_subnets() -> set[int]:
    """The X of every 10.213.X.0/24 address already on this machine (to pick a free subnet)."""
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {int(m[1]) for m in re.finditer(r"inet 10\.213\.(\d+)\.", out)}


class WanNetwork:
    """The namespaces, veth pairs and bridge of one testnet (see module doc). Not thread-safe.

    Call `setup()` once; always call `teardown()` (idempotent) in a `finally`.
    """

    def __init__(self, nodes: int, spec: LinkSpec, qdisc: str, *, runner: Runner = _run) -> None:
        if not 1 <= nodes <= 250:
            raise WanError(f"WAN emulation supports 1..250 nodes, got {nodes}")
        self.nodes, self.spec, self.qdisc, self._run = nodes, spec, qdisc, runner
        self.tag = secrets.token_hex(2)
        used = _used_subnets()
        free = [x for x in range(256) if x not in used]
        if not free:
            raise WanError("no free 10.213.X.0/24 subnet")
        self.subnet = ipaddress.ip_network(f"10.213.{free[int(self.tag, 16) % len(free)]}.0/24")
        self.bridge = f"dlc{self.tag}br"
        self._created_ns: list[str] = []
        self._created_links: list[str] = []
        self._bridge_made = False
        self._switch: SwitchProcess | None = None
        self._blocked: set[tuple[int, str]] = set()

    def namespace(self, i: int) -> str:
        return f"dlc-{self.tag}-{i}"

    def host(self, i: int) -> str:
        return str(self.subnet.network_address + i + 2)

    def exec_prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(i)]

    def allows(self, host: str) -> bool:
        """True for loopback and for the node addresses of this network."""
        if is_loopback(host):
            return True
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            return False
        return addr in self.subnet and any(str(addr) == self.host(i) for i in range(self.nodes))

    def _must(self, cmd: list[str]) -> None:
        rc, err = self._run(cmd)
        if rc:
            raise WanError(f"`{' '.join(cmd)}` failed: {err}")

    def setup(self) -> None:
        """Join the root namespace and one shaped namespace per node; on error undo everything and raise WanError."""
        try:
            gateway = f"{self.subnet.network_address + 1}/{self.subnet.prefixlen}"
            if self.qdisc == "delayline":
                self._switch = SwitchProcess()
                self._switch_add(self.bridge, gateway.split("/")[0], delay=False)
            else:
                self._must(["ip", "link", "add", self.bridge, "type", "bridge"])
            self._bridge_made = True
            self._must(["ip", "addr", "add", gateway, "dev", self.bridge])
            self._must(["ip", "link", "set", self.bridge, "up"])
            for i in range(self.nodes):
                ns = self.namespace(i)
                self._must(["ip", "netns", "add", ns])
                self._created_ns.append(ns)
                self.plug(ns, self.host(i), f"dlc{self.tag}n{i}", f"dlc{self.tag}h{i}")
                self._must(["ip", "-n", ns, "link", "set", "lo", "up"])
                self._name_host(ns, self.host(i))
        except BaseException:  # WanError, or Ctrl-C half-way: leave nothing behind
            self.teardown()
            raise

    def _name_host(self, ns: str, address: str) -> None:
        """Inside `ns`, this machine's host name resolves to `address`, as a real host's name resolves to its own
        address (`ip netns exec` mounts /etc/netns/NS/hosts over /etc/hosts): engines that find their address
        from the host name, such as gloo under `jax.distributed`, then advertise the namespace's."""
        folder = ETC_NETNS / ns
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text(f"127.0.0.1 localhost\n{address} {socket.gethostname()}\n")
        except OSError as e:
            raise WanError(f"cannot write {folder / 'hosts'}: {e}") from e

    def _switch_add(self, name: str, address: str, *, delay: bool) -> None:
        assert self._switch is not None
        try:
            self._switch.add(name, address, delay_ms=self.spec.delay_ms if delay else 0.0,
                             loss_pct=self.spec.loss_pct if delay else 0.0,
                             rate_mbit=self.spec.rate_mbit if delay else None)
        except OSError as e:
            raise WanError(str(e)) from e

    def plug(self, ns: str, address: str, ns_if: str, host_if: str) -> None:
        """Join namespace `ns` to the network at `address` through its interface `ns_if` (`host_if` names the
        root end of a veth pair), shaped by the link spec."""
        if self.qdisc == "delayline":
            self._switch_add(ns_if, address, delay=True)
        else:
            self._must(["ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if])
            self._created_links.append(host_if)
            self._must(["ip", "link", "set", host_if, "master", self.bridge])
            self._must(["ip", "link", "set", host_if, "up"])
        self._must(["ip", "link", "set", ns_if, "netns", ns])
        self._must(["ip", "-n", ns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", ns_if])
        self._must(["ip", "-n", ns, "link", "set", ns_if, "up"])
        qdisc = None if self.qdisc == "none" else self.spec.qdisc_args(self.qdisc)
        if qdisc is not None:
            self._must(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", ns_if, "root", *qdisc])

    def route_via(self, network: str, via: str) -> list[str]:
        """Reach `network` from the root namespace (and, with the delay line, from every node) through the
        namespace at address `via`; returns the command that removes the root's route."""
        if self._switch is not None:
            try:
                self._switch.route(network, via)
            except OSError as e:
                raise WanError(str(e)) from e
        self._must(["ip", "route", "add", network, "via", via])
        return ["ip", "route", "del", network]

    def link_stats(self) -> dict[str, dict[str, int]]:
        """Packets and bytes each namespace's link carried, both ways (the delay line counts them; {} with a
        bridge)."""
        return {} if self._switch is None else self._switch.stats()

    def block(self, node: int, others: Sequence[int]) -> None:
        """Cut `node`'s traffic to `others` (a `prohibit` route per address inside its namespace)."""
        for other in others:
            key = (node, self.host(other))
            if key not in self._blocked:
                self._must(["ip", "-n", self.namespace(node), "route", "add", "prohibit", f"{key[1]}/32"])
                self._blocked.add(key)

    def unblock(self, node: int, others: Sequence[int]) -> None:
        for other in others:
            key = (node, self.host(other))
            if key in self._blocked:
                self._run(["ip", "-n", self.namespace(node), "route", "del", "prohibit", f"{key[1]}/32"])
                self._blocked.discard(key)

    def teardown(self) -> list[str]:
        """Delete every namespace (with its veth pair) and the bridge; returns the errors (never raises)."""
        errors = []
        for link in reversed(self._created_links):  # deleting one end removes the pair at once
            self._run(["ip", "link", "del", link])  # (netns deletion would do it, asynchronously)
        self._created_links.clear()
        for ns in reversed(self._created_ns):
            rc, err = self._run(["ip", "netns", "del", ns])
            if rc:
                errors.append(f"ip netns del {ns}: {err}")
            shutil.rmtree(ETC_NETNS / ns, ignore_errors=True)
        self._created_ns.clear()
        self._blocked.clear()
        if self._switch is not None:  # its TUN devices, the root's among them, end with it
            self._switch.close()
            self._switch = None
        elif self._bridge_made:
            rc, err = self._run(["ip", "link", "del", self.bridge])
            if rc:
                errors.append(f"ip link del {self.bridge}: {err}")
        self._bridge_made = False
        return errors
