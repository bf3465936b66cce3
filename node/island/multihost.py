"""An island of several processes, one per host: one JAX mesh over all their devices, one process speaking.

A TPU slice past one host, or a GPU job over several nodes, is one island: `jax.distributed.initialize`
(coordinator address, number of processes, this process's id) joins the processes, and `jax.devices()` is
then every device of all of them. JAX runs such a computation SPMD: every process must run the same jitted
computations in the same order, each on its own devices. Process 0, the *speaker*, runs the node (gossip,
ledger, HTTP, checkpoints, the data); the others, the *followers*, only train their part of the mesh.

Every `InnerLoop` call that touches the devices is a *command* (`mirrored`): the speaker announces its name and
arguments, and each follower (`Island.serve`) makes the same call on its own `InnerLoop`. What a follower needs
from the speaker's host memory (parameters, batches, the per-step decisions of the node's callbacks) is
*shared* (`Island.share`): a header (msgpack) through the JAX coordination service's key-value store, with
the arrays in it when they are small (a batch), else through
`jax.experimental.multihost_utils.broadcast_one_to_all`, an XLA collective (gloo on the CPU, NCCL on GPUs, the
interconnect on TPUs), as raw bits (integer sums of the speaker's words and zeros: exact, so every process
holds the same bits). Nothing is sent by hand.

An island fails as a unit: JAX's coordination service checks heartbeats, and when one process dies the
others abort within the heartbeat timeout (`join`). Restarted together (the coordinator on the speaker's
host), the speaker resumes from its checkpoint and the rest of the run sees one node restarting.

A single process is the island of one (`current()` before `join`): `share` is the identity, nothing is
announced, and `InnerLoop` runs as it always did.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn

import jax
import msgpack
import numpy as np

from node.island.config import ConfigError

__all__ = ["CALLBACK", "Island", "IslandClosed", "current", "join", "mirrored"]

log = logging.getLogger("node.island")

CALLBACK = "callback"  # what a follower sees in place of one of the speaker's callables
INIT, RESUME = "__init__", "__resume__"  # commands beside InnerLoop's methods
CHUNK_BYTES = 64 << 20  # arrays are broadcast in buckets of at most this (a device holds one at a time)
INLINE_BYTES = 256 << 10  # arrays up to this in all ride in the header (a batch: one store round trip, no collective)
MAX_UNREAD = 256  # headers kept in the store before a share goes by collective anyway (after which they are dropped)
WAIT_MS = 60_000  # a follower waiting for the speaker's next command logs once a minute
KEY = "diloco/island/{}"


class IslandClosed(Exception):
    """(follower) The speaker closed the island: its node stopped, whatever the follower was waiting for."""


class Island:
    """This process's place in its island: `process_id` of `process_count`; process 0 speaks."""

    def __init__(self, process_id: int = 0, process_count: int = 1, client: Any = None) -> None:
        self.process_id, self.process_count = process_id, process_count
        self._client = client  # jax's coordination-service client (key-value store); None for one process
        self._seq = 0  # shares so far: every process counts the same
        self._unread: list[str] = []  # keys written since the last collective (the speaker deletes them after it)
        self._depth = 0  # nesting of mirrored calls on the speaker: only the outermost is announced
        self.lock = threading.RLock()  # one mirrored call at a time (and the calls its callbacks make)

    @property
    def speaks(self) -> bool:
        return self.process_id == 0

    @property
    def single(self) -> bool:
        return self.process_count == 1

    def devices(self) -> list[jax.Device]:
        """The island's devices: this process's, or every process's once joined."""
        return list(jax.local_devices() if self.single else jax.devices())

    # -- sharing -----------------------------------------------------------------------------------

    def share(self, value: Any = None, *, closing: bool = False) -> Any:
        """The speaker's `value` on every process (followers pass nothing): None, bool, int, float, str, numpy
        arrays, and lists, tuples and str-keyed dicts of them. The speaker gets its own value back. A follower
        raises `IslandClosed` when the speaker closed the island instead (`close`)."""
        if self.single:
            return value
        key = KEY.format(self._seq)
        self._seq += 1
        if self.speaks:
            arrays: list[np.ndarray] = []
            tree = _encode(value, arrays)
            packed = _pack(arrays) if arrays else None
            # by collective when large, and now and then (a collective tells the speaker every header before it
            # was read); arrays of no bytes have nothing to broadcast
            inline = packed is not None and (packed.nbytes == 0 or (packed.nbytes <= INLINE_BYTES
                                                                  and len(self._unread) < MAX_UNREAD))
            header = [tree, [a.nbytes for a in arrays], closing, packed.tobytes() if inline else None]
            self._client.key_value_set_bytes(key, msgpack.packb(header))
            self._unread.append(key)
            if packed is not None and not inline:
                _broadcast_bytes(packed, self.speaks)
                self._forget_read()
            return value
        while True:
            try:
                header = self._client.blocking_key_value_get_bytes(key, WAIT_MS)
                break
            except Exception as exc:  # noqa: BLE001 - jax raises its runtime error for a timeout
                if "DEADLINE" not in str(exc).upper():
                    raise
                log.info("island process %d: waiting for the speaker", self.process_id)
        tree, sizes, closed, inline = msgpack.unpackb(header)
        if closed:
            raise IslandClosed
        if inline is not None:
            buffer = np.frombuffer(inline, np.uint8)
        elif sizes:
            buffer = _broadcast_bytes(None, self.speaks, sum(_aligned(n) for n in sizes))
        return _decode(tree, _unpack(buffer, sizes) if sizes else [])

    def _forget_read(self) -> None:
        """After a collective every follower has read the headers before it: drop them from the store."""
        for key in self._unread:
            self._client.key_value_delete(key)
        self._unread.clear()

    def announce(self, name: str, kwargs: Mapping[str, Any]) -> None:
        """(speaker) Tell the followers to make the call `name(**kwargs)`."""
        self.share({"call": name, "kwargs": dict(kwargs)})

    # -- following ---------------------------------------------------------------------------------

    def serve(self, build: Callable[..., Any]) -> None:
        """(follower) Make the speaker's calls until it closes the island: `build(**kwargs)` for a new
        `InnerLoop`, its methods for the rest."""
        try:
            self._serve([None], build, until=None)
        except IslandClosed:
            log.info("island process %d: the speaker closed the island", self.process_id)

    def serve_callback(self, loop: Any) -> None:
        """(follower) Inside one of `loop`'s calls: make the calls the speaker's callback makes, until it
        returns."""
        self._serve([loop], None, until=RESUME)

    def _serve(self, holder: list[Any], build: Callable[..., Any] | None, until: str | None) -> None:
        while True:
            message = self.share()
            call, kwargs = message["call"], message["kwargs"]
            if call == until:
                return
            if call == INIT:
                if build is None:
                    raise RuntimeError("island: the speaker built an inner loop inside a callback")
                holder[0] = build(**kwargs)
                continue
            attribute = getattr(type(holder[0]), call)
            method = attribute.fget if isinstance(attribute, property) else attribute
            method(holder[0], **kwargs)

    def callback(self, loop: Any, fn: Callable[..., Any], *args: Any) -> None:
        """Run one of the speaker's callbacks inside a mirrored call: the mirrored calls it makes are
        announced (the followers make them too, `serve_callback`), then the followers resume."""
        if self.single:
            fn(*args)
        elif self.speaks:
            depth, self._depth = self._depth, 0
            try:
                fn(*args)
            finally:
                self._depth = depth
            self.announce(RESUME, {})
        else:
            self.serve_callback(loop)

    def decide(self, fn: Callable[[], Any] | str | None) -> Any:
        """One of the speaker's decisions inside a mirrored call (a callback's answer, the next batch): asked
        of `fn` on the speaker, shared with the followers (for whom `fn` is `CALLBACK`). None when there is
        no callback."""
        if fn is None:
            return None
        if self.single:
            return fn()
        return self.share(fn() if self.speaks else None)

    def close(self) -> None:
        """(speaker) The island's work is done, or the speaker failed: the followers return from `serve`,
        whatever share they were waiting for."""
        if not self.single and self.speaks:
            self.share(None, closing=True)


    def leave(self, status: int) -> NoReturn:
        """Exit the process at once with `status` (a failure): JAX's shutdown barrier would wait for the other
        processes, which instead stop within the heartbeat timeout (the island fails as a unit)."""
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(status)


def _announced(island: Island) -> bool:
    return not island.single and island.speaks and island._depth == 0


def mirrored(method: Callable[..., Any]) -> Callable[..., Any]:
    """An `InnerLoop` method that touches the island's devices: on the speaker, the outermost such call is
    announced with its arguments (callables as `CALLBACK`, iterators as lists), so every follower makes it
    too (`Island.serve`)."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        island: Island = self.island
        if island.single:
            return method(self, *args, **kwargs)
        with island.lock:
            if _announced(island):
                bound = signature.bind(self, *args, **kwargs)
                bound.apply_defaults()
                arguments = dict(list(bound.arguments.items())[1:])
                for name, value in arguments.items():
                    if isinstance(value, Iterator):
                        arguments[name] = list(value)
                island.announce(method.__name__, {k: CALLBACK if callable(v) else v for k, v in arguments.items()})
                args, kwargs = (), arguments
            island._depth += 1
            try:
                return method(self, *args, **kwargs)
            finally:
                island._depth -= 1

    return call


def announce_init(island: Island, **kwargs: Any) -> None:
    """(speaker) A new `InnerLoop` with these arguments: the followers build theirs."""
    if _announced(island):
        island.announce(INIT, kwargs)


# -- the wire format of a share ----------------------------------------------------------------------


def _encode(value: Any, arrays: list[np.ndarray]) -> Any:
    """`value` as msgpack-able data, its arrays replaced by their places in `arrays`; tuples, lists and dicts
    are tagged so that they come back as what they were (a batch's pytree structure must not change)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (np.ndarray, np.generic, jax.Array)):
        array = np.asarray(value)
        arrays.append(array if array.flags.c_contiguous else array.copy(order="C"))  # (ascontiguousarray: >= 1-d)
        return {"a": [len(arrays) - 1, array.dtype.str, list(array.shape)]}
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("an island shares dicts with str keys only")
        return {"d": [[k, _encode(v, arrays)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"t": [_encode(v, arrays) for v in value]}
    if isinstance(value, list):
        return {"l": [_encode(v, arrays) for v in value]}
    raise TypeError(f"an island of several processes shares None, numbers, strings, numpy arrays and lists, "
                    f"tuples and dicts of them; got {type(value).__name__}")


def _decode(tree: Any, arrays: list[np.ndarray]) -> Any:
    if not isinstance(tree, dict):
        return tree
    (tag, body), = tree.items()
    if tag == "a":
        index, dtype, shape = body
        return arrays[index].view(np.dtype(dtype)).reshape(shape)
    if tag == "d":
        return {k: _decode(v, arrays) for k, v in body}
    items = [_decode(v, arrays) for v in body]
    return tuple(items) if tag == "t" else items


def _aligned(n: int) -> int:
    return -(-n // 8) * 8


def _pack(arrays: list[np.ndarray]) -> np.ndarray:
    """The arrays' bytes end to end, each at an 8-byte boundary."""
    out = np.zeros(sum(_aligned(a.nbytes) for a in arrays), np.uint8)
    at = 0
    for a in arrays:
        out[at:at + a.nbytes] = a.reshape(-1).view(np.uint8)
        at += _aligned(a.nbytes)
    return out


def _unpack(buffer: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    out, at = [], 0
    for n in sizes:
        out.append(buffer[at:at + n].copy())
        at += _aligned(n)
    return out


def _bucket(n: int) -> int:
    """The size a broadcast of `n` bytes is padded to: a power of two (at least 1 KiB, at most CHUNK_BYTES), so
    that a handful of shapes is compiled."""
    return min(CHUNK_BYTES, max(1024, 1 << (n - 1).bit_length()))


def _broadcast_bytes(data: np.ndarray | None, is_source: bool, n: int | None = None) -> np.ndarray:
    """The speaker's bytes on every process, by `broadcast_one_to_all` in chunks of uint32 words."""
    from jax.experimental import multihost_utils

    n = data.nbytes if data is not None else n
    out = np.empty(n, np.uint8)
    for at in range(0, n, CHUNK_BYTES):
        size = min(CHUNK_BYTES, n - at)
        chunk = np.zeros(_bucket(size), np.uint8)
        if is_source:
            chunk[:size] = data[at:at + size]
        received = multihost_utils.broadcast_one_to_all(chunk.view(np.uint32), is_source=is_source)
        out[at:at + size] = np.asarray(received).view(np.uint8)[:size]
    return out


# -- joining ------------------------------------------------------------------------------------------

_current = Island()


def current() -> Island:
    """This process's island: of one process until `join`."""
    return _current


def join(coordinator: str, num_processes: int, process_id: int, heartbeat_timeout_s: int = 10) -> Island:
    """Join the island of `num_processes` processes whose coordinator (process 0, which serves JAX's
    coordination service) listens at `coordinator` (HOST:PORT). Call before anything uses JAX. When one
    process of the island stops answering heartbeats for `heartbeat_timeout_s`, the others abort."""
    global _current
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise ConfigError(f"--process-id {process_id} is not one of the island's {num_processes} processes (0 to "
                          f"{num_processes - 1})")
    if num_processes == 1:
        return _current
    if not coordinator:
        raise ConfigError("--num-processes > 1 needs --coordinator HOST:PORT (process 0's host)")
    from jax._src import distributed  # the coordination service's client: its key-value store

    jax.distributed.initialize(coordinator, num_processes, process_id, heartbeat_timeout_seconds=heartbeat_timeout_s,
                               shutdown_timeout_seconds=3 * heartbeat_timeout_s)
    jax.devices()  # every process's backend starts now, together: it exchanges the devices' topology
    _current = Island(process_id, num_processes, distributed.global_state.client)
    return _current
