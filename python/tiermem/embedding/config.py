"""Settings of tables and their fused optimizers as frozen dataclasses, validated in one
place, and the vocabularies they are checked against, read from the native module (the
crates' registries) rather than copied."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from .. import _tiermem
from ..exceptions import InvalidArgumentError

__all__ = [
    "OptimizerConfig",
    "Placement",
    "FILE_HOMES",
    "TABLE_DIR_WORDS",
    "table_dir",
    "OPTIMIZERS",
    "WEIGHT_DECAY_MODES",
    "CACHE_POLICIES",
    "ADMISSIONS",
    "MODES",
    "DTYPES",
    "PREFETCH",
    "row_stride",
    "access_counts",
]

#: Optimizers the fused update runs (``tiermem-embed``'s registry).
OPTIMIZERS: tuple[str, ...] = tuple(_tiermem.OPTIMIZERS)
#: How weight decay may enter an update (``tiermem-embed``'s names): ``l2`` added to the
#: gradient, ``decoupled`` applied to the weight beside the step.
WEIGHT_DECAY_MODES: tuple[str, ...] = tuple(_tiermem.WEIGHT_DECAY_MODES)
#: Cache policies of cached tables (``tiermem-embed``'s registry), plus ``simple``: no cache,
#: every row on the slow device.
CACHE_POLICIES: tuple[str, ...] = (*_tiermem.CACHE_POLICIES, "simple")
#: Admissions: which rows a cache takes in (``tiermem-embed``'s registry; some take an
#: argument after ``:``).
ADMISSIONS: tuple[str, ...] = tuple(_tiermem.ADMISSIONS)
#: Lookup modes.
MODES: tuple[str, ...] = tuple(_tiermem.MODES)
#: Storage types, with the short names also accepted.
DTYPES: dict[str, str] = {
    **{d: d for d in _tiermem.DTYPES},
    "f32": "float32",
    "bf16": "bfloat16",
    "f16": "float16",
    "int8": "int8_rowwise",
}
#: Default software prefetch distance, in indices.
PREFETCH: int = _tiermem.PREFETCH


def row_stride(width: int, dtype: str) -> int:
    """Bytes a row of ``width`` values of storage type ``dtype`` takes (rounded up to 4)."""
    return int(_tiermem.table_row_stride(width, dtype))


def access_counts(counts: Any) -> np.ndarray:
    """Per-row query counts (what ``threshold:T`` and ``row:T`` admission compare against) as
    ``uint32``, larger counts held at its maximum; anything but a 1-D array of non-negative
    integers is an :class:`~tiermem.InvalidArgumentError`."""
    c = np.asarray(counts)
    if c.ndim != 1 or c.dtype.kind not in "iu" or (c.size and int(c.min()) < 0):
        raise InvalidArgumentError("counts must be a 1-D array of non-negative integers, one per row")
    return np.ascontiguousarray(np.minimum(c, 2**32 - 1), np.uint32)


#: ``eps`` when none is given: ``torch.optim.Adagrad``'s for ``adagrad``, FBGEMM's otherwise.
_DEFAULT_EPS = {"adagrad": 1e-10}


def _number(what: str, v: Any, low: float = 0.0) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{what} must be a number, got {v!r}") from None
    if not math.isfinite(x) or x < low:
        raise InvalidArgumentError(f"{what} must be a finite number of at least {low}, got {v!r}")
    return x


def _beta(what: str, v: Any) -> float:
    x = _number(what, v)
    if x >= 1.0:
        raise InvalidArgumentError(f"{what} must be in [0, 1), got {v!r}")
    return x


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer a table's backward applies (as ``torch.optim`` and FBGEMM name the
    settings). Every optimizer is lazy: only the rows a step touches move, and the
    step-dependent ones (bias corrections, ``lr_decay``) count the table's steps.

    Attributes:
        name: one of :data:`OPTIMIZERS`:

            * ``sgd``: ``torch.optim.SGD`` without momentum (FBGEMM's ``EXACT_SGD``);
            * ``momentum_sgd``: ``torch.optim.SGD`` with ``momentum`` (no dampening);
            * ``adagrad``: ``torch.optim.Adagrad`` (FBGEMM's ``EXACT_ADAGRAD``);
            * ``rowwise_adagrad``: FBGEMM's ``EXACT_ROWWISE_ADAGRAD``, one accumulator per row;
            * ``adam``: FBGEMM's ``ADAM`` (``torch.optim.SparseAdam`` without weight decay);
            * ``partial_rowwise_adam``: FBGEMM's, the second moment per row;
            * ``lamb``, ``partial_rowwise_lamb``: FBGEMM's LAMB (Adam's step scaled per row
              by ``|w| / |r|``) and its row-wise second-moment variant;
            * ``lars_sgd``: FBGEMM's ``LARS_SGD`` (momentum, a per-row rate
              ``lr * eta * |w| / (|g| + weight_decay * |w|)``).
        lr: learning rate (>= 0).
        eps: added to denominators; ``None`` for the optimizer's usual default (1e-10 for
            ``adagrad``, 1e-8 otherwise).
        lr_decay: ``adagrad``'s learning-rate decay per step.
        initial_accumulator_value: starting value of the optimizer's state.
        nt_stores: write updated rows with non-temporal stores.
        beta1, beta2: the Adam and LAMB family's moment decays (``torch.optim``'s ``betas``).
        weight_decay: weight decay, in each optimizer's own form unless ``weight_decay_mode``
            says: L2 for the SGDs and Adagrads, decoupled for the Adams and LAMBs.
        weight_decay_mode: ``None`` (the optimizer's own form), or one of
            :data:`WEIGHT_DECAY_MODES` (``adagrad`` and ``rowwise_adagrad`` take both, as
            FBGEMM's ``WeightDecayMode.L2``/``DECOUPLE``; others refuse the form they lack).
        momentum: ``momentum_sgd``'s and ``lars_sgd``'s momentum.
        eta: ``lars_sgd``'s trust coefficient.
    """

    name: str = "sgd"
    lr: float = 0.01
    eps: float | None = None
    lr_decay: float = 0.0
    initial_accumulator_value: float = 0.0
    nt_stores: bool = False
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0
    weight_decay_mode: str | None = None
    momentum: float = 0.0
    eta: float = 0.001

    def validate(self) -> OptimizerConfig:
        """This config with numbers as floats, or :class:`~tiermem.InvalidArgumentError`
        naming the setting and why."""
        if self.name not in OPTIMIZERS:
            raise InvalidArgumentError(f"optimizer {self.name!r}: known are {', '.join(OPTIMIZERS)}")
        checked = OptimizerConfig(
            self.name,
            _number("lr", self.lr),
            None if self.eps is None else _number("eps", self.eps),
            _number("lr_decay", self.lr_decay),
            _number("initial_accumulator_value", self.initial_accumulator_value),
            bool(self.nt_stores),
            _beta("beta1", self.beta1),
            _beta("beta2", self.beta2),
            _number("weight_decay", self.weight_decay),
            self._decay_mode(),
            _number("momentum", self.momentum),
            _number("eta", self.eta),
        )
        _tiermem.check_optimizer(checked.native())  # the core's own checks (ranges, forms)
        return checked

    def _decay_mode(self) -> str | None:
        m = self.weight_decay_mode
        if m is not None and m not in WEIGHT_DECAY_MODES:
            raise InvalidArgumentError(f"weight_decay_mode {m!r}: known are None, {', '.join(WEIGHT_DECAY_MODES)}")
        return m

    def native(self) -> tuple[str, bool, list[tuple[str, float]], str | None]:
        """This config as the native update takes it: name, non-temporal stores, every setting
        the core names (``OPTIMIZER_SETTINGS``) with its value, the weight decay mode."""
        values = {**{f.name: getattr(self, f.name) for f in fields(self)}, "eps": self.effective_eps}
        return (
            self.name,
            bool(self.nt_stores),
            [(k, float(values[k])) for k in _tiermem.OPTIMIZER_SETTINGS],
            self.weight_decay_mode,
        )

    @property
    def effective_eps(self) -> float:
        """``eps``, or the optimizer's default."""
        return self.eps if self.eps is not None else _DEFAULT_EPS.get(self.name, 1e-8)

    @classmethod
    def of(cls, optimizer: str | OptimizerConfig = "sgd", **settings: Any) -> OptimizerConfig:
        """A validated config from a config or a name plus keyword settings; unknown keywords
        are refused by name."""
        if isinstance(optimizer, OptimizerConfig):
            if settings:
                raise InvalidArgumentError(f"pass settings in the OptimizerConfig, not also as {sorted(settings)}")
            return optimizer.validate()
        known = {f.name for f in fields(cls)} - {"name"}
        unknown = set(settings) - known
        if unknown:
            raise InvalidArgumentError(f"unknown optimizer settings {sorted(unknown)}; known are {sorted(known)}")
        return cls(str(optimizer), **settings).validate()


#: Spec prefixes of homes that are files, by home kind: ``table:PATH`` a table file read
#: with direct I/O (``block:PATH`` is its older name), ``file:PATH`` a plain file of rows
#: read with buffered I/O.
FILE_HOMES: dict[str, str] = {"table:": "table", "block:": "table", "file:": "file"}

#: The words of ``--slow`` that name a folder of table files (mode ``block``): ``table:DIR``,
#: and ``block:DIR``, its older spelling (``block:PATH`` is otherwise the core's SSD device).
TABLE_DIR_WORDS = ("table:", "block:")


def table_dir(slow: str) -> str | None:
    """The folder of table files ``slow`` names (``table:DIR`` or ``block:DIR``), or None."""
    for w in TABLE_DIR_WORDS:
        if slow.startswith(w):
            return slow[len(w) :]
    return None


@dataclass(frozen=True)
class Placement:
    """Where a table's rows live, and the cache in front of them: one value handed down from
    the torch modules, the DLRM trainer, the sharded tables and the cache plans to the core.

    Attributes:
        device: the base rows' home: a device name or index of the manager, or (without a
            manager) a device spec such as ``"emulated:optane-pmem"``; ``"table:PATH"``, a
            table file on the disk read with direct I/O (created, or re-attached with its
            rows and optimizer state); ``"file:PATH"``, a plain file of rows (row ``i`` at
            byte ``i * row_bytes``, no header, as ``numpy.ndarray.tofile`` writes) read with
            buffered I/O, for file systems without direct I/O; ``None`` for the default.
        cache: ``None`` for a direct table, or ``cachelower`` as a fraction of the table
            (0 < cache <= 1) for a cached one (tables in files need one).
        cacheslack: how far the cache may grow beyond ``cachelower`` (a fraction in [0, 1]).
        policy: one of :data:`CACHE_POLICIES`.
        dtype: storage type, one of :data:`DTYPES` (``torch.`` prefixes are accepted).
        admission: which rows the cache takes in (one of :data:`ADMISSIONS`, some with an
            argument: ``row``, ``row:T``, ``block``, ``threshold:T``, ``shadow:M``,
            ``second``, ``tinylfu``; see :class:`~tiermem.embedding.EmbeddingTable`);
            ``None``: the policy's (``second`` for ``admit``, else ``row``).
        depth: a table file's reads in flight (``None``: the calibrated depth).
        read_only: open an existing ``file:`` home for reading only (a file tiermem did not
            make is only ever opened so).
    """

    device: str | int | None = None
    cache: float | None = None
    cacheslack: float = 0.05
    policy: str = "dynamic"
    dtype: Any = "float32"
    admission: str | None = None
    depth: int | None = None
    read_only: bool = False

    def validate(self) -> Placement:
        """This placement, or :class:`~tiermem.InvalidArgumentError` naming what and why."""
        if self.storage_dtype is None:
            raise InvalidArgumentError(f"dtype {self.dtype!r}: supported are {', '.join(_tiermem.DTYPES)}")
        if self.policy not in CACHE_POLICIES:
            raise InvalidArgumentError(f"policy {self.policy!r}: known are {', '.join(CACHE_POLICIES)}")
        if self.cache is not None and self.policy == "simple":
            raise InvalidArgumentError("policy 'simple' keeps every row on the slow device: pass cache=None")
        if self.cache is not None and not 0 < self.cache <= 1:
            raise InvalidArgumentError(f"cache must be a fraction of the table in (0, 1], got {self.cache!r}")
        if not 0 <= self.cacheslack <= 1:
            raise InvalidArgumentError(f"cacheslack must be a fraction in [0, 1], got {self.cacheslack!r}")
        if self.depth is not None and not (isinstance(self.depth, int) and 1 <= self.depth <= 256):
            raise InvalidArgumentError(f"depth must be from 1 to 256 reads in flight, got {self.depth!r}")
        if self.read_only and self.home != "file":
            raise InvalidArgumentError("read_only opens a 'file:PATH' home; other homes are written as they train")
        path = self.path
        if path is not None:
            if not path:
                raise InvalidArgumentError(f"device {self.device!r} names no file: pass '{self.device}PATH'")
            if self.cache is None:
                raise InvalidArgumentError(
                    f"a table in a file reads its rows through a DRAM cache: pass cache= a fraction of the table "
                    f"(e.g. 0.05) for {path}"
                )
        return self

    @property
    def home(self) -> str:
        """The home's kind: ``table`` or ``file`` for the file specs, else ``memory``."""
        if isinstance(self.device, str):
            for prefix, kind in FILE_HOMES.items():
                if self.device.startswith(prefix):
                    return kind
        return "memory"

    @property
    def path(self) -> str | None:
        """The file of a ``table:``/``file:`` home, else ``None``."""
        if self.home == "memory":
            return None
        assert isinstance(self.device, str)
        return self.device.split(":", 1)[1]

    @property
    def storage_dtype(self) -> str | None:
        """The storage type's canonical name, or ``None`` if unknown."""
        return DTYPES.get(str(self.dtype).replace("torch.", ""))

    def cache_spec(self, table_bytes: int, stride: int, fast: int = 0) -> dict[str, Any] | None:
        """The cache as the core's table constructor takes it, for a table of
        ``table_bytes`` bytes in rows of ``stride`` (a cache holds at least one row)."""
        if self.cache is None:
            return None
        return {
            "fast": fast,
            "lower": max(int(table_bytes * self.cache), stride),
            "slack": int(table_bytes * self.cacheslack),
            "policy": "dynamic" if self.home != "memory" else self.policy,
            "admission": self.admission,
        }
