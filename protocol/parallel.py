"""One function per tensor, on every core.

numpy releases the GIL inside its loops, so threads are enough to use every core for the outer work
(ledger passes, encoding, decoding). Tensors are independent: the bits never depend on the threads or
their order. A call made from inside one of the pool's own threads runs serially (no nested waits on the
same pool). Pure computation, no I/O.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import TypeVar

__all__ = ["per_tensor"]

T = TypeVar("T")
_inside = threading.local()


@cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="per-tensor")


def _marked(fn: Callable[[str], T]) -> Callable[[str], T]:
    def run(name: str) -> T:
        _inside.active = True
        try:
            return fn(name)
        finally:
            _inside.active = False

    return run


def per_tensor(fn: Callable[[str], T], names: Iterable[str]) -> list[T]:
    """``[fn(name) for name in names]``, the calls spread over threads (results in ``names``' order)."""
    names = list(names)
    if len(names) < 2 or getattr(_inside, "active", False) or (os.cpu_count() or 1) < 2:
        return [fn(name) for name in names]
    return list(_pool().map(_marked(fn), names))
