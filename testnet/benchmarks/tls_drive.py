"""How to drive pyOpenSSL's TLS object from trio, measured: over the socket itself (what `p2p.tls` does: OpenSSL
reads and writes the descriptor, one syscall per 16 KiB record) against memory BIOs (our code moves the bytes
between the socket and OpenSSL in large reads and writes, as `trio.SSLStream` does with Python's ssl).

    python -m testnet.benchmarks.tls_drive            # 512 MiB each way, the two modes twice, alternating

Both ends in this process over a socketpair, TLS 1.3 with the node's libp2p certificates; CPU seconds of the
process (both ends) per GiB, and the throughput.
"""

from __future__ import annotations

import argparse
import os
import time

import trio
from OpenSSL import SSL

from p2p.tls import Credentials
from protocol.identity import Identity

N = 512 << 20
CH = 4 << 20

async def fd_mode(a_ctx, b_ctx):
    s1, s2 = trio.socket.socketpair()
    c = SSL.Connection(b_ctx, s1); c.set_connect_state()
    s = SSL.Connection(a_ctx, s2); s.set_accept_state()
    async def retry(conn, sock, op):
        while True:
            try: return op()
            except SSL.WantReadError: await trio.lowlevel.wait_readable(sock)
            except SSL.WantWriteError: await trio.lowlevel.wait_writable(sock)
    data = memoryview(os.urandom(CH))
    buf = bytearray(1 << 20); v = memoryview(buf)
    async def hs(conn, sock): await retry(conn, sock, conn.do_handshake)
    async with trio.open_nursery() as n:
        n.start_soon(hs, c, s1); n.start_soon(hs, s, s2)
    async def sender():
        for _ in range(N // CH):
            sent = 0
            while sent < CH:
                sent += await retry(c, s1, lambda: c.send(data[sent:]))
    async def receiver():
        got = 0
        while got < N:
            got += await retry(s, s2, lambda: s.recv_into(v, len(v)))
    t0 = time.process_time(); w0 = time.perf_counter()
    async with trio.open_nursery() as n:
        n.start_soon(sender); n.start_soon(receiver)
    return time.process_time() - t0, time.perf_counter() - w0

async def bio_mode(a_ctx, b_ctx):
    s1, s2 = trio.socket.socketpair()
    c = SSL.Connection(b_ctx, None); c.set_connect_state()
    s = SSL.Connection(a_ctx, None); s.set_accept_state()
    async def sendall(sock, data):
        v = memoryview(data)
        while v:
            n = await sock.send(v); v = v[n:]
    async def pump_out(conn, sock):
        while True:
            try: out = conn.bio_read(1 << 20)
            except SSL.WantReadError: return
            await sendall(sock, out)
    async def hs(conn, sock):
        while True:
            try:
                conn.do_handshake(); await pump_out(conn, sock); return
            except SSL.WantReadError:
                await pump_out(conn, sock)
                conn.bio_write(await sock.recv(1 << 16))
    async with trio.open_nursery() as n:
        n.start_soon(hs, c, s1); n.start_soon(hs, s, s2)
    data = memoryview(os.urandom(CH))
    buf = bytearray(1 << 20); v = memoryview(buf)
    rbuf = bytearray(256 << 10); rv = memoryview(rbuf)
    async def sender():
        for _ in range(N // CH):
            sent = 0
            while sent < CH:
                sent += c.send(data[sent:sent + (256 << 10)])
                await pump_out(c, s1)
    async def receiver():
        got = 0
        while got < N:
            k = await s2.recv_into(rv)
            s.bio_write(rv[:k])
            while True:
                try: got += s.recv_into(v, len(v))
                except SSL.WantReadError: break
    t0 = time.process_time(); w0 = time.perf_counter()
    async with trio.open_nursery() as n:
        n.start_soon(sender); n.start_soon(receiver)
    return time.process_time() - t0, time.perf_counter() - w0

async def main(rounds: int):
    a, b = Credentials(Identity.generate()), Credentials(Identity.generate())
    for name, f in [("socket", fd_mode), ("memory BIO", bio_mode)] * rounds:
        cpu, wall = await f(a.gossip_server, b.gossip_client)
        print(f"{name:10s}: both ends {cpu / (N / 2**30):.2f} CPU-s/GiB, {N * 8 / wall / 1e9:.2f} Gbit/s")
def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    trio.run(main, parser.parse_args().rounds)


if __name__ == "__main__":
    cli()
