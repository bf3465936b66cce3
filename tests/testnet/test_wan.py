"""WAN emulation: link specs, the capability probe's reasons, address checks, and (where this machine
allows it) a real namespace network that is torn down completely."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from testnet.wan import LinkSpec, WanNetwork, is_loopback, probe


def test_link_spec_parsing() -> None:
    assert LinkSpec.parse("2gbit,30ms") == LinkSpec(2000.0, 30.0, 0.0)
    assert LinkSpec.parse("0.1%, 500mbit, 0.05s") == LinkSpec(500.0, 50.0, 0.1)
    assert LinkSpec.parse("") == LinkSpec()
    with pytest.raises(ValueError, match="cannot read"):
        LinkSpec.parse("fast")
    assert LinkSpec(2000, 30, 0.5).qdisc_args("netem") == ["netem", "delay", "30ms", "loss", "0.5%", "rate", "2000mbit"]
    assert LinkSpec(100, 0, 0).qdisc_args("tbf")[:3] == ["tbf", "rate", "100mbit"]
    with pytest.raises(ValueError):
        LinkSpec(None, 30, 0).qdisc_args("tbf")


def test_probe_reasons_without_rights_or_tools() -> None:
    never = lambda cmd: pytest.fail(f"probe ran {cmd} without the rights to")  # noqa: E731
    r = probe(LinkSpec(), euid=1000, runner=never)
    assert not r.available and "root" in r.reason and "uid 1000" in r.reason
    r = probe(LinkSpec(), euid=0, which=lambda tool: None if tool == "tc" else "/sbin/ip", runner=never)
    assert not r.available and "`tc` is not installed" in r.reason


class FakeRunner:
    """Records commands; fails those whose text contains a given word."""

    def __init__(self, fail: str = "") -> None:
        self.fail, self.commands = fail, []

    def __call__(self, cmd):
        self.commands.append(cmd)
        if self.fail and self.fail in " ".join(cmd):
            return 2, f"Error: {self.fail} refused"
        return 0, ""


def test_probe_explains_a_failed_namespace_and_cleans_up() -> None:
    runner = FakeRunner(fail="netns add")
    r = probe(LinkSpec(), euid=0, which=lambda t: "/x", runner=runner)
    assert not r.available and "cannot create a network namespace" in r.reason and "refused" in r.reason
    assert runner.commands[-2][:3] == ["ip", "netns", "del"] and runner.commands[-1][:3] == ["ip", "link", "del"]


def test_probe_falls_back_to_tbf_only_for_rate_only_links() -> None:
    runner = FakeRunner(fail="netem")
    assert probe(LinkSpec(1000, 0, 0), euid=0, which=lambda t: "/x", runner=runner).qdisc == "tbf"
    r = probe(LinkSpec(1000, 30, 0), euid=0, which=lambda t: "/x", runner=FakeRunner(fail="netem"),
              tun_problem=lambda: "cannot create a TUN device (no /dev/net/tun)")
    assert not r.available and "netem" in r.reason and "30 ms" in r.reason and "no /dev/net/tun" in r.reason
    assert probe(LinkSpec(), euid=0, which=lambda t: "/x", runner=FakeRunner()).qdisc == "netem"


def test_probe_takes_the_delay_line_where_netem_is_missing() -> None:
    r = probe(LinkSpec(200, 20, 0), euid=0, which=lambda t: "/x", runner=FakeRunner(fail="netem"),
              tun_problem=lambda: None)
    assert r.available and r.qdisc == "delayline" and "rate by tc tbf" in r.reason
    assert LinkSpec(200, 20, 0).qdisc_args("delayline")[:3] == ["tbf", "rate", "200mbit"]
    assert LinkSpec(None, 20, 0).qdisc_args("delayline") is None


def test_probe_on_this_machine_gives_a_clear_answer() -> None:
    r = probe(LinkSpec.parse("2gbit,30ms"))
    assert r.reason and (r.available == (r.qdisc is not None))


def test_loopback_check() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("127.5.6.7")
    assert not is_loopback("10.0.0.1") and not is_loopback("example.com") and not is_loopback("::1x")


def _names() -> str:
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return ns + links


def test_real_namespaces_are_created_and_removed() -> None:
    spec = LinkSpec.parse("1gbit,0ms")  # rate only: works with netem or tbf
    support = probe(spec)
    if not support.available:
        pytest.skip(f"WAN emulation unavailable here: {support.reason}")
    net = WanNetwork(2, spec, support.qdisc or "netem")
    try:
        net.setup()
        names = _names()
        assert net.namespace(0) in names and net.namespace(1) in names and net.bridge in names
        assert net.allows(net.host(1)) and net.allows("127.0.0.1") and not net.allows("8.8.8.8")
        assert not net.allows(str(net.subnet.network_address + 200))  # in the subnet, but no node there
        net.block(0, [1])
        routes = subprocess.run(["ip", "-n", net.namespace(0), "route"], capture_output=True, text=True).stdout
        assert f"prohibit {net.host(1)}" in routes
        net.unblock(0, [1])
    finally:
        assert net.teardown() == []
    names = _names()
    assert net.namespace(0) not in names and net.bridge not in names and f"dlc{net.tag}" not in names


def _in(net: WanNetwork, i: int, code: str) -> str:
    done = subprocess.run([*net.exec_prefix(i), sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


SERVER = """
import socket, sys, threading
def drain(c):
    while c.recv(1 << 20):
        pass
    c.close()
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 5555)); s.listen()
print("ready", flush=True)
while True:
    threading.Thread(target=drain, args=(s.accept()[0],), daemon=True).start()
"""

CLIENT = """
import socket, time
rtts = []
for _ in range(5):
    t = time.perf_counter(); s = socket.create_connection(("{host}", 5555)); rtts.append(time.perf_counter() - t)
    s.close()
s = socket.create_connection(("{host}", 5555))
buf, n, t = b"x" * (1 << 20), 0, time.perf_counter()
while n < {nbytes}:
    s.sendall(buf); n += len(buf)
s.shutdown(socket.SHUT_WR); s.recv(1)
print(min(rtts), n * 8 / (time.perf_counter() - t) / 1e6)
"""


def test_the_delay_line_gives_real_round_trips_rates_and_partitions() -> None:
    """Namespaces on the delay line (where netem is missing): a TCP handshake takes the round trip (2 × the
    one-way delay), a stream stays under the rate (tbf on the sender's uplink), two senders at once share the
    receiver's downlink (the switch's bucket), the switch counts what crossed, a partition refuses."""
    spec = LinkSpec.parse("50mbit,15ms")
    support = probe(spec)
    if support.qdisc != "delayline":
        pytest.skip(f"this machine emulates the link without the delay line: {support.reason}")
    net = WanNetwork(3, spec, support.qdisc)
    try:
        net.setup()
        server = subprocess.Popen([*net.exec_prefix(1), sys.executable, "-c", SERVER, net.host(1)],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout.readline().strip() == "ready"
            rtt_s, mbit = map(float, _in(net, 0, CLIENT.format(host=net.host(1), nbytes=10 << 20)).split())
            started = time.perf_counter()  # (their start-up counts too: this bounds the shared rate from above)
            both = [subprocess.Popen([*net.exec_prefix(i), sys.executable, "-c",
                                      CLIENT.format(host=net.host(1), nbytes=24 << 20)], stdout=subprocess.PIPE, text=True)
                    for i in (0, 2)]
            for p in both:
                p.communicate(timeout=60)
            shared = (48 << 20) * 8 / (time.perf_counter() - started) / 1e6
        finally:
            server.kill()
            server.wait()
        assert 0.030 <= rtt_s < 0.045, f"round trip {rtt_s * 1000:.1f} ms over two 15 ms one-way links"
        assert 25 < mbit <= 50, f"{mbit:.1f} Mbit/s through a 50 Mbit/s link"
        assert shared <= 56, f"two senders into one 50 Mbit/s downlink: {shared:.1f} Mbit/s together"
        sent = net.link_stats()[f"dlc{net.tag}n0"]
        assert sent["sent_bytes"] >= 10 << 20 and sent["dropped_unrouted"] == 0, sent
        net.block(0, [1])
        refused = _in(net, 0, f"""
import socket
try:
    socket.create_connection(("{net.host(1)}", 5555), timeout=5)
except OSError as e:
    print(type(e).__name__)
""")
        assert refused.strip() in ("PermissionError", "ConnectionRefusedError", "OSError"), refused
    finally:
        assert net.teardown() == []
    names = _names()
    assert net.namespace(0) not in names and f"dlc{net.tag}" not in names
