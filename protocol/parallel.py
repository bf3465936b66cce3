"""One function over many independent items (tensors, hash pieces), on every core.

numpy and hashlib release the GIL inside their loops, so threads are enough to use every core for the
outer work (ledger passes, encoding, decoding, digests). The items are independent: the bits never depend
on the threads or their order. A call made from inside one of the pool's own threads runs serially (no
nested waits on the same pool). Pure computation, no I/O.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import TypeVar

__all__ = ["parallel_map"]

T = TypeVar("T")
R = TypeVar("R")
_inside = threading.local()


@cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="parallel-map")


def _marked(fn: Callable[[T], R]) -> Callable[[T], R]:
    def run(item: T) -> R:
        _inside.active = True
        try:
            return fn(item)
        finally:
            _inside.active = False

    return run


def parallel_map(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``[fn(item) for item in items]``, the calls spread over threads (results in ``items``' order)."""
    items = list(items)
    if len(items) < 2 or getattr(_inside, "active", False) or (os.cpu_count() or 1) < 2:
        return [fn(item) for item in items]
    return list(_pool().map(_marked(fn), items))
