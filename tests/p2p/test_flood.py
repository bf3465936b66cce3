"""Tier (b): a flood of idle sockets does not lock a joiner out. One attacker host opens more TCP
connections than the node has slots and never says hello (each is dropped after the handshake timeout and
opened again); a joiner from another host still connects, because one host may hold at most
`max_handshakes_per_host` connections that have not finished their handshake. The attacker is on 127.0.0.2
(all of 127/8 is loopback), the joiner on 127.0.0.1."""

from __future__ import annotations

import socket
from pathlib import Path

import trio
from p2p_helpers import host_config, start, wait_for

from protocol.messages import split_addr

SLOTS = 16
HANDSHAKE_S = 5.0  # the reference handshake deadline


async def _flood(target: str, stop: trio.Event, held: list) -> None:
    """Keep up to 2 × SLOTS idle sockets open from 127.0.0.2, reopening the ones the node closed."""
    host, port = split_addr(target)
    while not stop.is_set():
        held[:] = [s for s in held if s.fileno() != -1 and not _closed(s)]
        while len(held) < 2 * SLOTS:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.bind(("127.0.0.2", 0))
            try:
                s.connect((host, port))
            except BlockingIOError:
                pass
            held.append(s)
        await trio.sleep(0.05)
    for s in held:
        s.close()


def _closed(s: socket.socket) -> bool:
    try:
        return s.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


async def test_a_joiner_gets_in_during_a_flood_of_idle_sockets(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            node = await start(nursery, host_config(tmp_path, "node", max_connections=SLOTS,
                                                    max_handshakes_per_host=4, handshake_timeout_s=HANDSHAKE_S))
            stop, held = trio.Event(), []
            nursery.start_soon(_flood, node.gossip_addr, stop, held)
            await wait_for(lambda: node.counters.events["refused_handshakes_per_host"] > 0, 10, "the flood held back")
            joiner = await start(nursery, host_config(tmp_path, "joiner", bootstrap=(node.gossip_addr,)))
            # well before any flood socket times out: the joiner did not have to wait for a slot to free up
            # (without the per-host limit it does: every slot is held until the handshake deadline)
            await wait_for(lambda: joiner.peer_id in node.connected_peers(), HANDSHAKE_S / 2, "the joiner connected")
            assert node.counters.events["refused_handshakes_per_host"] > 0, "the flood was held back"
            assert len(held) >= 2 * SLOTS - 1, "the flood kept going meanwhile"
            stop.set()
            await joiner.close()
            await node.close()
