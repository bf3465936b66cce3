"""TCP on trio: open listeners, dial with a timeout. OS and trio errors become `TransportError`."""

from __future__ import annotations

import trio

from p2p.errors import TransportError
from protocol.messages import split_addr


def format_addr(host: str, port: int) -> str:
    """"host:port", with brackets for IPv6 literals (the form `protocol.messages.split_addr` parses)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def open_listener(host: str, port: int) -> trio.SocketListener:
    """One listening socket on `host:port` (port 0 picks a free port)."""
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise TransportError(f"cannot listen on {format_addr(host, port)}: {exc.strerror or exc}") from exc
    for extra in listeners[1:]:
        await extra.aclose()
    return listeners[0]


def listener_addr(listener: trio.SocketListener) -> tuple[str, int]:
    host, port = listener.socket.getsockname()[:2]
    return host, port


async def dial(address: str, timeout: float) -> trio.SocketStream:
    """Connect to "host:port" within `timeout` seconds (TCP_NODELAY is trio's default)."""
    try:
        host, port = split_addr(address)
    except ValueError as exc:
        raise TransportError(str(exc)) from None
    try:
        with trio.fail_after(timeout):
            return await trio.open_tcp_stream(host, port)
    except trio.TooSlowError:
        raise TransportError(f"dial {address}: no answer within {timeout} s") from None
    except OSError as exc:
        raise TransportError(f"dial {address}: {exc.strerror or exc}") from exc
