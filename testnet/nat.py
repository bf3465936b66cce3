"""A host behind a NAT, emulated on a `testnet.wan.WanNetwork`: what a university cluster, a cloud VM without a
public port or a workstation at home looks like to the other nodes.

Topology of `NatBox(net, slot)`: a gateway namespace `dlc-<tag>-gw<slot>` on the network's bridge with the
public address `net.host(slot)` (a slot no node of `net` uses), and a private namespace `dlc-<tag>-nat<slot>`
with 192.168.(100+slot).2/24 behind it, its default route the gateway's 192.168.(100+slot).1. The gateway
forwards and masquerades (nftables) what the private host sends out, and forwards nothing in that the private
host did not open, but for the root namespace's management traffic (the test reading the private node's
/status), which comes from the bridge's own address. The other nodes have no route to 192.168.(100+slot).0/24:
the private node's advertised addresses reach nobody, as behind a real NAT.

Needs what `WanNetwork` needs, and nftables' `nft` (`probe_nat` says whether, in one line). `teardown` removes
everything created, is idempotent, and never raises.
"""

from __future__ import annotations

import ipaddress
import shutil
from collections.abc import Sequence

from testnet.wan import Runner, WanError, WanNetwork, _run

__all__ = ["NatBox", "probe_nat"]


def probe_nat() -> str | None:
    """Why a NAT cannot be emulated here (None: it can)."""
    if shutil.which("nft") is None:
        return "nftables' `nft` is not installed (apt-get install nftables)"
    return None


class NatBox:
    def __init__(self, net: WanNetwork, slot: int, *, runner: Runner = _run) -> None:
        if slot < net.nodes:
            raise WanError(f"slot {slot} is node {slot}'s address; a NAT gateway takes a slot past {net.nodes - 1}")
        self.net, self.slot, self._run = net, slot, runner
        self.gateway_ns = f"dlc-{net.tag}-gw{slot}"
        self.private_ns = f"dlc-{net.tag}-nat{slot}"
        self.public = net.host(slot)
        self.private_net = ipaddress.ip_network(f"192.168.{100 + slot}.0/24")
        self.inside = str(self.private_net.network_address + 1)
        self.host = str(self.private_net.network_address + 2)  # the private node's address
        self._links = (f"dlc{net.tag}g{slot}", f"dlc{net.tag}G{slot}", f"dlc{net.tag}p{slot}", f"dlc{net.tag}q{slot}")
        self._made: list[list[str]] = []  # undo commands, last first

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.private_ns]

    def _must(self, cmd: Sequence[str], undo: Sequence[str] | None = None) -> None:
        rc, err = self._run(list(cmd))
        if rc:
            raise WanError(f"`{' '.join(cmd)}` failed: {err}")
        if undo is not None:
            self._made.append(list(undo))

    def setup(self) -> None:
        bridge_ip = str(self.net.subnet.network_address + 1)
        up_host, up_gw, in_gw, in_host = self._links
        gw, priv = self.gateway_ns, self.private_ns
        try:
            self._must(["ip", "netns", "add", gw], ["ip", "netns", "del", gw])
            self._must(["ip", "netns", "add", priv], ["ip", "netns", "del", priv])
            self.net.plug(gw, self.public, up_gw, up_host)
            self._must(["ip", "link", "add", in_gw, "type", "veth", "peer", "name", in_host])
            self._must(["ip", "link", "set", in_gw, "netns", gw])
            self._must(["ip", "link", "set", in_host, "netns", priv])
            self._must(["ip", "-n", gw, "addr", "add", f"{self.inside}/24", "dev", in_gw])
            self._must(["ip", "-n", priv, "addr", "add", f"{self.host}/24", "dev", in_host])
            for ns, link in ((gw, in_gw), (priv, in_host), (gw, "lo"), (priv, "lo")):
                self._must(["ip", "-n", ns, "link", "set", link, "up"])
            self._must(["ip", "-n", priv, "route", "add", "default", "via", self.inside])
            self._must(["ip", "netns", "exec", gw, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
            nft = ["ip", "netns", "exec", gw, "nft"]
            for rule in (
                ["add", "table", "ip", "nat"],
                ["add", "chain", "ip", "nat", "post", "{ type nat hook postrouting priority srcnat; }"],
                ["add", "rule", "ip", "nat", "post", "oifname", up_gw, "masquerade"],
                ["add", "table", "ip", "filter"],
                ["add", "chain", "ip", "filter", "forward", "{ type filter hook forward priority filter; policy drop; }"],
                ["add", "rule", "ip", "filter", "forward", "ct", "state", "established,related", "accept"],
                ["add", "rule", "ip", "filter", "forward", "iifname", in_gw, "oifname", up_gw, "accept"],
                ["add", "rule", "ip", "filter", "forward", "iifname", up_gw, "ip", "saddr", bridge_ip, "accept"],
            ):
                self._must([*nft, *rule])
            # the root namespace (the test, the supervisor) reaches the private host for its /status
            self._made.append(self.net.route_via(str(self.private_net), self.public))
        except BaseException:
            self.teardown()
            raise

    def teardown(self) -> list[str]:
        errors = []
        while self._made:
            cmd = self._made.pop()
            rc, err = self._run(cmd)
            if rc and "Cannot find" not in err and "No such" not in err:
                errors.append(f"{' '.join(cmd)}: {err}")
        return errors

