"""DLRM (the deep learning recommendation model) over tiered embedding tables.

The model follows the public DLRM reference (``facebookresearch/dlrm``): a bottom MLP over
the dense features, one embedding table per sparse feature (sum-pooled bags), a ``dot``
feature interaction (pairwise dot products of the bottom output and the pooled embeddings,
strictly lower triangle, concatenated with the bottom output) or ``cat``, a top MLP ending
in a sigmoid, and binary cross-entropy. Dense layers are plain PyTorch; where the tables
live is the ``mode`` (thesis §5.5-5.6):

- ``reference``: ``torch.nn.EmbeddingBag`` (``sparse=True``) in ordinary memory with
  ``torch.optim.SGD``: the PyTorch way, everything in DRAM, no budget;
- ``all-slow``: every row on the slow device (the thesis's ``simple``);
- ``static`` / ``dynamic``: cached tables (base rows on the slow device, cache pages in the
  fast budget) under that cache policy;
- ``2lm-model``: rows on the slow device behind the model of the hardware DRAM cache, the
  fast budget as its cache (:mod:`tiermem.twolm`).

Every mode starts from the same weights for the same seed, and the tiered modes compute the
same arithmetic, so their loss curves match each other exactly and ``reference`` within float
rounding.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, cast

import numpy as np
import torch

from ..embedding import EmbeddingTable
from ..exceptions import InvalidArgumentError
from ..torch.embedding import TieredEmbeddingBagCollection

__all__ = [
    "DLRMConfig",
    "DLRM",
    "PRESETS",
    "MODES",
    "SLOW_MODES",
    "CACHED_MODES",
    "PROFILED_MODES",
    "DRAM_MODES",
    "ReferenceEmbeddings",
    "initial_rows",
    "table_seed",
    "KAGGLE_ROWS",
    "TERABYTE_ROWS",
]

#: Placement modes of the embedding tables: ``reference`` (torch.nn.EmbeddingBag, every
#: row in DRAM), ``all-fast`` (tiermem's kernels, every row in DRAM: the upper bound),
#: ``fbgemm`` (FBGEMM's CPU table-batched embeddings, every row in DRAM), ``all-slow``
#: (every row on the slow device), ``static``, ``dynamic`` and ``tinylfu`` (cached, rows on
#: the slow device; ``tinylfu`` caches a miss once a sketch of recent accesses has seen the
#: row before, where its simulated cache says that pays), ``auto`` (each table's cache size and policy, or no cache, planned from hit-rate
#: curves of a profile: :mod:`tiermem.embedding.cacheplan`), ``2lm-model`` (behind the
#: model of the hardware DRAM cache) and ``block`` (block tables on the real disk behind a
#: DRAM cache, with the prefetch pipeline).
MODES = ("reference", "all-fast", "fbgemm", "all-slow", "static", "dynamic", "tinylfu", "auto", "2lm-model", "block")
#: Modes whose rows live on a byte-addressable slow device (``--slow``).
SLOW_MODES = ("all-slow", "static", "dynamic", "tinylfu", "auto", "2lm-model")
#: Modes that keep a DRAM cache of rows on a byte-addressable slow device (the tiered modes
#: the demo holds to its clairvoyant bound).
CACHED_MODES = ("static", "dynamic", "tinylfu", "auto")
#: Modes that plan from a profile of the input (its first batches): ``static`` fills its
#: cache with the rows used most, ``dynamic`` and ``tinylfu`` give each table the way with
#: misses its simulated cache says pays (``dynamic``: cache every miss or cache on a second
#: miss; ``tinylfu``: its sketch's admission; a table whose cache would lose gets none and
#: reads its rows where they live: :func:`tiermem.embedding.cacheplan.lookup_policy`),
#: ``auto`` plans every table's cache
#: from hit-rate curves, ``block`` sizes its caches to hold a batch's rows.
PROFILED_MODES = ("static", "dynamic", "tinylfu", "auto", "block")
#: Modes that keep every row in DRAM.
DRAM_MODES = ("reference", "all-fast", "fbgemm")

#: Rows per categorical feature of the Criteo Kaggle (display advertising challenge) data as
#: the DLRM reference preprocesses it: the "small" model's tables.
KAGGLE_ROWS = (
    1460,
    583,
    10131227,
    2202608,
    305,
    24,
    12517,
    633,
    3,
    93145,
    5683,
    8351593,
    3194,
    27,
    14992,
    5461306,
    10,
    5652,
    2173,
    4,
    7046547,
    18,
    15,
    286181,
    105,
    142572,
)
#: Rows per categorical feature of Criteo Terabyte hashed to at most 40 million (MLPerf).
TERABYTE_ROWS = (
    39884406,
    39043,
    17289,
    7420,
    20263,
    3,
    7120,
    1543,
    63,
    38532951,
    2953546,
    403346,
    10,
    2208,
    11938,
    155,
    4,
    976,
    14,
    39979771,
    25641295,
    39664984,
    585935,
    12972,
    108,
    36,
)


@dataclass(frozen=True)
class DLRMConfig:
    """A DLRM's shape.

    Args:
        rows: rows per embedding table (one table per sparse feature).
        dim: row width (thesis "featuresize"); the bottom MLP's last layer must equal it for
            the ``dot`` interaction.
        dense_features: dense inputs per sample (13 for Criteo).
        bottom_mlp: hidden and output widths of the bottom MLP (input width excluded).
        top_mlp: widths of the top MLP (input width excluded; the last must be 1).
        interaction: ``"dot"`` or ``"cat"``.
        bag: lookups per sample per table (synthetic data; Criteo has one).
        batch_size: samples per iteration.
        dtype: storage type of the tables, ``"float32"`` or ``"bfloat16"``.
    """

    rows: tuple[int, ...]
    dim: int
    dense_features: int = 13
    bottom_mlp: tuple[int, ...] = (512, 256, 64)
    top_mlp: tuple[int, ...] = (512, 256, 1)
    interaction: str = "dot"
    bag: int = 1
    batch_size: int = 2048
    dtype: str = "float32"
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        if not self.rows or any(int(r) < 1 for r in self.rows):
            raise InvalidArgumentError(f"every table needs at least one row, got rows={list(self.rows)[:8]}...")
        for what, v in (
            ("dim", self.dim),
            ("dense_features", self.dense_features),
            ("bag", self.bag),
            ("batch_size", self.batch_size),
        ):
            if int(v) < 1:
                raise InvalidArgumentError(f"{what} must be at least 1, got {v}")
        if not self.bottom_mlp or not self.top_mlp or min(self.bottom_mlp + self.top_mlp) < 1:
            raise InvalidArgumentError("the bottom and top MLPs need at least one layer of positive width")
        if self.top_mlp[-1] != 1:
            raise InvalidArgumentError(f"the top MLP must end in width 1 (a click probability), not {self.top_mlp[-1]}")
        if self.interaction not in ("dot", "cat"):
            raise InvalidArgumentError(f"interaction {self.interaction!r}: supported are 'dot' and 'cat'")
        if self.interaction == "dot" and self.bottom_mlp[-1] != self.dim:
            raise InvalidArgumentError(
                f"the dot interaction needs the bottom MLP to end in the row width {self.dim}, not {self.bottom_mlp[-1]}"
            )
        if self.dtype not in ("float32", "bfloat16"):
            raise InvalidArgumentError(f"dtype {self.dtype!r}: supported are float32 and bfloat16")

    @property
    def num_tables(self) -> int:
        return len(self.rows)

    @property
    def row_bytes(self) -> int:
        return -(-self.dim * (4 if self.dtype == "float32" else 2) // 4) * 4

    @property
    def table_bytes(self) -> int:
        """Bytes of every embedding row together."""
        return sum(self.rows) * self.row_bytes

    @property
    def top_input(self) -> int:
        t = self.num_tables + 1
        if self.interaction == "dot":
            return self.dim + t * (t - 1) // 2
        return self.bottom_mlp[-1] + self.num_tables * self.dim

    def dense_parameters(self) -> int:
        n, prev = 0, self.dense_features
        for w in self.bottom_mlp:
            n, prev = n + prev * w + w, w
        prev = self.top_input
        for w in self.top_mlp:
            n, prev = n + prev * w + w, w
        return n

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rows"], d["bottom_mlp"], d["top_mlp"] = list(self.rows), list(self.bottom_mlp), list(self.top_mlp)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DLRMConfig:
        d = dict(d)
        for k in ("rows", "bottom_mlp", "top_mlp"):
            d[k] = tuple(int(x) for x in d[k])
        return cls(**d)

    @classmethod
    def preset(cls, name: str, scale: float = 1.0, dense_scale: float = 1.0, **override: Any) -> DLRMConfig:
        """A named model (``PRESETS``) with its table rows multiplied by ``scale`` and its
        MLP widths (except the row width and the final 1) by ``dense_scale``, so it fits the
        machine at hand; any field can be overridden."""
        if name not in PRESETS:
            raise InvalidArgumentError(f"preset {name!r}: known are {', '.join(PRESETS)}")
        if not scale > 0 or not dense_scale > 0:
            raise InvalidArgumentError(f"scale and dense_scale must be positive, got {scale} and {dense_scale}")
        c = PRESETS[name]
        rows = tuple(max(1, round(r * scale)) for r in c.rows)

        def widths(ws: tuple[int, ...], keep_last: bool) -> tuple[int, ...]:
            out = [max(1, round(w * dense_scale)) for w in ws]
            if keep_last:
                out[-1] = ws[-1]
            return tuple(out)

        c = replace(
            c, rows=rows, bottom_mlp=widths(c.bottom_mlp, c.interaction == "dot"), top_mlp=widths(c.top_mlp, True), name=name
        )
        return replace(c, **override) if override else c


#: The thesis's models. ``small``: the DLRM reference's Kaggle model (Table 5.5, left);
#: ``mlperf``: the MLPerf 2019 training model (Table 5.5, right); ``large``: the
#: benchmarking model of thesis Table 5.6 (64 tables of 6 million rows, 256 wide, 100 lookups per
#: output); ``demo``: Table 5.6's shape cut to 8 tables of 250 000 rows (2 GB) and small MLPs,
#: what ``tiermem demo`` trains.
PRESETS: dict[str, DLRMConfig] = {
    "small": DLRMConfig(
        rows=KAGGLE_ROWS, dim=16, bottom_mlp=(512, 256, 64, 16), top_mlp=(512, 256, 1), batch_size=8192, name="small"
    ),
    "mlperf": DLRMConfig(
        rows=TERABYTE_ROWS,
        dim=128,
        bottom_mlp=(512, 256, 128),
        top_mlp=(1024, 1024, 512, 256, 1),
        batch_size=32768,
        name="mlperf",
    ),
    "large": DLRMConfig(
        rows=(6_000_000,) * 64,
        dim=256,
        bottom_mlp=(2048,) * 7 + (256,),
        top_mlp=(4096,) * 15 + (1,),
        bag=100,
        batch_size=512,
        name="large",
    ),
    "demo": DLRMConfig(
        rows=(250_000,) * 8, dim=256, bottom_mlp=(512, 256), top_mlp=(512, 256, 1), bag=100, batch_size=512, name="demo"
    ),
}


def _mlp(widths: Sequence[int], inp: int, sigmoid_last: bool) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    prev = inp
    for i, w in enumerate(widths):
        lin = torch.nn.Linear(prev, w)
        layers.append(lin)
        last = i == len(widths) - 1
        layers.append(torch.nn.Sigmoid() if last and sigmoid_last else torch.nn.ReLU())
        prev = w
    return torch.nn.Sequential(*layers)


def _init_mlp(mlp: torch.nn.Sequential, g: torch.Generator) -> None:
    # The DLRM reference's initialisation: weights N(0, sqrt(2 / (fan_in + fan_out))),
    # biases N(0, sqrt(1 / fan_out)).
    with torch.no_grad():
        for layer in mlp:
            if isinstance(layer, torch.nn.Linear):
                m, n = layer.in_features, layer.out_features
                layer.weight.normal_(0.0, math.sqrt(2.0 / (m + n)), generator=g)
                layer.bias.normal_(0.0, math.sqrt(1.0 / n), generator=g)


def table_seed(seed: int, table: int) -> int:
    """The seed of table ``table``'s initial rows in a model of seed ``seed``."""
    return (seed + 1) * 1_000_003 + table


def initial_rows(
    rows: int, dim: int, seed: int, chunk: int = 1 << 18, span: tuple[int, int] | None = None
) -> Iterator[tuple[int, np.ndarray]]:
    """The DLRM reference's initial rows, ``U(-sqrt(1/rows), sqrt(1/rows))``, in chunks of
    ``(start, values)``; element ``k`` of the table depends on ``(seed, k)`` only (generated in
    parallel in the core), so every placement starts from the same numbers, and a shard
    (``span``: rows ``lo..hi``) makes its own rows alone."""
    from .. import _tiermem

    bound = math.sqrt(1.0 / rows)
    lo, hi = span if span is not None else (0, rows)
    for start in range(lo, hi, chunk):
        n = min(chunk, hi - start)
        buf = np.empty((n, dim), np.float32)
        _tiermem.uniform_into(buf, -bound, bound, seed, start * dim)
        yield start, buf


class ReferenceEmbeddings(torch.nn.Module):
    """The PyTorch way: one ``torch.nn.EmbeddingBag(mode="sum", sparse=True)`` per table,
    updated by ``torch.optim.SGD`` on sparse gradients (``step()`` after backward)."""

    def __init__(self, config: DLRMConfig, lr: float) -> None:
        super().__init__()
        dt = torch.float32 if config.dtype == "float32" else torch.bfloat16
        # _weight skips EmbeddingBag's own N(0, 1) fill: DLRM writes the initial rows.
        self.bags = torch.nn.ModuleList(
            torch.nn.EmbeddingBag(r, config.dim, mode="sum", sparse=True, _weight=torch.empty(r, config.dim, dtype=dt))
            for r in config.rows
        )
        self.optimizer = torch.optim.SGD(self.bags.parameters(), lr=lr)

    def load_rows(self, table: int, start: int, values: np.ndarray) -> None:
        with torch.no_grad():
            w = cast(torch.nn.EmbeddingBag, self.bags[table]).weight
            w[start : start + len(values)] = torch.from_numpy(values).to(w.dtype)

    def forward(self, indices: Sequence[torch.Tensor], offsets: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.cat([bag(i, o[:-1]) for bag, i, o in zip(self.bags, indices, offsets)], dim=1).float()

    def step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


class TieredEmbeddings(torch.nn.Module):
    """Tiered tables in one collection (optimizer fused into backward)."""

    def __init__(self, tables: Sequence[EmbeddingTable], lr: float) -> None:
        super().__init__()
        self.tables = list(tables)
        self.collection = TieredEmbeddingBagCollection(self.tables, mode="sum", optimizer="sgd", lr=lr)

    def load_rows(self, table: int, start: int, values: np.ndarray) -> None:
        self.tables[table].load(values, start)

    def forward(self, indices: Sequence[torch.Tensor], offsets: Sequence[torch.Tensor]) -> torch.Tensor:
        from ..torch.embedding import _Lookup

        bags = [(i.numpy(), o.numpy()) for i, o in zip(indices, offsets)]
        return _Lookup.apply(self.collection._anchor, self.collection, bags, None)

    def step(self) -> None:
        """Nothing: rows were updated in backward."""


class DLRM(torch.nn.Module):
    """DLRM with a given embedding module (:class:`ReferenceEmbeddings` or
    :class:`TieredEmbeddings`).

    ``forward(dense, indices, offsets)``: ``dense`` is ``(B, dense_features)`` float32;
    ``indices[t]`` / ``offsets[t]`` are table ``t``'s int64 bag indices and ``B + 1`` offsets.
    Returns click probabilities ``(B,)``. :meth:`dense_forward` runs everything after the
    lookup, given the pooled embeddings ``(B, T * dim)``.
    """

    _li: torch.Tensor
    _lj: torch.Tensor

    def __init__(self, config: DLRMConfig, embeddings: Any, seed: int = 0) -> None:
        super().__init__()
        self.config = config
        self.embeddings = embeddings
        g = torch.Generator().manual_seed(seed)
        self.bottom = _mlp(config.bottom_mlp, config.dense_features, sigmoid_last=False)
        self.top = _mlp(config.top_mlp, config.top_input, sigmoid_last=True)
        _init_mlp(self.bottom, g)
        _init_mlp(self.top, g)
        held = getattr(embeddings, "rows_held", lambda t: [(0, config.rows[t])])
        for t, r in enumerate(config.rows):
            for span in held(t):
                for start, values in initial_rows(r, config.dim, table_seed(seed, t), span=span):
                    embeddings.load_rows(t, start, values)
        if config.interaction == "dot":
            n = config.num_tables + 1
            li, lj = torch.tril_indices(n, n, offset=-1)
            self.register_buffer("_li", li, persistent=False)
            self.register_buffer("_lj", lj, persistent=False)

    def dense_parameters(self) -> list[torch.nn.Parameter]:
        return list(self.bottom.parameters()) + list(self.top.parameters())

    def interact(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        if self.config.interaction == "cat":
            return torch.cat([x, emb], dim=1)
        t = torch.cat([x.unsqueeze(1), emb.view(b, self.config.num_tables, self.config.dim)], dim=1)
        z = torch.bmm(t, t.transpose(1, 2))
        return torch.cat([x, z[:, self._li, self._lj]], dim=1)

    def dense_forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        return self.top(self.interact(x, emb)).squeeze(1)

    def forward(self, dense: torch.Tensor, indices: Sequence[torch.Tensor], offsets: Sequence[torch.Tensor]) -> torch.Tensor:
        return self.dense_forward(dense, self.embeddings(indices, offsets))
