"""A delay line for kernels without netem: a user-space IPv4 switch over TUN devices that holds each packet.

Where `tc netem` is missing (this project's machines have tbf and htb but no netem), `WanNetwork` plugs every
namespace into this switch instead of a bridge: each namespace gets a TUN device whose other end is a file
descriptor held here. A packet a namespace sends is read here, held for its link's one-way delay (dropped with
its loss probability), then written into the TUN device of the namespace that owns its destination address.
A node's uplink rate stays in the kernel (tbf on its TUN device's egress, inside its namespace, before the
packet reaches us); its downlink rate is a token bucket here, on delivery: what several senders send one node
at once arrives at its link's rate, and a packet that waited more than `QUEUE_S` for it is dropped (a router's
full queue).

What it models: the kernel's own TCP in every namespace sees the real round-trip time (the delay is on the packet
path, not in a proxy), so congestion control, slow start, the receive window and socket buffers behave as they
would over a path of that delay; a bandwidth-delay product that exceeds a socket's buffer limits the stream as it
would on a WAN. Packets keep their order (one delay per link, no jitter).

What it does not: no jitter, reordering or queueing in a shared core (the bottlenecks are the nodes' own
links); loss is independent per packet. The TUN devices carry the kernel's
segmentation-offload packets (up to 64 KiB, `IFF_VNET_HDR` + `TUNSETOFFLOAD`, as a VM's virtio NIC does) so
that a Python loop keeps up with Gbit/s; a dropped packet is then a whole such burst, so with loss > 0 offload
is turned off and every packet is one MTU-sized segment (slower here, and honest per-segment loss). Delay
accuracy is that of `epoll` (about 1 ms) plus this process's scheduling on a loaded machine.

Run as `python -m testnet.delayline`; it reads commands on stdin, one per line, and answers each on stdout:
  `add NAME ADDRESS DELAY_MS LOSS_PCT OFFLOAD [RATE_MBIT]`  create TUN device NAME that owns ADDRESS, its
                                                downlink at RATE_MBIT (default: unlimited) → `ok NAME`
  `route NETWORK ADDRESS`                        packets for NETWORK go to the device owning ADDRESS → `ok NETWORK`
  `stats`                                       → `stats {json}`: packets and bytes per device, both ways
It exits when stdin closes (its parent died or is done), and its TUN devices vanish with it.
"""

from __future__ import annotations

import collections
import fcntl
import ipaddress
import json
import os
import random
import selectors
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field

__all__ = ["Port", "Switch", "SwitchProcess", "open_tun"]

_TUNSETIFF = 0x400454CA
_TUNSETOFFLOAD = 0x400454D0
_IFF_TUN, _IFF_NO_PI, _IFF_VNET_HDR = 0x0001, 0x1000, 0x4000
_TUN_F_CSUM, _TUN_F_TSO4, _TUN_F_TSO6, _TUN_F_TSO_ECN = 0x01, 0x02, 0x04, 0x08
VNET_HDR = 10  # struct virtio_net_hdr, the kernel's default size for IFF_VNET_HDR
FRAME_MAX = VNET_HDR + 65_536
QUEUE_S = 0.05  # the longest a packet waits for its receiver's downlink before it is dropped (as tbf's latency)


def open_tun(name: str, *, offload: bool) -> int:
    """Create TUN device `name` (no packet-info header, a virtio-net header) and return its non-blocking fd."""
    if len(name.encode()) > 15:
        raise ValueError(f"interface name {name!r} is longer than 15 bytes")
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI | _IFF_VNET_HDR))
        flags = (_TUN_F_CSUM | _TUN_F_TSO4 | _TUN_F_TSO6 | _TUN_F_TSO_ECN) if offload else 0
        fcntl.ioctl(fd, _TUNSETOFFLOAD, flags)
    except OSError:
        os.close(fd)
        raise
    return fd


@dataclass
class Port:
    """One namespace's TUN device: what it owns, how its outgoing packets are delayed, what crossed it."""

    name: str
    fd: int
    address: int  # the IPv4 address it owns, as an integer
    delay_s: float
    loss: float  # probability in [0, 1)
    rate_bytes_s: float | None = None  # its downlink (None: unlimited)
    tokens: float = 0.0  # the downlink's bucket, in bytes (at most `burst`)
    filled_at: float = 0.0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("sent_packets", "sent_bytes", "received_packets", "received_bytes", "dropped_loss", "dropped_unrouted",
         "dropped_queue"), 0))

    @property
    def burst(self) -> float:
        assert self.rate_bytes_s is not None
        return max(float(FRAME_MAX), self.rate_bytes_s * 0.004)  # one frame, or 4 ms at the rate

    def ready_at(self, nbytes: int, now: float) -> float:
        """When its downlink can take `nbytes` (now, or later)."""
        if self.rate_bytes_s is None:
            return now
        self.tokens = min(self.burst, self.tokens + (now - self.filled_at) * self.rate_bytes_s)
        self.filled_at = now
        return now if self.tokens >= nbytes else now + (nbytes - self.tokens) / self.rate_bytes_s


class Switch:
    """The ports, the held packets (one FIFO per port: one delay per link keeps each FIFO in time order) and
    the loop that moves them. Single-threaded; `step(timeout)` does one round of reading and releasing."""

    def __init__(self, *, clock=time.monotonic, rng: random.Random | None = None) -> None:
        self._clock = clock
        self._rng = rng or random.Random()
        self._by_address: dict[int, Port] = {}
        self._by_fd: dict[int, Port] = {}
        self._held: dict[int, collections.deque[tuple[float, bytes, Port]]] = {}
        self._routes: list[tuple[int, int, Port]] = []
        self._gone: dict[str, dict[str, int]] = {}
        self._selector = selectors.DefaultSelector()

    def add(self, port: Port) -> None:
        if port.address in self._by_address:
            raise ValueError(f"address {ipaddress.IPv4Address(port.address)} already has a port")
        self._by_address[port.address] = port
        self._by_fd[port.fd] = port
        self._held[port.fd] = collections.deque()
        self._selector.register(port.fd, selectors.EVENT_READ)

    def route(self, network: ipaddress.IPv4Network, via: int) -> None:
        """Send packets for `network` (an address no port owns) to the port that owns `via` (a gateway)."""
        if via not in self._by_address:
            raise ValueError(f"no port owns {ipaddress.IPv4Address(via)}")
        self._routes.append((int(network.network_address), int(network.netmask), self._by_address[via]))

    def _remove(self, port: Port) -> None:
        self._selector.unregister(port.fd)
        os.close(port.fd)
        del self._by_fd[port.fd], self._held[port.fd], self._by_address[port.address]
        self._routes = [r for r in self._routes if r[2] is not port]
        for fd, queue in self._held.items():  # nothing may be written to its (soon reused) fd number
            self._held[fd] = collections.deque(item for item in queue if item[2] is not port)
        self._gone[port.name] = port.counts

    def _lookup(self, dst: int) -> Port | None:
        port = self._by_address.get(dst)
        if port is None:
            for network, mask, via in self._routes:
                if dst & mask == network:
                    return via
        return port

    def watch(self, fd: int) -> None:
        """Also wake on `fd` (the command channel); `step` returns the fds among these that are readable."""
        self._selector.register(fd, selectors.EVENT_READ)

    def stats(self) -> dict[str, dict[str, int]]:
        return {**self._gone, **{p.name: dict(p.counts) for p in self._by_fd.values()}}

    def _next_due(self) -> float | None:
        now = self._clock()
        heads = [max(q[0][0], q[0][2].ready_at(len(q[0][1]) - VNET_HDR, now)) for q in self._held.values() if q]
        return min(heads) if heads else None

    def _read(self, port: Port) -> None:
        now = self._clock()
        queue = self._held[port.fd]
        for _ in range(256):  # a bounded batch, so one busy port cannot starve the releases
            try:
                frame = os.read(port.fd, FRAME_MAX)
            except BlockingIOError:
                return
            except OSError:  # its namespace was deleted and the device with it: the port is gone
                self._remove(port)
                return
            if len(frame) < VNET_HDR + 20 or frame[VNET_HDR] >> 4 != 4:
                continue  # not IPv4 (the devices have IPv6 off; a stray frame is dropped)
            port.counts["sent_packets"] += 1
            port.counts["sent_bytes"] += len(frame) - VNET_HDR
            if port.loss and self._rng.random() < port.loss:
                port.counts["dropped_loss"] += 1
                continue
            (dst,) = struct.unpack_from("!I", frame, VNET_HDR + 16)
            target = self._lookup(dst)
            if target is None:
                port.counts["dropped_unrouted"] += 1
                continue
            queue.append((now + port.delay_s, frame, target))

    def _release(self) -> None:
        now = self._clock()
        for queue in self._held.values():
            while queue and queue[0][0] <= now:
                due, frame, target = queue[0]
                size = len(frame) - VNET_HDR
                if target.ready_at(size, now) > now:
                    if now - due > QUEUE_S:  # waited too long for the receiver's downlink: the queue is full
                        queue.popleft()
                        target.counts["dropped_queue"] += 1
                        continue
                    break  # it waits (and what follows it on this link: one FIFO per sender)
                queue.popleft()
                if target.rate_bytes_s is not None:
                    target.tokens -= size
                try:
                    os.write(target.fd, frame)
                except OSError:  # the namespace is gone or its device is down: the packet is lost, as on a wire
                    continue
                target.counts["received_packets"] += 1
                target.counts["received_bytes"] += size

    def step(self, timeout: float | None) -> list[int]:
        """Wait for a readable fd or the next release (at most `timeout` s), read, release; returns the watched
        non-port fds that are readable."""
        due = self._next_due()
        if due is not None:
            wait = max(0.0, due - self._clock())
            timeout = wait if timeout is None else min(timeout, wait)
        other = []
        for key, _ in self._selector.select(timeout):
            port = self._by_fd.get(key.fd)
            if port is None:
                other.append(key.fd)
            else:
                self._read(port)
        self._release()
        return other


def _command(switch: Switch, line: str) -> str:
    words = line.split()
    if words[:1] == ["add"] and len(words) in (6, 7):
        name, address, delay_ms, loss_pct, offload = words[1:6]
        rate = float(words[6]) * 1e6 / 8 if len(words) == 7 else None
        fd = open_tun(name, offload=offload == "1")
        switch.add(Port(name, fd, int(ipaddress.IPv4Address(address)), float(delay_ms) / 1000.0,
                        float(loss_pct) / 100.0, rate, filled_at=time.monotonic()))
        return f"ok {name}"
    if words[:1] == ["route"] and len(words) == 3:
        switch.route(ipaddress.IPv4Network(words[1]), int(ipaddress.IPv4Address(words[2])))
        return f"ok {words[1]}"
    if words == ["stats"]:
        return "stats " + json.dumps(switch.stats(), sort_keys=True)
    return f"error cannot read command {line.strip()!r}"


class SwitchProcess:
    """The switch as a child process (`python -m testnet.delayline`), driven by its commands. `close()` ends
    it; its TUN devices vanish with it. Raises OSError when a command fails (the message is the switch's)."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen([sys.executable, "-m", "testnet.delayline"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)

    def command(self, line: str) -> str:
        if self._proc.poll() is not None:
            raise OSError(f"the delay line exited (status {self._proc.returncode})")
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(line + "\n")
        self._proc.stdin.flush()
        answer = self._proc.stdout.readline().strip()
        if not answer.startswith(("ok ", "stats ")):
            raise OSError(f"delay line: `{line}`: {answer or 'no answer (it exited)'}")
        return answer

    def add(self, name: str, address: str, *, delay_ms: float, loss_pct: float,
            rate_mbit: float | None = None) -> None:
        """A TUN device `name` in this (the root) namespace that owns `address`, its downlink at `rate_mbit`
        (None: unlimited); move it where it belongs."""
        offload = "0" if loss_pct else "1"  # per-segment loss needs segments (see the module doc)
        rate = "" if rate_mbit is None else f" {rate_mbit:g}"
        self.command(f"add {name} {address} {delay_ms:g} {loss_pct:g} {offload}{rate}")

    def route(self, network: str, via: str) -> None:
        self.command(f"route {network} {via}")

    def stats(self) -> dict[str, dict[str, int]]:
        return json.loads(self.command("stats").removeprefix("stats "))

    def close(self) -> None:
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            try:
                self._proc.stdin.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


def main() -> int:
    switch = Switch()
    stdin = sys.stdin.fileno()
    os.set_blocking(stdin, False)
    switch.watch(stdin)
    pending = b""
    while True:
        if not switch.step(None):
            continue
        try:
            chunk = os.read(stdin, 65_536)
        except BlockingIOError:
            continue
        if not chunk:
            return 0
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            try:
                answer = _command(switch, line.decode())
            except (OSError, ValueError) as e:
                answer = f"error {e}"
            sys.stdout.write(answer + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
