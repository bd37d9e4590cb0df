"""Row-access traces of embedding tables: a query-structured generator, and the file format
layouts and caches are trained on and measured with.

A trace is a sequence of *queries* (what one request to a recommendation model looks up in
one table), each a list of row ids. The generator models what makes layouts and block
caches pay (Bandana §3-4): rows are used in **co-accessed groups** (the items of one user's
or one session's interests), groups and the rows within them have **Zipf popularity**, a
query draws a few groups and a few rows from each, some lookups are **noise** (uniform over
the table), and popularity **drifts** over time (group ranks rotate), so a layout trained on
the start of a trace meets a slightly different end.

File format: an ``.npz`` with ``offsets`` (int64, query starts; the last entry is the number
of lookups), ``rows`` (int64 row ids) and ``rows_total`` (int64 scalar, the table's rows).
:meth:`Trace.load` checks every field and names what is wrong; nothing is unpickled.
"""

from __future__ import annotations

import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..._files import atomic_write
from ...exceptions import InvalidArgumentError

__all__ = ["Trace", "QueryTraceConfig", "query_trace", "group_embeddings", "groups_layout"]


@dataclass(frozen=True)
class Trace:
    """Queries of row ids over a table of ``rows_total`` rows."""

    offsets: np.ndarray
    rows: np.ndarray
    rows_total: int

    @property
    def queries(self) -> int:
        return len(self.offsets) - 1

    def query(self, q: int) -> np.ndarray:
        """The rows query ``q`` looks up."""
        return self.rows[self.offsets[q] : self.offsets[q + 1]]

    def split(self, fraction: float) -> tuple[Trace, Trace]:
        """The first ``fraction`` of the queries and the rest (train on one, measure on the
        other)."""
        if not 0 < fraction < 1:
            raise InvalidArgumentError(f"the split fraction must be in (0, 1), got {fraction!r}")
        k = max(1, min(self.queries - 1, int(self.queries * fraction)))
        cut = int(self.offsets[k])
        a = Trace(self.offsets[: k + 1].copy(), self.rows[:cut].copy(), self.rows_total)
        b = Trace(self.offsets[k:] - cut, self.rows[cut:].copy(), self.rows_total)
        return a, b

    def save(self, path: str | Path) -> None:
        """Write the trace to ``path`` (``.npz``), atomically."""
        with atomic_write(str(path)) as f:
            np.savez(f, offsets=self.offsets, rows=self.rows, rows_total=np.int64(self.rows_total))

    @staticmethod
    def load(path: str | Path) -> Trace:
        """Read and check a trace file; a malformed one is an
        :class:`~tiermem.InvalidArgumentError` naming the file and the field."""

        def bad(what: str) -> InvalidArgumentError:
            return InvalidArgumentError(f"trace file {str(path)!r}: {what}")

        try:
            with open(path, "rb") as fh:  # numpy leaves its own handle open when a zip is damaged
                loaded = np.load(fh, allow_pickle=False)
                if not isinstance(loaded, np.lib.npyio.NpzFile):
                    raise bad("a single array (.npy), not a trace (.npz with offsets, rows and rows_total)")
                with loaded as z:
                    fields = {k: z[k] for k in z.files}
        except InvalidArgumentError:
            raise
        except FileNotFoundError:
            raise bad("no such file") from None
        except IsADirectoryError:
            raise bad("a folder, not a trace file") from None
        except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile) as e:  # damaged, or pickled objects
            raise bad(f"not a readable .npz without pickled objects ({type(e).__name__}: {e})") from None
        for k in ("offsets", "rows", "rows_total"):
            if k not in fields:
                raise bad(f"no {k!r} array (it has {sorted(fields)})")
        offsets, rows, total = fields["offsets"], fields["rows"], fields["rows_total"]
        for k, a, nd in (("offsets", offsets, 1), ("rows", rows, 1), ("rows_total", total, 0)):
            if a.dtype != np.int64 or a.ndim != nd:
                raise bad(f"{k} must be a {nd}-D int64 array, not {a.ndim}-D {a.dtype}")
        n = int(total)
        if n <= 0:
            raise bad(f"rows_total is {n}; a table has at least one row")
        if len(offsets) < 1 or offsets[0] != 0:
            raise bad("offsets must start at 0")
        steps = np.diff(offsets)
        if (steps < 0).any():
            q = int(np.argmax(steps < 0))
            raise bad(f"offsets decrease at query {q} ({int(offsets[q])} then {int(offsets[q + 1])})")
        if int(offsets[-1]) != len(rows):
            raise bad(f"the last offset is {int(offsets[-1])} but there are {len(rows)} rows")
        out = (rows < 0) | (rows >= n)
        if out.any():
            p = int(np.argmax(out))
            raise bad(f"rows[{p}] = {int(rows[p])} is outside the table's {n} rows")
        return Trace(offsets, rows, n)


@dataclass(frozen=True)
class QueryTraceConfig:
    """Parameters of :func:`query_trace` (defaults: a 1M-row table, 100k queries).

    Attributes:
        rows: rows in the table.
        queries: queries in the trace.
        group_size: rows per co-access group (the table is cut into ``rows / group_size``
            groups of rows scattered over the table).
        groups_per_query: groups one query draws from (Poisson mean, at least 1).
        rows_per_group: rows a query looks up in each group it draws (Poisson mean, at least 1).
        group_alpha: Zipf exponent of group popularity.
        row_alpha: Zipf exponent of row popularity within a group.
        noise: share of lookups uniform over the whole table.
        drift: share of the group popularity ranks that rotate over the trace (0: none).
        seed: the generator's seed; the same config gives the same trace.
    """

    rows: int = 1_000_000
    queries: int = 100_000
    group_size: int = 64
    groups_per_query: float = 3.0
    rows_per_group: float = 6.0
    group_alpha: float = 1.05
    row_alpha: float = 0.9
    noise: float = 0.05
    drift: float = 0.1
    seed: int = 0

    def validate(self) -> QueryTraceConfig:
        """This config, or :class:`~tiermem.InvalidArgumentError` naming what and why."""
        for k in ("rows", "queries", "group_size"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InvalidArgumentError(f"{k} must be a positive integer, got {v!r}")
        if self.group_size > self.rows:
            raise InvalidArgumentError(f"group_size {self.group_size} is larger than the table's {self.rows} rows")
        for k in ("groups_per_query", "rows_per_group", "group_alpha", "row_alpha"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InvalidArgumentError(f"{k} must be a positive number, got {v!r}")
        for k in ("noise", "drift"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and 0 <= v <= 1):
                raise InvalidArgumentError(f"{k} must be in [0, 1], got {v!r}")
        return self


def _zipf_cdf(n: int, alpha: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** alpha
    c = np.cumsum(w)
    return c / c[-1]


def _members(cfg: QueryTraceConfig, rng: np.random.Generator) -> tuple[int, np.ndarray]:
    """The co-access groups: ``groups`` rows of ``group_size`` row ids, scattered over the
    table (so a layout has something to find)."""
    groups = max(1, cfg.rows // cfg.group_size)
    return groups, rng.permutation(cfg.rows)[: groups * cfg.group_size].reshape(groups, cfg.group_size)


def group_embeddings(config: QueryTraceConfig, dim: int, spread: float = 0.5) -> np.ndarray:
    """Rows of a table as a trained model would leave them for :func:`query_trace`'s
    queries: each co-access group's rows near a random centre (Gaussian, ``spread`` times the
    centres' scale), rows in no group anywhere. What semantic (K-means) layouts cluster on;
    float32, ``(rows, dim)``."""
    cfg = config.validate()
    if dim < 1 or not spread >= 0:
        raise InvalidArgumentError(f"dim must be >= 1 and spread >= 0, got {dim!r} and {spread!r}")
    groups, members = _members(cfg, np.random.default_rng(cfg.seed))
    rng = np.random.default_rng(cfg.seed + 1)
    out = rng.standard_normal((cfg.rows, dim)).astype(np.float32)
    centres = rng.standard_normal((groups, dim)).astype(np.float32)
    noise = spread * rng.standard_normal((groups, cfg.group_size, dim)).astype(np.float32)
    out[members.reshape(-1)] = (centres[:, None, :] + noise).reshape(-1, dim)
    return out


def groups_layout(config: QueryTraceConfig, rows_per_block: int) -> np.ndarray:
    """The layout (row → position, ``uint32``) that knows :func:`query_trace`'s hidden
    structure, packed into blocks of ``rows_per_block`` rows: each co-access group's hottest
    rows fill whole blocks of their own, most popular first (so a group's hot rows share its
    first block); the few rows of each group that do not fill a block (its coldest) share
    blocks after them, and rows in no group come last. No trained layout is told the groups:
    it is the reference for how much a layout could gain on the trace (``bench ssd``'s
    ``groups``)."""
    cfg = config.validate()
    if not isinstance(rows_per_block, (int, np.integer)) or isinstance(rows_per_block, bool) or rows_per_block < 1:
        raise InvalidArgumentError(f"rows_per_block must be a positive integer, got {rows_per_block!r}")
    _, members = _members(cfg, np.random.default_rng(cfg.seed))
    whole = cfg.group_size // int(rows_per_block) * int(rows_per_block)
    grouped = np.concatenate([members[:, :whole].reshape(-1), members[:, whole:].reshape(-1)])
    rest = np.setdiff1d(np.arange(cfg.rows), grouped, assume_unique=True)
    out = np.empty(cfg.rows, np.uint32)
    out[np.concatenate([grouped, rest])] = np.arange(cfg.rows, dtype=np.uint32)
    return out


def query_trace(config: QueryTraceConfig | None = None, **overrides: Any) -> Trace:
    """A query-structured trace (see the module docs); ``overrides`` change single fields."""
    cfg = QueryTraceConfig(**{**(config.__dict__ if config else {}), **overrides}).validate()
    rng = np.random.default_rng(cfg.seed)
    groups, members = _members(cfg, rng)
    rank_of = rng.permutation(groups)  # group popularity ranks, rotated by drift
    gcdf = _zipf_cdf(groups, cfg.group_alpha)
    rcdf = _zipf_cdf(cfg.group_size, cfg.row_alpha)
    n_groups = np.maximum(1, rng.poisson(cfg.groups_per_query, cfg.queries))
    offsets = np.zeros(cfg.queries + 1, np.int64)
    chunks: list[np.ndarray] = []
    shift_total = int(cfg.drift * groups)
    for q in range(cfg.queries):
        shift = shift_total * q // max(1, cfg.queries)
        ranks = np.searchsorted(gcdf, rng.random(n_groups[q]))
        gs = rank_of[(ranks + shift) % groups]
        per = np.maximum(1, rng.poisson(cfg.rows_per_group, len(gs)))
        picks = [members[g, np.searchsorted(rcdf, rng.random(k))] for g, k in zip(gs, per)]
        rows = np.concatenate(picks)
        noisy = rng.random(len(rows)) < cfg.noise
        rows[noisy] = rng.integers(0, cfg.rows, int(noisy.sum()))
        chunks.append(rows)
        offsets[q + 1] = offsets[q] + len(rows)
    return Trace(offsets, np.concatenate(chunks).astype(np.int64), cfg.rows)
