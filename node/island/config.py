"""Typed, layered configuration for a training node: one frozen dataclass per concern.

`Config` bundles `ModelConfig`, `DataConfig` and `InnerConfig`. Named presets (`tiny`, `small`, `base`,
`large`) are starting points; any field can be overridden, from Python (`config.with_overrides(d_model=256)`)
or from command-line strings (`config.with_overrides_from_strings(["d_model=256", "inner.lr=1e-3"])`).
Field names are unique across sections, so the section prefix is optional. Unknown keys, values of the
wrong type and inconsistent values (e.g. `d_model` not divisible by `n_heads`) raise `ConfigError` with a
message that names the field.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

__all__ = [
    "MESH_AXES",
    "Config",
    "ConfigError",
    "DataConfig",
    "InnerConfig",
    "MeshShape",
    "ModelConfig",
    "PRESETS",
    "overridden_fields",
    "preset",
]


class ConfigError(ValueError):
    """A configuration key is unknown, a value has the wrong type, or values are inconsistent."""


def _check_positive(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value <= 0:
            raise ConfigError(f"{type(obj).__name__}.{name} must be > 0, got {value!r}")


def _check_fraction(obj: object, name: str, *, allow_zero: bool) -> None:
    value = getattr(obj, name)
    low_ok = value >= 0 if allow_zero else value > 0
    if not (low_ok and value <= 1):
        bound = "[0, 1]" if allow_zero else "(0, 1]"
        raise ConfigError(f"{type(obj).__name__}.{name} must be in {bound}, got {value!r}")


MESH_AXES = ("data", "fsdp")


@dataclasses.dataclass(frozen=True)
class MeshShape:
    """The sizes of the island's mesh axes; their product is the number of devices the island trains on."""

    data: int = 1
    fsdp: int = 1

    def __post_init__(self) -> None:
        for axis in MESH_AXES:
            size = getattr(self, axis)
            if not (isinstance(size, int) and size >= 1):
                raise ConfigError(f"--mesh: {axis} must be a whole number >= 1, got {size!r}")

    @property
    def size(self) -> int:
        return self.data * self.fsdp

    @classmethod
    def parse(cls, text: str) -> MeshShape:
        """`"data=2,fsdp=4"` (an axis left out is 1); `ConfigError` naming what is wrong otherwise."""
        sizes: dict[str, int] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            axis, eq, value = item.partition("=")
            axis = axis.strip()
            if not eq or axis not in MESH_AXES:
                raise ConfigError(f"--mesh {text!r}: expected AXIS=SIZE items with AXIS one of {', '.join(MESH_AXES)}, "
                                  f"e.g. data=2,fsdp=4")
            if axis in sizes:
                raise ConfigError(f"--mesh {text!r}: {axis} given twice")
            try:
                sizes[axis] = int(value)
            except ValueError:
                raise ConfigError(f"--mesh {text!r}: {axis} must be a whole number, got {value.strip()!r}") from None
        if not sizes:
            raise ConfigError(f"--mesh {text!r}: name at least one axis, e.g. fsdp=8")
        return cls(**sizes)

    def __str__(self) -> str:
        return f"data={self.data},fsdp={self.fsdp}"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A decoder-only byte-level transformer (see `node.island.model`).

    `seq_len` is the context length in tokens; `d_ff` the hidden width of each MLP; `dtype` the compute
    dtype of activations ("float32" or "bfloat16"; parameters and the loss are always float32).
    `tie_embeddings` shares the input embedding with the output projection.
    """

    vocab_size: int = 256
    seq_len: int = 128
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 512
    rope_base: float = 10_000.0
    tie_embeddings: bool = True
    init_std: float = 0.02
    dtype: str = "float32"

    def __post_init__(self) -> None:
        _check_positive(self, "vocab_size", "seq_len", "d_model", "n_layers", "n_heads", "d_ff",
                        "rope_base", "init_std")
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if (self.d_model // self.n_heads) % 2:
            raise ConfigError(f"head size d_model/n_heads = {self.d_model // self.n_heads} must be even "
                              "(rotary positions rotate pairs of features)")
        if self.dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"ModelConfig.dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where tokens come from and how this node's share of them is chosen (see `node.island.data`).

    `sources` empty means the embedded corpus (the Python standard library's sources and docs). Otherwise:
    text files, folders, globs, or pre-tokenized `.npy` / `.bin` (raw little-endian, uint16 unless a
    `.json` sidecar says otherwise) files. `tokenizer`: a `tokenizers` JSON file that encodes the text
    ("": one token per byte); see `node.island.tokens`.
    The held-out split takes every unit (a `split_unit_tokens`-long piece of a document) whose hash falls
    below `heldout_fraction`; `shard_key` (a node's peer id) picks `shard_fraction` of the train units
    ("" = the whole train split). `batch_size` is sequences per inner step on this node.
    """

    sources: tuple[str, ...] = ()
    batch_size: int = 16
    heldout_fraction: float = 0.05
    split_unit_tokens: int = 65_536
    shard_key: str = ""
    shard_fraction: float = 0.5
    data_seed: int = 0
    tokenizer: str = ""

    def __post_init__(self) -> None:
        _check_positive(self, "batch_size", "split_unit_tokens")
        _check_fraction(self, "heldout_fraction", allow_zero=False)
        if self.heldout_fraction >= 1:
            raise ConfigError(f"DataConfig.heldout_fraction must be < 1, got {self.heldout_fraction!r}")
        _check_fraction(self, "shard_fraction", allow_zero=False)


@dataclasses.dataclass(frozen=True)
class InnerConfig:
    """The inner optimizer: AdamW with linear warmup then cosine decay to `min_lr_ratio * lr`.

    The schedule counts the inner steps across rounds (a node joining a running training starts it at
    the run's estimated step, see `node.runtime`); `total_steps` is its horizon (after it the rate stays
    at the floor). Gradients are clipped to global norm `clip_norm` before AdamW. Weight decay
    applies to matrices only (not to norm scales). `init_seed` seeds parameter initialisation.
    """

    lr: float = 3e-3
    warmup_steps: int = 50
    total_steps: int = 10_000
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    clip_norm: float = 1.0
    init_seed: int = 0

    def __post_init__(self) -> None:
        _check_positive(self, "lr", "total_steps", "eps", "clip_norm")
        if self.warmup_steps < 0 or self.warmup_steps >= self.total_steps:
            raise ConfigError(f"InnerConfig.warmup_steps must be in [0, total_steps={self.total_steps}), "
                              f"got {self.warmup_steps}")
        _check_fraction(self, "min_lr_ratio", allow_zero=True)
        if self.weight_decay < 0:
            raise ConfigError(f"InnerConfig.weight_decay must be >= 0, got {self.weight_decay!r}")
        for name in ("b1", "b2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"InnerConfig.{name} must be in [0, 1), got {getattr(self, name)!r}")


_SECTIONS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "inner": InnerConfig}


def _field_owner() -> dict[str, str]:
    owner: dict[str, str] = {}
    for section, cls in _SECTIONS.items():
        for field in dataclasses.fields(cls):
            if field.name in owner:  # a programming error in this module; keep names unique
                raise AssertionError(f"field {field.name!r} appears in two config sections")
            owner[field.name] = section
    return owner


_OWNER = _field_owner()


def _field_type(section: str, name: str) -> Any:
    return typing.get_type_hints(_SECTIONS[section])[name]


def _check_type(key: str, expected: Any, value: Any) -> Any:
    """Return `value` if it fits `expected` (ints are accepted for floats), else raise ConfigError."""
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is int and isinstance(value, bool):
        raise ConfigError(f"{key} expects int, got bool {value!r}")
    if typing.get_origin(expected) is tuple:
        if isinstance(value, list):
            value = tuple(value)
        if not (isinstance(value, tuple) and all(isinstance(v, str) for v in value)):
            raise ConfigError(f"{key} expects a tuple of strings, got {value!r}")
        return value
    if not isinstance(value, expected):
        raise ConfigError(f"{key} expects {expected.__name__}, got {type(value).__name__} {value!r}")
    return value


def _parse(key: str, expected: Any, text: str) -> Any:
    """Parse a command-line string into the field's type."""
    if typing.get_origin(expected) is tuple:
        return tuple(part for part in text.split(",") if part)
    if expected is bool:
        lowered = text.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{key} expects a boolean (true/false), got {text!r}")
    if expected is str:
        return text
    try:
        return expected(text)
    except ValueError:
        raise ConfigError(f"{key} expects {expected.__name__}, got {text!r}") from None


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything a training node's machine-learning half needs: model, data, inner optimizer."""

    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    inner: InnerConfig = InnerConfig()

    def _resolve(self, key: str) -> tuple[str, str]:
        section, dot, name = key.rpartition(".")
        if not dot:
            if key not in _OWNER:
                raise ConfigError(f"unknown config key {key!r}; known keys: {', '.join(sorted(_OWNER))}")
            return _OWNER[key], key
        if section not in _SECTIONS:
            raise ConfigError(f"unknown config section {section!r} in {key!r}; sections: "
                              f"{', '.join(_SECTIONS)}")
        if _OWNER.get(name) != section:
            names = sorted(f.name for f in dataclasses.fields(_SECTIONS[section]))
            raise ConfigError(f"unknown config key {key!r}; {section} has: {', '.join(names)}")
        return section, name

    def with_overrides(self, **overrides: Any) -> Config:
        """A copy with fields replaced; keys are field names (`d_model`, `lr`, ...), values typed."""
        return self._replace({k: v for k, v in overrides.items()}, parse=False)

    def with_overrides_from_strings(self, items: typing.Iterable[str]) -> Config:
        """A copy with `key=value` strings applied, e.g. `["d_model=256", "inner.lr=1e-3"]`.

        Tuples (`sources`) are comma-separated. Later items win over earlier ones.
        """
        parsed: dict[str, str] = {}
        for item in items:
            key, eq, text = item.partition("=")
            if not eq or not key.strip():
                raise ConfigError(f"override {item!r} is not of the form key=value")
            parsed[key.strip()] = text.strip()
        return self._replace(parsed, parse=True)

    def _replace(self, overrides: dict[str, Any], *, parse: bool) -> Config:
        changes: dict[str, dict[str, Any]] = {section: {} for section in _SECTIONS}
        for key, value in overrides.items():
            section, name = self._resolve(key)
            expected = _field_type(section, name)
            value = _parse(key, expected, value) if parse else value
            changes[section][name] = _check_type(key, expected, value)
        return Config(**{section: dataclasses.replace(getattr(self, section), **changes[section])
                         for section in _SECTIONS})

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """Plain nested dict (for logs, reports and `/status`)."""
        return dataclasses.asdict(self)


def overridden_fields(items: typing.Iterable[str]) -> frozenset[str]:
    """The field names (`vocab_size`, not `model.vocab_size`) that `key=value` strings set: what
    `Config.with_overrides_from_strings(items)` changes. Raises ConfigError for an unknown key."""
    return frozenset(Config()._resolve(item.partition("=")[0].strip())[1] for item in items)


def _presets() -> dict[str, Config]:
    tiny = Config(
        model=ModelConfig(seq_len=64, d_model=64, n_layers=2, n_heads=4, d_ff=256),
        data=DataConfig(batch_size=16),
        inner=InnerConfig(lr=3e-3, warmup_steps=50),
    )
    small = Config(
        model=ModelConfig(seq_len=128, d_model=256, n_layers=4, n_heads=4, d_ff=1024),
        data=DataConfig(batch_size=16),
        inner=InnerConfig(lr=2e-3, warmup_steps=200),
    )
    base = Config(
        model=ModelConfig(seq_len=1024, d_model=768, n_layers=12, n_heads=12, d_ff=3072, dtype="bfloat16"),
        data=DataConfig(batch_size=64),
        inner=InnerConfig(lr=6e-4, warmup_steps=1000, total_steps=100_000),
    )
    large = Config(
        model=ModelConfig(seq_len=2048, d_model=2048, n_layers=20, n_heads=16, d_ff=8192, dtype="bfloat16"),
        data=DataConfig(batch_size=128),
        inner=InnerConfig(lr=3e-4, warmup_steps=2000, total_steps=200_000),
    )
    return {"tiny": tiny, "small": small, "base": base, "large": large}


PRESETS: dict[str, Config] = _presets()


def preset(name: str) -> Config:
    """The named preset; `ConfigError` lists the known names otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}") from None
