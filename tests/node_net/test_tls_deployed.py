"""Tier (c): the links of real node processes (PROTOCOL.md section 1a), as deployed.

A founder and a joiner train together while every byte between them on the founder's gossip port and on
its HTTP port passes through a tap (a relay in this process that records both directions: the joiner dials
the gossip tap, and the founder advertises the HTTP tap, so the joiner's state sync and blob fetches go
through it). Each direction is TLS from its first byte, and nothing of the run can be read in it: not the
run id, not a peer id or key, not the run's configuration, not an HTTP request line. A plain-HTTP request to
the founder's HTTP port gets a TLS alert and nothing else. A node started with --insecure is refused by the
founder as `cleartext_peer`, and refuses the founder's TLS as `tls_peer`."""

from __future__ import annotations

import socket
import threading

import httpx
from node_net_helpers import RUN_ID, free_port

from p2p.tls import PROTOCOL_VERSION_ALERT
from protocol.identity import Identity

COMMON = ["--inner-steps", "5", "--heartbeat", "0.5", "--eval-every", "0", "--sync-timeout", "60"]
START_S = 180.0


class Tap:
    """A TCP relay from a port of its own to `target`, recording each direction (threads; the test is sync)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.up = bytearray()
        self.down = bytearray()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:  # the node behind the tap has stopped: the client sees its connection close
                client.close()
                continue
            threading.Thread(target=self._pump, args=(client, server, self.up), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, self.down), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, log: bytearray) -> None:
        try:
            while data := src.recv(1 << 16):
                with self._lock:
                    if len(log) < 64 << 20:
                        log += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._listener.close()


def test_links_are_tls_from_the_first_byte_and_cleartext_is_refused_by_name(cluster) -> None:
    http_port = free_port()
    http_tap = Tap(("127.0.0.1", http_port))
    founder = cluster("founder", *COMMON, "--advertise-http", http_tap.address,
                      listen=("127.0.0.1:0", f"127.0.0.1:{http_port}"))
    founder.wait_listening(START_S)
    gossip_host, gossip_port = founder.gossip.rsplit(":", 1)
    gossip_tap = Tap((gossip_host, int(gossip_port)))
    joiner = cluster("joiner", *COMMON, "--peers", gossip_tap.address)
    insecure = cluster("insecure", *COMMON, "--insecure", "--no-adopt", "--peers", founder.gossip)
    for node in (joiner, insecure):
        node.wait_listening(START_S)
    joiner.wait_status(lambda s: s["round"] >= 3 and founder.peer_id in s["peers"], START_S, "the joiner training")
    joiner.wait_log(f"fetched blob [0-9a-f]+ \\([0-9]+ bytes\\) from {founder.peer_id}", 60.0)  # through the tap
    founder.wait_status(lambda s: s["updates_rejected"].get("cleartext_peer", 0) >= 1, 60.0, "cleartext refused")
    insecure.wait_log("tls_peer", 60.0)
    assert insecure.peer_id not in founder.status()["peers"]

    with socket.create_connection(("127.0.0.1", http_port), timeout=10) as plain:
        plain.sendall(b"GET /status HTTP/1.1\r\nhost: x\r\n\r\n")
        answer = b""
        while data := plain.recv(1 << 16):
            answer += data
    assert answer == PROTOCOL_VERSION_ALERT
    status = founder.status()
    for tap in (gossip_tap, http_tap):
        tap.close()
    keys = [Identity.load(node.home / "key") for node in (founder, joiner)]
    secrets = [RUN_ID.encode(), founder.peer_id.encode(), joiner.peer_id.encode(), *(k.public_key for k in keys),
               status["run_config"][:40].encode(), b"HTTP/1.1", b"/state", b"/blobs/", b"optimizer"]
    for name, capture in (("gossip up", gossip_tap.up), ("gossip down", gossip_tap.down),
                          ("http up", http_tap.up), ("http down", http_tap.down)):
        assert len(capture) > 1000 and capture[:2] == b"\x16\x03", (name, len(capture), capture[:8].hex())
        assert [s for s in secrets if s in capture] == [], name
    # founder.http is the (closed) tap: its own port, directly
    assert httpx.get(f"https://127.0.0.1:{http_port}/health", verify=False, timeout=10).text == "ok\n"
