"""Reduced slots (issue 49; docs/design.md, "Traffic that does not grow with the run"; PROTOCOL.md §15).

A run of ``N`` nodes in which each node moves a small constant times one update per round instead of
``N − 1`` updates: a slot's set is sealed by one signed seal, each shard of the model is reduced by one
aggregator from its contributors' committed pieces, and every node applies the ``S`` reduced shards.

* :mod:`~protocol.reduced.plan`: pieces, shards and their bytes in a payload;
* :mod:`~protocol.reduced.roles`: who seals, reduces and checks (orders every replica computes alike);
* :mod:`~protocol.reduced.records`: the signed records;
* :mod:`~protocol.reduced.seal`: a slot's seal;
* :mod:`~protocol.reduced.merkle`: the tree whose root a commitment signs over a payload's shards;
* :mod:`~protocol.reduced.slot`: commitments, header entries, screen partials, reductions;
* :mod:`~protocol.reduced.bounds`: the norm every node holds a reduced shard to;
* :mod:`~protocol.reduced.fraud`: a checker's fraud proof, and every node's judgement of it;
* :mod:`~protocol.reduced.replica`: a node's state stepped with reductions;
* :mod:`~protocol.reduced.participant`: one node's part in closing slots, a state machine fed the messages the
  network brings (its slot's state and the actions it asks for: :mod:`~protocol.reduced.slot_state`).

Sans-IO, like the rest of :mod:`protocol`; ``testnet.reduced_net`` drives one participant per node in process
(``testnet.benchmarks.traffic`` and ``reduced_quality`` measure it).
"""

from protocol.reduced.plan import ModelPiece, ShardPlan
from protocol.reduced.replica import ReducedReplica
from protocol.reduced.roles import reducers, sealers
from protocol.reduced.seal import Seal, admitted, make_seal, winning_seal
from protocol.reduced.slot import (Commitment, PartialScreen, commit, header_entry, piece_partials, reduce_pieces,
                                   slot_terms)

__all__ = ["Commitment", "ModelPiece", "PartialScreen", "ReducedReplica", "Seal", "ShardPlan", "admitted", "commit",
           "header_entry", "make_seal", "piece_partials", "reduce_pieces", "reducers", "sealers", "slot_terms",
           "winning_seal"]
