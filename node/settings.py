"""Everything one `diloco-node` process is told: a frozen dataclass built by the CLI (`node.cli`) or by a
test, and read by the runtime. The machine-learning half (model, data, inner optimizer) is a
`node.island.config.Config`; this adds the network, the outer loop and the process's own knobs.

Run-wide settings (every node of a run must agree, or their updates and states are refused):
`run_id`, `model` and `overrides` (tensor shapes), `seed` (initial parameters), `window`, `outer_lr`,
`outer_momentum`, `norm_clip`, `heartbeat_s`, whether the run is closed (its founder: `closed`,
`membership`), and its traffic (`traffic`; a reduced run's `roster`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from node.checkpoint import CheckpointDir
from node.island.config import Config, ConfigError, MeshShape, preset
from node.island.data import resolve_vocab
from protocol.addresses import is_wildcard_host
from protocol.admission import Admission, Membership
from protocol.compression.formats import codec_names
from protocol.errors import RemoteProtocolError
from protocol.identity import Identity, public_key_from_peer_id
from protocol.ledger import LedgerConfig
from protocol.ledger.rules import rule_names
from protocol.messages import split_addr
from protocol.runconfig import encode_config

if TYPE_CHECKING:
    from node.island.task import Task

__all__ = ["CHAOS_MODES", "REDUCED_CHAOS_MODES", "TRAFFIC_MODES", "NodeSettings", "ledger_config", "load_admission", "load_identity",
           "load_roster", "open_checkpoints", "run_configuration"]

CHAOS_MODES = ("garbage", "bad-updates", "flood", "unproven", "tarpit", "forge-state", "poison:negate", "poison:scale",
               "poison:random", "poison:tokens", "poison:collude", "lie")
# what a node of a reduced run can be made to do (node.reduced.chaos): a hostile contributor, or an aggregator
# whose reductions are not the honest ones ("lie", a reduced run's alone)
REDUCED_CHAOS_MODES = ("poison:negate", "poison:scale", "poison:random", "poison:tokens", "poison:collude", "lie")
# all-to-all: every node fetches every update; reduced: sealed slots, each shard reduced by one aggregator
# (docs/design.md, "Traffic that does not grow with the run"; PROTOCOL.md section 15)
TRAFFIC_MODES = ("all-to-all", "reduced")
REDUCED_CHECK_SHARE = 0.5  # q: a checker's chance to draw each piece of a reduction it checks (run-wide)


@dataclasses.dataclass(frozen=True)
class NodeSettings:
    """One node process. Defaults are the CLI's (see `node.cli` for the meaning of each flag)."""

    run_id: str
    key_path: Path
    listen: str = "127.0.0.1:0"
    http: str = "127.0.0.1:0"
    peers: tuple[str, ...] = ()
    advertise: str = ""  # HOST or HOST:PORT peers reach us at (gossip; HTTP on that host); "": chosen
    advertise_http: str = ""  # HOST:PORT of our HTTP plane for peers, when it differs (NAT, proxy)
    insecure: bool = False  # cleartext on both planes (benchmarks, tests); TLS 1.3 otherwise
    reachability: str = "auto"  # whether peers can dial us: asked of them, or "public" / "private" (p2p.reach)
    data: tuple[str, ...] = ()
    model: str = "tiny"
    overrides: tuple[str, ...] = ()  # KEY=VALUE strings for node.island.config (e.g. "batch_size=8")
    mesh: MeshShape | None = None  # the island's ("data", "fsdp") mesh (node.island.mesh); None: chosen
    remat: bool = False  # recompute activations in the backward pass (the model's remat_loss)
    inner_steps: int = 50
    adaptive_steps: bool = True
    max_rounds: int | None = None  # None: until a signal
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 1
    checkpoint_interval_s: float = 30.0
    inflight_every_s: float = 2.0  # node.outer.inflight: journal the round in flight (0: off)
    keep_checkpoints: int = 3
    compression: str = "int4"
    eval_every: int = 5
    eval_budget: float = 0.02
    eval_batches: int = 4
    fork_tolerance: float = 0.1  # node.outer.upkeep.BetweenRounds.vet: a forked state this much worse is refused
    seed: int = 0
    window: int = 8
    quorum: int = 1
    outer_lr: float = 0.7
    outer_momentum: float = 0.6
    outer_rule: str = "nesterov"  # protocol.ledger.rules: the outer optimizer, by its registered name
    norm_clip: float = 1.0  # protocol.ledger.bound: k of the per-tensor norm bound (0: off)
    heartbeat_s: float = 1.0
    sync_timeout_s: float | None = None  # None: with peers, wait for their state until stopped
    drain_timeout_s: float | None = None  # None: derived from the heartbeat and round times
    slowdown: float = 1.0
    misbehave: str | None = None
    allow_chaos: bool = False
    closed: bool = False  # found a closed run: only keys this node's key admits take part (protocol.admission)
    membership: Path | None = None  # join a closed run with the founder's membership file for this key
    metrics_file: Path | None = None  # node.metrics: one JSON line of figures per round (None: off)
    traffic: str = "all-to-all"  # TRAFFIC_MODES; "reduced" needs a roster
    roster: Path | None = None  # a reduced run's contributors: a file of peer ids, one a line (load_roster)
    slot_patience_s: float = 30.0  # reduced: a sealer's wait for every contributor's update after its own
    slot_step_s: float = 3.0  # reduced: the slot clock's step ξ (between sealers, before a reducer is passed over)

    def __post_init__(self) -> None:
        if not self.run_id:
            raise ConfigError("--run-id must not be empty")
        if self.closed and self.membership is not None:
            raise ConfigError("--closed founds a closed run and --membership joins one: give one of them")
        for flag, addr in (("--listen", self.listen), ("--http", self.http)):
            _check_addr(flag, addr, allow_port_0=True)
        for addr in self.peers:
            _check_addr("--peers", addr, allow_port_0=False)
        if self.advertise_http:
            _check_addr("--advertise-http", self.advertise_http, allow_port_0=False)
        for flag, host in (("--advertise", self.advertise_host_port()[0]),
                           ("--advertise-http", split_addr(self.advertise_http)[0] if self.advertise_http else "")):
            if host and is_wildcard_host(host):
                _fail(f"{flag} {host}: a wildcard address cannot reach this node; name the address peers use")
        if self.sync_timeout_s is not None and not 0.0 < self.sync_timeout_s < float("inf"):
            _fail(f"--sync-timeout must be > 0 seconds, got {self.sync_timeout_s}")
        if self.compression not in codec_names():
            _fail(f"--compression must be one of {codec_names()}, got {self.compression!r}")
        for flag, value, low in (("--inner-steps", self.inner_steps, 1), ("--eval-batches", self.eval_batches, 1),
                                 ("--checkpoint-every", self.checkpoint_every, 1), ("--quorum", self.quorum, 1),
                                 ("--keep-checkpoints", self.keep_checkpoints, 1), ("--eval-every", self.eval_every, 0),
                                 ("--window", self.window, 1), ("--seed", self.seed, 0)):
            if value < low:
                _fail(f"{flag} must be >= {low}, got {value}")
        if self.max_rounds is not None and self.max_rounds < 0:
            _fail(f"--max-rounds must be >= 0, got {self.max_rounds}")
        if not self.fork_tolerance >= 0.0:
            _fail(f"--fork-tolerance must be >= 0 (inf: adopt without evaluating), got {self.fork_tolerance}")
        if not 0.0 < self.eval_budget <= 1.0:
            _fail(f"--eval-budget must be in (0, 1], got {self.eval_budget}")
        if not 0.0 <= self.checkpoint_interval_s < float("inf"):
            _fail(f"--checkpoint-interval must be >= 0 seconds, got {self.checkpoint_interval_s}")
        if not 0.0 <= self.inflight_every_s < float("inf"):
            _fail(f"--inflight-every must be >= 0 seconds (0: off), got {self.inflight_every_s}")
        if not 0.0 < self.outer_lr < float("inf"):
            _fail(f"--outer-lr must be > 0, got {self.outer_lr}")
        if not 0.0 <= self.outer_momentum < 1.0:
            _fail(f"--outer-momentum must be in [0, 1), got {self.outer_momentum}")
        if self.outer_rule not in rule_names():
            _fail(f"--outer-rule {self.outer_rule!r} is not a registered outer rule (registered: {rule_names()})")
        if not (self.norm_clip == 0.0 or 1.0 <= self.norm_clip < float("inf")):
            _fail(f"--norm-clip must be 0 (off) or a finite number >= 1, got {self.norm_clip}")
        if not self.slowdown >= 1.0:
            _fail(f"--slowdown must be >= 1, got {self.slowdown}")
        if not 0.0 < self.heartbeat_s <= 60.0:
            _fail(f"--heartbeat must be in (0, 60] seconds, got {self.heartbeat_s}")
        if self.misbehave is not None and self.misbehave not in CHAOS_MODES:
            _fail(f"--misbehave must be one of {CHAOS_MODES}, got {self.misbehave!r}")
        if self.traffic not in TRAFFIC_MODES:
            _fail(f"--traffic must be one of {TRAFFIC_MODES}, got {self.traffic!r}")
        if self.traffic == "reduced":
            if self.roster is None:
                _fail("--traffic reduced needs --roster FILE: the peer ids of the run's contributors, one a line")
            if self.misbehave is not None and self.misbehave not in REDUCED_CHAOS_MODES:
                _fail(f"--misbehave {self.misbehave} is not built for --traffic reduced (built there: "
                      f"{', '.join(REDUCED_CHAOS_MODES)})")
            for flag, value in (("--slot-patience", self.slot_patience_s), ("--slot-step", self.slot_step_s)):
                if not 0.0 < value < float("inf"):
                    _fail(f"{flag} must be > 0 seconds, got {value}")
        elif self.roster is not None:
            _fail("--roster names a reduced run's contributors: give it with --traffic reduced")
        elif self.misbehave == "lie":
            _fail("--misbehave lie is an aggregator's lie: an all-to-all run has no aggregators (use --traffic reduced)")

    def advertise_host_port(self) -> tuple[str, int]:
        """`advertise` as (host, gossip port); port 0 when it names a host only ("": not given)."""
        text = self.advertise
        if not text:
            return "", 0
        try:
            return split_addr(text)
        except ValueError:
            pass
        host = text[1:-1] if text.startswith("[") and text.endswith("]") else text
        if ":" in host:
            try:
                ipaddress.IPv6Address(host.split("%", 1)[0])
            except ValueError:
                _fail(f"--advertise {text!r} is not HOST or HOST:PORT")
        elif not host or any(c.isspace() or c in "/?#@[]" for c in host):
            _fail(f"--advertise {text!r} is not HOST or HOST:PORT")
        return host, 0

    @property
    def heartbeat_timeout_s(self) -> float:
        """Silence after which a peer counts as gone (five heartbeats)."""
        return 5.0 * self.heartbeat_s

    def ml_config(self, shard_key: str) -> Config:
        """The model/data/inner-optimizer config: the preset, then `overrides`, then the seed (initial
        parameters and data order) and this node's data shard (`shard_key`, its peer id)."""
        cfg = preset(self.model).with_overrides_from_strings(self.overrides)
        extra: dict[str, object] = {"init_seed": self.seed, "data_seed": self.seed, "shard_key": shard_key}
        if self.data:
            extra["sources"] = self.data
        return resolve_vocab(cfg.with_overrides(**extra), self.overrides)  # vocab_size from the data

    def byte_lm_task(self) -> Task:
        """The CLI's task: the byte-level transformer of `--model`/`--set` on `--data` (`node.island.bytelm`);
        each node reads the shard of its peer id."""
        from node.island.bytelm import byte_lm_task  # JAX: not imported for `diloco-node --help`

        return byte_lm_task(self.ml_config(""), self.eval_batches)


def ledger_config(settings: NodeSettings, task: Task) -> LedgerConfig:
    """The outer optimizer's settings (`protocol.ledger.LedgerConfig`) for this node's flags and model."""
    return LedgerConfig(
        window=settings.window, lr=settings.outer_lr, momentum=settings.outer_momentum, outer_rule=settings.outer_rule,
        embeddings=task.model.embeddings, norm_clip=settings.norm_clip,
        # what one update may claim: a full round of this run's batches (protocol.ledger.bound)
        tokens_per_step=task.tokens_per_batch, max_inner_steps=settings.inner_steps,
        # the run's end, a fact of the run (its configuration), not of one node: every node stops at this slot
        end_slot=settings.max_rounds,
        # AdamW moves an element by at most about the learning rate per step; honest updates measure
        # 0.14-0.25 x lr x steps in RMS (BENCHMARKS.md, "Hostile peer"): 0.5 x lr leaves them alone and
        # holds a lone hostile update to ~2-3 honest norms (2 x lr let it take ~10: loss x1.6)
        max_step_rms=0.5 * task.model.lr)


def run_configuration(settings: NodeSettings, task: Task, ledger_fingerprint: Mapping[str, object],
                      founder: str = "", peer_id: str = "", roster: tuple[str, ...] = ()) -> str:
    """The run configuration this node trains with (`protocol.runconfig`): what every node of its run must
    share — the model's run-wide fields (for the byte-level model: its architecture, the inner optimizer and
    schedule, the batch size and data seed; for every model: hashes of its tensors, its traced loss and inner
    optimizer, its schedule; `node.island.task.Model.run_fields`), the seed, H, the codec, the founder of a
    closed run ("" for an open one) and the outer optimizer's ledger settings. Per-node knobs (data files and
    shard, quorum, heartbeat, checkpoints, adaptive steps, chaos) are not part of it. `peer_id`: whose batches
    a task without an `example` peeks at for their shapes."""
    fields: dict[str, object] = dict(task.run_fields(peer_id))
    fields.update({"run.seed": settings.seed, "run.inner_steps": settings.inner_steps,
                   "run.compression": str(settings.compression), "run.founder": founder})
    fields.update({f"outer.{k}": (tuple(v) if isinstance(v, list) else v) for k, v in ledger_fingerprint.items()})
    if settings.traffic == "reduced":  # an all-to-all run's configuration is as it was before reduced slots
        fields.update({"run.traffic": "reduced", "reduced.roster": roster_digest(roster),
                       "reduced.shards": len(roster), "reduced.check_share": REDUCED_CHECK_SHARE})
    return encode_config(fields)  # type: ignore[arg-type]


def load_identity(settings: NodeSettings) -> Identity:
    """The node's key (`--key`), created mode 0600 when the file does not exist."""
    try:
        settings.key_path.parent.mkdir(parents=True, exist_ok=True)
        return Identity.load_or_create(settings.key_path)
    except OSError as exc:
        raise ConfigError(f"--key {settings.key_path}: {exc.strerror or exc}") from None


def load_roster(settings: NodeSettings, peer_id: str) -> tuple[str, ...]:
    """A reduced run's contributors (`--roster FILE`): peer ids, one a line (blank lines and `#` comments
    skipped), sorted; this node's own among them. Every node of the run is started with the same roster (its
    digest is part of the run configuration: a node with another is refused)."""
    assert settings.roster is not None
    try:
        lines = settings.roster.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--roster {settings.roster}: {getattr(exc, 'strerror', None) or exc}") from None
    ids = [line.split("#", 1)[0].strip() for line in lines]
    ids = [i for i in ids if i]
    for n, peer in enumerate(ids, 1):
        try:
            public_key_from_peer_id(peer)
        except RemoteProtocolError:
            raise ConfigError(f"--roster {settings.roster}: {peer[:60]!r} (entry {n}) is not a peer id "
                              "(diloco-admit id --key FILE prints one)") from None
    roster = tuple(sorted(set(ids)))
    if len(roster) < 2:
        raise ConfigError(f"--roster {settings.roster}: a reduced run needs at least 2 contributors, got {len(roster)}")
    if peer_id not in roster:
        raise ConfigError(f"--roster {settings.roster} does not name this node's key ({peer_id})")
    return roster


def roster_digest(roster: tuple[str, ...]) -> str:
    """What the run configuration holds of a roster: SHA-256 of its sorted peer ids, one a line, hex."""
    return hashlib.sha256("".join(p + "\n" for p in sorted(roster)).encode()).hexdigest()


def load_admission(settings: NodeSettings, peer_id: str) -> Admission:
    """Who may take part (`protocol.admission`): an open run; a closed run founded by this node (`--closed`);
    or the closed run whose founder admitted this node's key (`--membership FILE`, `diloco-admit grant`)."""
    if settings.closed:
        return Admission(settings.run_id, peer_id, peer_id=peer_id)
    if settings.membership is None:
        return Admission(settings.run_id)
    try:
        membership = Membership.from_json(settings.membership.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"--membership {settings.membership}: {exc}") from None
    if membership.run_id != settings.run_id:
        raise ConfigError(f"--membership {settings.membership} admits to run {membership.run_id!r}, not --run-id "
                          f"{settings.run_id!r}")
    if membership.member != peer_id:
        raise ConfigError(f"--membership {settings.membership} admits {membership.member}, but --key is {peer_id}: "
                          "ask the founder for a membership of this key (diloco-admit grant)")
    return Admission(settings.run_id, membership.founder, membership, peer_id=peer_id)


def open_checkpoints(settings: NodeSettings, peer_id: str) -> CheckpointDir | None:
    """The node's `--checkpoint-dir`, created and checked writable now (a one-line error, not a crash later);
    None without one."""
    if settings.checkpoint_dir is None:
        return None
    try:
        checkpoints = CheckpointDir(settings.checkpoint_dir, keep=settings.keep_checkpoints,
                                    expect={"run_id": settings.run_id, "peer_id": peer_id})
    except OSError as exc:
        raise ConfigError(f"--checkpoint-dir {settings.checkpoint_dir}: {exc.strerror or exc}") from None
    if not os.access(settings.checkpoint_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"--checkpoint-dir {settings.checkpoint_dir}: not writable")
    return checkpoints


def _fail(message: str) -> None:
    raise ConfigError(message)


def _check_addr(flag: str, addr: str, *, allow_port_0: bool) -> None:
    host, sep, port = addr.rpartition(":")
    if allow_port_0 and sep and port == "0" and host:
        return
    try:
        split_addr(addr)
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from None
