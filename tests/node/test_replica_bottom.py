"""Tier (b), no network: the replica steps its window bottom after the closes (`Replica.keep_bottom`), as an
operation of its own that the tasks woken by a close go before, and ends with the bits of a ledger that
stepped it at every close."""

from __future__ import annotations

import hashlib

import numpy as np
import trio
import trio.testing

from node.outer.replica import Replica
from protocol.ledger import Ledger, LedgerConfig, UpdateMeta

SHAPES = {"emb": (3,), "w": (2, 2)}


def genesis() -> Ledger:
    return Ledger({k: np.ones(s, np.float32) for k, s in SHAPES.items()}, LedgerConfig(window=2))


def update(tag: str, base: int, publish: int):
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(tag.encode()).digest()[:4], "big"))
    meta = UpdateMeta(hashlib.sha256(tag.encode()).digest(), tag, base, publish, 100, 4)
    return meta, {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


async def test_the_bottom_is_stepped_after_a_close_and_after_the_round_that_waited_on_it() -> None:
    ledger, reference = genesis(), genesis()
    calls: list[str] = []
    done = {"params": trio.Event(), "advance_bottom": trio.Event()}

    def spy(name: str):
        method = getattr(ledger, name)

        def call():  # in the replica's worker thread
            calls.append(name)
            result = method()
            trio.from_thread.run_sync(done[name].set)
            return result
        return call

    ledger.advance_bottom, ledger.params = spy("advance_bottom"), spy("params")
    replica = Replica(ledger)

    async def take_new_base() -> None:  # as a round's `_follow` does on a change
        await replica.changed()
        await replica.params_at()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(replica.keep_bottom)
        for s in range(6):
            for tag in ("a", "b"):
                await replica.add(*update(f"{tag}{s}", s, s))
                reference.add(*update(f"{tag}{s}", s, s))
            reference.close_slot()
            reference.advance_bottom()
            nursery.start_soon(take_new_base)
            await trio.testing.wait_all_tasks_blocked()
            calls.clear()
            done.update(params=trio.Event(), advance_bottom=trio.Event())
            await replica.close_open()
            await done["params"].wait()
            if s >= 2:  # slot s+1 closed with a window of 2: slot s-1 left it
                await done["advance_bottom"].wait()
            await replica.view()  # an operation after it: the lock is free, the views refreshed
            assert replica.bottom_behind == 0 and ledger.bottom_behind == 0
            assert calls == (["params", "advance_bottom"] if s >= 2 else ["params"])
        nursery.cancel_scope.cancel()
    del ledger.advance_bottom, ledger.params  # the spies (they report to trio)
    assert ledger.params_digest() == reference.params_digest()
    assert ledger.snapshot().to_bytes() == reference.snapshot().to_bytes()
