"""What every node checks of a reduced shard before it steps with it: no piece longer than its tensor's
aggregate can be.

For either aggregation, ``‖g‖`` of a tensor is at most the largest *clipped* norm among the slot's counted
updates: radial, ``g`` is the weighted mean clipped norm times a direction of norm at most 1; mean, a
weighted mean of the clipped updates (``protocol.ledger.aggregate``). The headers give those norms, so the
bound needs no values; a piece of ``g`` is no longer than ``g``. The reduction's codec may lengthen a block
by its rounding: int4/int8 round each value to within half a level of ``max|x| / L`` (``L`` = 7 or 127), so
a block of ``b`` values grows by at most ``√b / (2L)`` of its largest value, itself at most the block's norm.
A shard past the bound is refused whatever its signature; an aggregator can still lie *within* it (a step of
honest length in a wrong direction), which is what the checks are for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from protocol.compression import Codec
from protocol.compression.formats import BLOCK_SIZE, CODE_BITS, as_codec_local
from protocol.errors import Reason, RemoteProtocolError
from protocol.ledger.aggregate import SlotEntry, step_bound
from protocol.ledger.bound import counted, norm_bound
from protocol.ledger.config import LedgerConfig
from protocol.reduced.plan import ModelPiece

__all__ = ["check_reduction", "codec_slack", "reduction_bounds"]


def reduction_bounds(entries: Sequence[SlotEntry], config: LedgerConfig) -> dict[str, float]:
    """Per tensor, the most ``‖g‖`` can be for a sealed slot of ``entries`` (header entries will do)."""
    kept = counted(entries, config.max_updates_per_origin)
    out = {}
    for name in (entries[0].norms if entries else {}):
        tau = norm_bound(kept, name, config)
        out[name] = max((min(e.norms[name], tau, step_bound(e, name, config)) for e in kept), default=0.0)
    return out


def codec_slack(codec: Codec | str) -> float:
    """The factor by which ``codec``'s rounding may lengthen a piece."""
    codec = as_codec_local(codec)
    if codec in CODE_BITS:
        levels = 2 ** (CODE_BITS[codec] - 1) - 1
        return 1.0 + math.sqrt(BLOCK_SIZE) / (2 * levels)
    return 1.0 + 2.0**-7  # bf16 rounds each value to 8 significant bits; fp32 less


def check_reduction(values: Mapping[int, np.ndarray], pieces: Sequence[ModelPiece], bounds: Mapping[str, float],
                    codec: Codec | str) -> None:
    """``RemoteProtocolError`` (BAD_STATE) if a piece of the decoded ``values`` is longer than its bound."""
    slack = codec_slack(codec)
    for p in pieces:
        norm = math.sqrt(float(np.sum(np.square(values[p.index], dtype=np.float64))))
        if not norm <= bounds[p.name] * slack:
            raise RemoteProtocolError(Reason.BAD_STATE, f"piece {p.index} of {p.name!r} has norm {norm:.3g}, past the "
                                                        f"{bounds[p.name]:.3g} its slot's headers allow")
