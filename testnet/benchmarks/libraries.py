"""Our code against the maintained library that does (or could do) its job, timed in the same run.

    python -m testnet.benchmarks.libraries [--repeats 5]

Microseconds per operation (best of `--repeats` timed loops, after a warm-up), each with the ratio
library / ours (above 1: the library is slower):

- base58 (peer ids, 38 bytes): the `base58` package, which `protocol.identity` uses now, against the
  hand-written encoder it replaced (kept below as the baseline).
- seen-cache: `protocol.seen.SeenCache` (a `cachetools.TTLCache` now) against the OrderedDict cache it
  replaced, in the validator's pattern (a lookup per message, an add per new one, 200,000 ids at most),
  plus the bytes each entry costs (tracemalloc, ids excluded).
- wire: `protocol.wire.decode` / `encode` of a signed UpdateHeader frame (a 12-layer model's 148 tensor
  shapes) and of an IHave of 64 ids, against msgspec decoding the same bytes into array-like Structs
  that mirror the dataclasses with the same bounds, plus the re-encode that proves the input canonical.
  The msgspec side is a lower bound on what a port would cost: it has no kind dispatch, checks str
  lengths in characters (ours: UTF-8 bytes) and not the signed-default rule. Its re-encoding is checked
  byte-identical to ours.
- context: one Ed25519 signature check and a whole `Validator.validate` of the same update frame.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import platform
import time
import tracemalloc
from collections import OrderedDict
from collections.abc import Callable
from datetime import date
from typing import Annotated, Literal

import base58
import msgspec
from msgspec import Meta

from protocol import signing, wire
from protocol.compression.formats import payload_size
from protocol.identity import Identity, b58decode, b58encode, verify_signature
from protocol.messages import IHave, UpdateHeader
from protocol.seen import SeenCache
from protocol.validation import Validator

RUN = "bench-run"

# ---- the baselines: our code as it was before the library replaced it ---------------------------------

_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_INDEX = {c: i for i, c in enumerate(_ALPHABET)}


def ours_b58encode(data: bytes) -> str:
    zeros = len(data) - len(data.lstrip(b"\0"))
    n = int.from_bytes(data, "big")
    digits = []
    while n:
        n, r = divmod(n, 58)
        digits.append(_ALPHABET[r])
    return "1" * zeros + "".join(reversed(digits))


def ours_b58decode(text: str) -> bytes:
    zeros = len(text) - len(text.lstrip("1"))
    n = 0
    for c in text:
        digit = _INDEX.get(c)
        if digit is None:
            raise ValueError(f"not a base58 character: {c!r}")
        n = n * 58 + digit
    return b"\0" * zeros + (n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b"")


class OursSeenCache:
    """The OrderedDict seen-cache `protocol.seen.SeenCache` was before cachetools (same interface)."""

    def __init__(self, ttl_s: float = 120.0, max_entries: int = 200_000) -> None:
        self.ttl_s, self.max_entries = ttl_s, max_entries
        self._expiry: OrderedDict[bytes, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._expiry)

    def contains(self, message_id: bytes, now: float) -> bool:
        self.expire(now)
        return message_id in self._expiry

    def add(self, message_id: bytes, now: float) -> None:
        self.expire(now)
        self._expiry.pop(message_id, None)
        self._expiry[message_id] = now + self.ttl_s
        while len(self._expiry) > self.max_entries:
            self._expiry.popitem(last=False)

    def expire(self, now: float) -> None:
        while self._expiry:
            message_id, expiry = next(iter(self._expiry.items()))
            if expiry > now:
                return
            del self._expiry[message_id]


# ---- the msgspec candidate for protocol.wire ----------------------------------------------------------

U64 = Annotated[int, Meta(ge=0)]  # le=2**64-1 is refused by msgspec (int64 bounds only); msgpack stops there anyway
Bytes32 = Annotated[bytes, Meta(min_length=32, max_length=32)]
Signature = Annotated[bytes, Meta(min_length=64, max_length=64)]
RunId = Annotated[str, Meta(min_length=1, max_length=128)]
PeerId = Annotated[str, Meta(min_length=1, max_length=64)]
Name = Annotated[str, Meta(min_length=1, max_length=256)]
Topic = Annotated[str, Meta(min_length=1, max_length=64)]


class MsUpdateHeader(msgspec.Struct, array_like=True, frozen=True, omit_defaults=True):
    run_id: RunId
    origin: PeerId
    seqno: U64
    base_slot: U64
    publish_slot: U64
    tokens: U64
    inner_steps: U64
    codec: Annotated[str, Meta(min_length=1, max_length=16)]
    shapes: Annotated[tuple[tuple[Name, Annotated[tuple[U64, ...], Meta(max_length=8)]], ...], Meta(max_length=4096)]
    payload_sha256: Bytes32
    payload_size: U64
    membership: Annotated[bytes, Meta(max_length=512)] = b""


class MsIHave(msgspec.Struct, array_like=True, frozen=True):
    run_id: RunId
    topic: Topic
    ids: Annotated[tuple[Bytes32, ...], Meta(max_length=5000)]


_MS_UPDATE = msgspec.msgpack.Decoder(tuple[Literal["update"], MsUpdateHeader, Signature])
_MS_IHAVE = msgspec.msgpack.Decoder(tuple[Literal["ihave"], MsIHave])
_MS_ENCODER = msgspec.msgpack.Encoder()


def msgspec_decode(decoder: msgspec.msgpack.Decoder, data: bytes) -> object:
    """Typed decode, then the canonical check protocol.wire makes (re-encode, compare)."""
    obj = decoder.decode(data)
    if _MS_ENCODER.encode(obj) != data:
        raise ValueError("non-canonical")
    return obj


# ---- measuring ---------------------------------------------------------------------------------------


def best_us(fn: Callable[[], object], number: int, repeats: int) -> float:
    """Smallest time per call of `fn` over `repeats` loops of `number` calls, in microseconds."""
    fn()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - start) / number)
    return best * 1e6


def seen_pattern(cls: type, ids: list[bytes]) -> Callable[[], object]:
    """One pass of the validator's pattern over `ids`: every id looked up, added if new, and one in two
    looked up again (a gossip duplicate); 2 ms of `now` per message, so ids expire as they go."""
    def run() -> None:
        cache = cls(ttl_s=120.0, max_entries=200_000)
        now = 1.8e9
        for i, message_id in enumerate(ids):
            now += 0.002
            if not cache.contains(message_id, now):
                cache.add(message_id, now)
            cache.contains(ids[i // 2], now)
    return run


def bytes_per_entry(cls: type, n: int = 100_000) -> float:
    ids = [os.urandom(32) for _ in range(n)]
    tracemalloc.start()
    cache = cls(ttl_s=1e9, max_entries=n)
    for message_id in ids:
        cache.add(message_id, 1.0)
    used = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(cache) == n
    return used / n


def update_frame(identity: Identity, membership: bytes = b"") -> bytes:
    shapes = [("embed", (50304, 768))] + [
        (f"layer{i:02d}.{part}", shape) for i in range(12) for part, shape in (
            ("attn.qkv", (768, 2304)), ("attn.out", (768, 768)), ("mlp.up", (768, 3072)),
            ("mlp.down", (3072, 768)), ("ln1", (768,)), ("ln2", (768,)), ("attn.qkv_bias", (2304,)),
            ("attn.out_bias", (768,)), ("mlp.up_bias", (3072,)), ("mlp.down_bias", (768,)),
            ("ln1_bias", (768,)), ("ln2_bias", (768,)))
    ] + [("final_ln", (768,)), ("final_ln_bias", (768,)), ("head", (768, 50304))]
    shapes.sort()
    header = UpdateHeader(RUN, identity.peer_id, 1_800_000_000_000_000, 40, 41, 65536, 500, "int4", tuple(shapes),
                          hashlib.sha256(b"payload").digest(), payload_size(dict(shapes), "int4"), membership)
    return wire.encode(signing.sign(identity, header))


def line(what: str, ours: float, lib: float, unit: str = "us") -> str:
    return f"  {what:<44} ours {ours:9.2f} {unit}   library {lib:9.2f} {unit}   ratio {lib / ours:5.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    r = args.repeats
    print(f"libraries vs our code, {date.today()}, Python {platform.python_version()}, load "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; best of {r}; ratio = library / ours")

    identity = Identity.from_seed(bytes(range(32)))
    raw = b"\0\x24\x08\x01\x12\x20" + identity.public_key
    assert ours_b58encode(raw) == b58encode(raw) == base58.b58encode(raw).decode() == identity.peer_id
    text = identity.peer_id
    assert ours_b58decode(text) == b58decode(text) == raw
    print(f"base58 (package {base58.__version__}), a 38-byte peer id:")
    print(line("encode", best_us(lambda: ours_b58encode(raw), 5000, r), best_us(lambda: b58encode(raw), 5000, r)))
    print(line("decode (library: after our alphabet screen)", best_us(lambda: ours_b58decode(text), 5000, r),
               best_us(lambda: b58decode(text), 5000, r)))

    ids = [os.urandom(32) for _ in range(300_000)]
    print(f"seen-cache (cachetools {_version('cachetools')}), {len(ids):,} messages, TTL 120 s, <= 200,000 ids:")
    ours_pass = best_us(seen_pattern(OursSeenCache, ids), 1, r) / len(ids)
    lib_pass = best_us(seen_pattern(SeenCache, ids), 1, r) / len(ids)
    print(line("per message (lookup, add if new, lookup)", ours_pass, lib_pass))
    print(line("memory per entry", bytes_per_entry(OursSeenCache), bytes_per_entry(SeenCache), unit=" B"))

    open_run = update_frame(identity)  # membership at its default: our encoding leaves it off
    reencoded = _MS_ENCODER.encode(_MS_UPDATE.decode(open_run))
    print(f"wire (msgspec {msgspec.__version__}): an open-run update ({len(open_run):,} B) re-encoded by msgspec is "
          f"{'byte-identical' if reencoded == open_run else f'{len(reencoded):,} B, not ours (the trailing default is kept)'}")
    frame = update_frame(identity, membership=bytes(96))  # a closed run's update: both encode all fields
    ihave = wire.encode(IHave(RUN, "updates", tuple(hashlib.sha256(b"%d" % i).digest() for i in range(64))))
    decoded = wire.decode(frame)
    assert _MS_ENCODER.encode(msgspec_decode(_MS_UPDATE, frame)) == frame  # same canonical bytes
    assert _MS_ENCODER.encode(msgspec_decode(_MS_IHAVE, ihave)) == ihave
    ms_update = _MS_UPDATE.decode(frame)
    print(f"  timed: a closed-run UpdateHeader of {len(decoded.body.shapes)} shapes ({len(frame):,} B, same bytes"
          f" both ways), an IHave of 64 ids ({len(ihave):,} B):")
    print(line("decode update frame", best_us(lambda: wire.decode(frame), 500, r),
               best_us(lambda: msgspec_decode(_MS_UPDATE, frame), 500, r)))
    print(line("encode update frame", best_us(lambda: wire.encode(decoded), 500, r),
               best_us(lambda: _MS_ENCODER.encode(ms_update), 500, r)))
    print(line("decode ihave frame", best_us(lambda: wire.decode(ihave), 2000, r),
               best_us(lambda: msgspec_decode(_MS_IHAVE, ihave), 2000, r)))
    verify_us = best_us(lambda: verify_signature(decoded.origin, decoded.signature, decoded.signing_input), 500, r)

    def validate() -> None:
        Validator(RUN).validate(frame, 1.8e9)

    print("context, same frame:")
    print(f"  Ed25519 signature check {verify_us:.1f} us; Validator.validate (fresh seen-cache) "
          f"{best_us(validate, 200, r):.1f} us")


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    main()
