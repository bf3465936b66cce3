"""A joiner takes the run's configuration from its peers (PROTOCOL.md §7a).

Every node of a run must train with the same run configuration (`protocol.runconfig`); a peer with another
one is refused at the handshake. So that a user can join a running training knowing only a peer's address
and the run id, a node started with `--peers` first reads the `hello` of a bootstrap peer (run configuration included),
and trains with that configuration:

- every run-wide setting the user did not give on the command line is taken from it (the model's
  architecture, the inner optimizer and schedule, batch size, seed, H, codec, window, outer learning rate,
  momentum and norm clip);
- a setting the user *did* give that differs from the run's is a startup error naming the flag, both
  values and the peer (the user asked for something this run does not do);
- a closed run (`run.founder`) cannot be adopted: its membership must be given (`--membership`);
- fields that no flag sets (the code's own constants, e.g. the aggregation rule) that differ mean the peer
  runs another version: a startup error too.

The joiner sends its own hello first (a closed run's node speaks second, and only to a member: one without
`--membership` is told to get one), and closes the connection as soon as the peer's hello has arrived (the
peer sees a connection closed during its handshake, and counts no refusal). If no bootstrap peer answers within
`timeout_s`, the node goes on with its own settings (the handshake still refuses a mismatch), and says so.
A bootstrap peer that lies only keeps the joiner out of the run: every other peer checks the joiner's
configuration at its own handshake.
"""

from __future__ import annotations

import dataclasses
import json
import os
import logging
import time
from collections.abc import Collection
from typing import TYPE_CHECKING

import trio

from node.island.config import ConfigError
from node.settings import NodeSettings, ledger_config, run_configuration
from p2p.errors import TransportError
from p2p.tls import Credentials
from p2p.tls import connect as tls_connect
from protocol.errors import Reason, RemoteProtocolError
from protocol import wire
from protocol.admission import Admission
from protocol.framing import FrameDecoder, frame
from protocol.gossip import Handshake
from protocol.identity import Identity
from protocol.messages import Hello, split_addr
from protocol.runconfig import config_differences, decode_config
from protocol.validation import Validator

if TYPE_CHECKING:
    from node.island.task import Task

__all__ = ["adopt_run_config", "adopted", "peer_hello"]

log = logging.getLogger("node.adopt")

# run configuration field -> (the NodeSettings field that sets it, its flag); model.*, inner.* and
# data.batch_size are set by --model / --set
_BY_FLAG = {"run.seed": ("seed", "--seed"), "run.inner_steps": ("inner_steps", "--inner-steps"),
            "run.compression": ("compression", "--compression"), "outer.window": ("window", "--window"),
            "outer.lr": ("outer_lr", "--outer-lr"), "outer.momentum": ("outer_momentum", "--outer-momentum"),
            "outer.norm_clip": ("norm_clip", "--norm-clip"), "outer.end_slot": ("max_rounds", "--max-rounds"),
            "outer.outer_rule": ("outer_rule", "--outer-rule")}
_DERIVED = {"inner.init_seed", "data.data_seed"}  # follow run.seed
# what every model declares (`Model.run_fields`: its name, size and hashes of what it is, node.island.fingerprint):
# for the CLI's model they follow from --model/--set, compared once those are adopted
_FINGERPRINTS = {"model.name", "model.parameters", "model.structure", "model.computation", "inner.optimizer",
                 "inner.schedule"}


def _fields(text: str) -> dict[str, object]:
    try:
        return decode_config(text)
    except RemoteProtocolError as exc:
        raise ConfigError(f"the run's configuration is unreadable: {exc.detail}") from None


def _by_set(name: str) -> bool:
    return (name.startswith(("model.", "inner.")) or name == "data.batch_size") and name not in _DERIVED


def _override(name: str, value: object) -> str:
    text = ("true" if value else "false") if isinstance(value, bool) else value if isinstance(value, str) else repr(value)
    return f"{name}={text}"


def own_run_config(settings: NodeSettings, founder: str, task: Task | None = None, peer_id: str = "") -> str:
    task = task if task is not None else settings.byte_lm_task()
    return run_configuration(settings, task, ledger_config(settings, task).fingerprint(), founder, peer_id)


def adopted(settings: NodeSettings, theirs: str, founder: str, pinned: Collection[str], peer: str = "the peer",
            task: Task | None = None, peer_id: str = "") -> NodeSettings:
    """`settings` with the run-wide settings of `theirs` (a run configuration text) that `pinned` (the
    NodeSettings fields the user gave) leaves open. `founder`: this node's (`protocol.admission`). `task`: a
    library user's (`diloco.run`), whose model is theirs to choose: its fields are never adopted, only
    compared; None for the CLI's byte-level model. `peer_id`: this node's (`run_configuration`). Raises
    ConfigError when a pinned setting conflicts or the difference cannot be adopted."""
    ours = own_run_config(settings, founder, task, peer_id)
    if ours == theirs:
        return settings
    mine, other = _fields(ours), _fields(theirs)
    differing = sorted(n for n in set(mine) | set(other) if mine.get(n) != other.get(n))
    conflicts, flagged, changes, overrides = [], [], {}, []  # flagged: conflicts with flags the user gave
    for name in differing:
        value = other.get(name)
        if name == "run.founder":
            what = f"closed by founder {value}: join it with --membership FILE" if value else "open: drop --closed/--membership"
            conflicts.append(f"the run is {what}")
        elif name == "data.tokenizer":  # a file's hash: only the user can give the file
            conflicts.append(f"the run encodes text with the tokenizer of sha256 {value}: give that file with --set "
                             "tokenizer=FILE (diloco-tokenizer info FILE prints its hash)" if value else
                             "the run reads text as bytes: drop --set tokenizer")
        elif name in _BY_FLAG:
            field, flag = _BY_FLAG[name]
            if field in pinned:
                flagged.append(f"{flag} {getattr(settings, field)} (the run's {name} is {json.dumps(value)})")
            changes[field] = value
        elif name in _FINGERPRINTS and task is None:
            continue  # follows from --model/--set: compared below, once those are adopted
        elif task is not None and name.startswith(("model.", "inner.", "data.")) or name in _FINGERPRINTS:
            if name not in other or name not in mine:
                where = "this program's model" if name in mine else "the run's model"
                conflicts.append(f"{where} alone sets {name}" + (f"={json.dumps(value)}" if name in other else ""))
            else:
                conflicts.append(f"this program's model has another {name}: {_what(name)} (ours "
                                 f"{json.dumps(mine.get(name))}, the run's {json.dumps(value)})")
        elif _by_set(name) and name in other:
            if "model" in pinned or "overrides" in pinned:
                flagged.append(f"--model/--set give {name}={json.dumps(mine.get(name))} (the run's is {json.dumps(value)})")
            overrides.append(_override(name, value))
    if conflicts or flagged:
        advice = (". Drop those flags to train with the run's settings, or start another run id" if flagged else
                  ". This program cannot join that run: train the run's model, or start another run id"
                  if task is not None and not any(c.startswith("the run") for c in conflicts) else "")
        raise ConfigError(f"--peers: this node's settings conflict with the run's ({peer}): "
                          + "; ".join(conflicts + flagged) + advice)
    candidate = dataclasses.replace(settings, overrides=(*settings.overrides, *overrides), **changes)
    left = config_differences(own_run_config(candidate, founder, task, peer_id), theirs)
    if left:
        raise ConfigError(f"--peers: the run's configuration ({peer}) differs in settings no flag sets (another "
                          f"version of diloco?): {'; '.join(left[:6])}")
    log.info("adopted the run's configuration from %s: %s", peer, ", ".join(differing))
    return candidate


def _what(name: str) -> str:
    """What a run configuration field stands for, in words (for a refusal)."""
    return {"model.structure": "the tensors' names, shapes or dtypes differ",
            "model.computation": "the traced loss differs: another architecture, activation or loss (or another "
                                 "JAX version: see diloco.Model's trace)",
            "inner.optimizer": "the inner optimizer or its hyperparameters differ",
            "inner.schedule": "the learning-rate schedule differs",
            "model.parameters": "another parameter count", "inner.lr": "another peak learning rate"}.get(name, "a field of its config")


def own_hello(identity: Identity, run_id: str, admission: Admission, run_config: str) -> Hello:
    """The hello a joiner sends first: a closed run's node answers it only if it shows a membership. It carries
    the joiner's own configuration: a peer whose configuration it is counts no refusal."""
    return Handshake(identity, Validator(run_id), gossip_addr="", http_addr="", challenge=os.urandom(32),
                     admission=admission, run_config=run_config).hello


class ClosedOnHello(OSError):
    """The peer closed the connection on our hello without sending its own: a closed run's node does that to a
    key without a membership (it speaks second, PROTOCOL.md section 7b)."""


async def peer_hello(address: str, run_id: str, timeout_s: float, credentials: Credentials | None = None,
                     ours: Hello | None = None) -> Hello:
    """The hello the node at gossip `address` sends (inside TLS with `credentials`, cleartext without), after
    `ours` if given (a closed run's node answers only a member's hello). Raises OSError (`ClosedOnHello`),
    TransportError, trio.TooSlowError or RemoteProtocolError (wrong run id, not a hello, a certificate that
    proves no peer id)."""
    host, port = split_addr(address)
    decoder, validator = FrameDecoder(), Validator(run_id)
    with trio.fail_after(timeout_s):
        if credentials is None:
            stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
        else:
            stream = await tls_connect(address, credentials.gossip_client, timeout_s)
        async with stream:
            if ours is not None:
                await stream.send_all(frame(wire.encode(ours)))
            while (body := decoder.next_frame()) is None:
                try:
                    data = await stream.receive_some(65536)
                except TransportError:
                    data = b""
                if not data:
                    raise (ClosedOnHello if ours is not None else OSError)("closed the connection before its hello")
                decoder.receive_data(data)
    message = validator.validate(body, time.time())
    if type(message) is not Hello:
        raise RemoteProtocolError(Reason.BAD_HANDSHAKE, f"sent {type(message).__name__} instead of its hello")
    return message


async def adopt_run_config(settings: NodeSettings, founder: str, pinned: Collection[str],
                           timeout_s: float = 30.0, task: Task | None = None, peer_id: str = "",
                           credentials: Credentials | None = None, identity: Identity | None = None,
                           admission: Admission | None = None) -> NodeSettings:
    """Read the run configuration of the first bootstrap peer that answers (each tried in turn until
    `timeout_s`) and return `adopted(...)` settings; the settings unchanged if none answers. With `identity`
    and `admission`, our own hello goes first (what a closed run's node waits for)."""
    ours = None
    if identity is not None and admission is not None:
        ours = own_hello(identity, settings.run_id, admission, own_run_config(settings, founder, task, peer_id))
    deadline = trio.current_time() + timeout_s
    problems: dict[str, str] = {}
    closed_on_hello: set[str] = set()
    while trio.current_time() < deadline:
        for address in settings.peers:
            try:
                hello = await peer_hello(address, settings.run_id, min(5.0, max(0.1, deadline - trio.current_time())),
                                         credentials, ours)
            except RemoteProtocolError as exc:
                if exc.reason is Reason.WRONG_RUN_ID:  # the peer is up and in another run: retrying cannot help
                    raise ConfigError(f"--run-id {settings.run_id}: the peer at {address} is in another run "
                                      f"({exc.detail.removeprefix('hello ')})") from None
                problem = f"{type(exc).__name__}: {exc}"
            except (OSError, TransportError, trio.TooSlowError) as exc:
                problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                if isinstance(exc, ClosedOnHello):
                    closed_on_hello.add(address)
                else:
                    closed_on_hello.discard(address)
            else:
                problem = "" if hello.run_config else "declares no run configuration"
            if problem:
                if address not in problems:  # each peer's first failure at once, not after the whole wait
                    log.info("reading the run's configuration from %s: %s; trying again for up to %.0f s", address,
                             problem, max(0.0, deadline - trio.current_time()))
                problems[address] = problem
                continue
            return adopted(settings, hello.run_config, founder, pinned, f"{hello.peer_id} at {address}", task, peer_id)
        await trio.sleep(min(1.0, max(0.0, deadline - trio.current_time())))
    if closed_on_hello and closed_on_hello == set(settings.peers) and not founder:
        raise ConfigError(f"every peer ({', '.join(sorted(closed_on_hello))}) closed the connection on this node's "
                          "hello without answering: a closed run's nodes answer only its members; join it with "
                          "--membership FILE (its founder grants it: diloco-admit grant)")
    log.warning("could not read the run's configuration from any peer in %.0f s (%s); training with this node's own "
                "settings: peers with other ones will refuse it (config_mismatch)", timeout_s,
                "; ".join(f"{a}: {p}" for a, p in problems.items()))
    return settings
