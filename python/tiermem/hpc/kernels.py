"""Bandwidth-critical HPC kernels over tiered arrays, in the core (Rust, parallel): HPCC
RandomAccess, PTRANS, Jacobi 2D and 3D, CG's sparse matrix-vector product (CRS), an FFT,
and unblocked DGEMM.

Each factory allocates the kernel's arrays on a manager (``where``: any place
:meth:`Manager.array` takes), fills its inputs, and returns a :class:`Kernel`::

    m = tiermem.Manager({"dram": "256 MiB", "emulated:optane-pmem": "2 GiB"}, "lru_in_place")
    k = kernels.jacobi(m, (2048, 2048), sweeps=1, where="slow")
    k.run()                                  # one run, at the slow device's speed
    report = k.staged("pattern_aware", line)  # sample, decide, maybe stage (tiermem.hpc.staging)

A kernel reaches its arrays only through guards, and charges each array's traffic (lines
read and written, misses its prefetcher model cannot hide) to the device the array lives on,
so on an ``emulated`` device it runs at that device's speed (see ``ARCHITECTURE.md``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from statistics import median
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _tiermem
from ..exceptions import InvalidArgumentError

if TYPE_CHECKING:  # pragma: no cover
    from ..array import TieredArray
    from ..manager import Manager
    from .staging import BreakEven

__all__ = ["Kernel", "random_access", "ptrans", "jacobi", "spmv", "spmv_chunks", "run_chunks", "fft", "dgemm", "probe", "KERNELS"]

#: ``name -> (objects, parameters)`` of every kernel the core builds.
KERNELS: dict[str, tuple[list[str], list[str]]] = {k: (list(o), list(p)) for k, o, p in _tiermem.HPC_KERNELS}

#: Probe orders, as the core numbers them.
PROBE_ORDERS = ("random", "strided", "sequential")


class Kernel:
    """A core kernel bound to its tiered arrays (``arrays``, by operand name)."""

    def __init__(self, manager: Manager, kind: str, arrays: dict[str, TieredArray], params: dict[str, int]) -> None:
        self.manager = manager
        self.kind = kind
        self.arrays = arrays
        self.params = params
        self._native = _tiermem.Kernel(manager._native, kind, {k: a.id for k, a in arrays.items()}, params)

    @property
    def name(self) -> str:
        return str(self._native.name())

    @property
    def target(self) -> tuple[str, float]:
        """The operand whose staging is decided, and the accesses per element ``U`` one run
        makes to it."""
        i, u = self._native.target()
        return self.operands[i]["name"], float(u)

    @property
    def operands(self) -> list[dict[str, Any]]:
        """Every array the kernel uses: name, object, element bytes, elements, read, write."""
        keys = ("name", "object", "elem_bytes", "len", "read", "write")
        return [dict(zip(keys, o, strict=True)) for o in self._native.operands()]

    def run(self) -> None:
        """One run, charged to the devices its arrays live on."""
        self._native.run()

    def analyse(self, operand: str | None = None) -> dict[str, Any]:
        """``{r_paf, r_sf, r_lf, samples}`` from sampling an operand (default: the target)
        as the kernel's threads access it."""
        names = [o["name"] for o in self.operands]
        name = operand if operand is not None else self.target[0]
        if name not in names:
            raise InvalidArgumentError(f"{self.name} has no operand {name!r} (operands: {names})")
        return dict(self._native.analyse(names.index(name)))

    def staged(self, mode: str, line: BreakEven | None = None, t_th: float = 0.0) -> dict[str, Any]:
        """One run with the target left in place (``"slow_only"``), copied to fast memory
        first (``"always_stage"``), or copied when the sampled pattern says it pays on the
        break-even ``line`` (``"pattern_aware"``, threshold ``t_th`` s/GB). The manager's
        policy must move only when told (``lru_in_place``). Returns the run's report: rates,
        decision, whether it staged, and the seconds of each part."""
        return dict(self._native.staged(mode, json.dumps(line.as_dict()) if line is not None else None, float(t_th)))

    def gains(self, reps: int = 3) -> dict[str, float]:
        """Sensitivity by timing (H2M's profile-based detection): per operand, the seconds a
        run saves with that operand alone in fast memory, the others where they are (the
        median of ``reps`` runs each, against the median with none moved). The arrays start
        on a slower device and end there; the manager's policy must move only when told
        (``lru_in_place``), and fast memory must hold the largest operand."""

        def timed() -> float:
            ts = []
            for _ in range(max(1, reps)):
                t = time.perf_counter()
                self.run()
                ts.append(time.perf_counter() - t)
            return median(ts)

        self.run()  # warm-up
        base = timed()
        out = {}
        for name, arr in self.arrays.items():
            arr.prefetch(force=True)
            if not arr.in_fast:
                raise InvalidArgumentError(f"{self.name}: operand {name!r} ({arr.nbytes} bytes) did not move to fast memory")
            out[name] = base - timed()
            arr.evict()
        return out

    def recommend_traits(self, reps: int = 3) -> dict[str, dict[str, Any]]:
        """Traits per operand from a profile (H2M's profile-based detection): its measured
        ``gain`` (:meth:`gains`), its ``sensitivity`` from its sampled pattern (``latency``
        when its accesses rarely share a page, ``r_paf < 0.5``: each is a miss no prefetcher
        hides; ``bandwidth`` otherwise), the matching ``preferred`` space (``low_lat`` or
        ``hbw``; ``large_cap`` for an operand that gains nothing), and ``priority``, its rank
        by gain per byte (the highest the largest)."""
        gains = self.gains(reps)
        sizes = {o["name"]: o["len"] * o["elem_bytes"] for o in self.operands}
        ranked = sorted(gains, key=lambda n: gains[n] / sizes[n])
        out = {}
        for rank, name in enumerate(ranked, start=1):
            latency = self.analyse(name)["r_paf"] < 0.5
            out[name] = {
                "preferred": ("low_lat" if latency else "hbw") if gains[name] > 0 else "large_cap",
                "sensitivity": "latency" if latency else "bandwidth",
                "priority": rank,
                "gain": max(0.0, gains[name]),
            }
        return out

    def free(self) -> None:
        """Free every array."""
        for a in self.arrays.values():
            a.free()

    def __repr__(self) -> str:
        return f"Kernel({self.name}, {self.params})"


def run_chunks(tasks: Sequence[Kernel], mode: str, line: BreakEven | None = None, t_th: float = 0.0) -> dict[str, Any]:
    """The chunked staging executor (Arima & Schulz §2.2 and Fig. 10-11): data divided into
    chunks, each the target of its own task (a :class:`Kernel`, such as :func:`spmv_chunks`
    makes), run in turn. For each chunk: decide (in
    ``pattern_aware`` mode, by sampling that chunk's own accesses), copy it in (not for a
    chunk the task only writes), run the task, then copy it back (or drop it, for a chunk
    the task only read). Fast memory need hold one chunk at a time; a chunk larger than fast
    memory runs where it is, its report's ``fallback`` saying so. ``mode`` and ``line`` as
    :meth:`Kernel.staged`.

    Returns ``{"chunks": [each chunk's report], "staged": chunks staged, "seconds",
    "analysis_seconds", "copy_seconds", "kernel_seconds"}`` (sums over the chunks)."""
    if not tasks:
        raise InvalidArgumentError("run_chunks: no tasks (one per chunk) given")
    reports = [k.staged(mode, line, t_th) for k in tasks]

    def total(key: str) -> float:
        return float(sum(r[key] for r in reports))

    return {
        "chunks": reports,
        "staged": sum(bool(r["staged"]) for r in reports),
        "seconds": total("seconds"),
        "analysis_seconds": total("analysis_seconds"),
        "copy_seconds": total("copy_in_seconds") + total("copy_back_seconds"),
        "kernel_seconds": total("kernel_seconds"),
    }


def _filled(m: Manager, data: np.ndarray, where: str | int) -> TieredArray:
    arr = m.array(data.shape, data.dtype, where=where)
    with arr.write(overwrite=True) as v:
        v[...] = data
    return arr


def _places(where: str | int | dict[str, str | int], names: tuple[str, ...]) -> dict[str, str | int]:
    """One place for every array, or a place per array name (all of them)."""
    if not isinstance(where, dict):
        return dict.fromkeys(names, where)
    if set(where) != set(names):
        raise InvalidArgumentError(f"where= needs a place for each of {list(names)}, got {sorted(where)}")
    return where


def _pow2(what: str, n: int, least: int = 2) -> int:
    if n < least or n & (n - 1):
        raise InvalidArgumentError(f"{what} must be a power of two of at least {least}, got {n}")
    return int(n)


def random_access(m: Manager, length: int, updates: int | None = None, where: str | int = "slow") -> Kernel:
    """HPCC RandomAccess over a ``uint64`` table of ``length`` (a power of two) entries
    ``table[i] = i``; ``updates`` (a multiple of 128) defaults to HPCC's ``4 * length``."""
    n = _pow2("RandomAccess length", length)
    table = _filled(m, np.arange(n, dtype=np.uint64), where)
    return Kernel(m, "random_access", {"table": table}, {"len": n, "updates": int(updates if updates is not None else 4 * n)})


def ptrans(m: Manager, n: int, where: str | int = "slow", seed: int = 0) -> Kernel:
    """HPCC PTRANS ``c = a.T + b`` over random ``n x n`` matrices."""
    rng = np.random.default_rng(seed)
    arrays = {"a": _filled(m, rng.random((n, n)), where), "b": _filled(m, rng.random((n, n)), where)}
    arrays["c"] = m.array((n, n), np.float64, where=where)
    return Kernel(m, "ptrans", arrays, {"n": int(n)})


def jacobi(m: Manager, dims: tuple[int, ...], sweeps: int = 1, where: str | int = "slow", seed: int = 0) -> Kernel:
    """Jacobi sweeps over a random grid of ``dims`` (``(ny, nx)`` or ``(nz, ny, nx)``):
    sweep ``k`` averages the stencil of one grid into the other (``u -> v``, ``v -> u``, ...)."""
    if len(dims) not in (2, 3):
        raise InvalidArgumentError(f"Jacobi dims must be (ny, nx) or (nz, ny, nx), got {dims}")
    rng = np.random.default_rng(seed)
    arrays = {"u": _filled(m, rng.random(dims), where), "v": m.array(dims, np.float64, where=where)}
    params = dict(zip(("nz", "ny", "nx")[3 - len(dims) :], (int(d) for d in dims), strict=True))
    return Kernel(m, f"jacobi{len(dims)}d", arrays, {**params, "sweeps": int(sweeps)})


def _crs(matrix: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """``(rowptr, cols, ncols)`` of a CRS triple or a SciPy CSR matrix, checked."""
    if hasattr(matrix, "indptr"):
        rowptr, cols, ncols = matrix.indptr, matrix.indices, matrix.shape[1]
    else:
        rowptr, cols, ncols = matrix
    rowptr = np.asarray(rowptr, dtype=np.uint64)
    cols = np.asarray(cols)
    if cols.size and (cols.min() < 0 or cols.max() >= ncols):
        raise InvalidArgumentError(f"SpMV column indices must lie in [0, {ncols}), got [{cols.min()}, {cols.max()}]")
    return rowptr, cols, int(ncols)


def spmv(m: Manager, matrix: Any, reps: int = 1, where: str | int | dict[str, str | int] = "slow", seed: int = 0) -> Kernel:
    """``y = A x``, ``reps`` times, for a CRS ``matrix``: a ``(rowptr, cols, ncols)`` triple
    (as :func:`tiermem.hpc.matrices.generate` makes) or anything with ``indptr``, ``indices`` and
    ``shape`` (a SciPy CSR matrix). Values and ``x`` are random; ``where`` may give each of
    ``rowptr``, ``cols``, ``vals``, ``x``, ``y`` its own place."""
    return spmv_chunks(m, matrix, 1, reps, where, seed)[0]


def spmv_chunks(
    m: Manager, matrix: Any, chunks: int, reps: int = 1, where: str | int | dict[str, str | int] = "slow", seed: int = 0
) -> list[Kernel]:
    """The paper's chunked SpMV (its CG and decision suite): one matrix and ``chunks``
    source vectors, each a chunk of its own array; kernel ``k`` computes ``y_k = A x_k``
    (``reps`` times). The kernels share the matrix's arrays; ``where`` as :func:`spmv`'s
    (every ``x_k`` and ``y_k`` where ``x`` and ``y`` go). Run them through
    :func:`run_chunks`; freeing each frees the shared arrays once."""
    if chunks < 1:
        raise InvalidArgumentError(f"SpMV needs at least one chunk (source vector), got {chunks}")
    rowptr, cols, ncols = _crs(matrix)
    places = _places(where, ("rowptr", "cols", "vals", "x", "y"))
    rng = np.random.default_rng(seed)
    rows, nnz = len(rowptr) - 1, len(cols)
    shared = {
        "rowptr": _filled(m, rowptr, places["rowptr"]),
        "cols": _filled(m, cols.astype(np.uint32), places["cols"]),
        "vals": _filled(m, rng.random(nnz), places["vals"]),
    }
    params = {"rows": rows, "ncols": ncols, "nnz": nnz, "reps": int(reps)}
    return [
        Kernel(
            m,
            "spmv",
            {**shared, "x": _filled(m, rng.random(ncols), places["x"]), "y": m.array(rows, np.float64, where=places["y"])},
            params,
        )
        for _ in range(chunks)
    ]


def fft(m: Manager, n: int, where: str | int = "slow", seed: int = 0) -> Kernel:
    """An in-place forward FFT (``numpy.fft.fft``'s convention) of ``n`` (a power of two)
    random complex points, stored as ``complex128``."""
    n = _pow2("FFT length", n)
    rng = np.random.default_rng(seed)
    data = _filled(m, rng.random(n) + 1j * rng.random(n), where)
    return Kernel(m, "fft", {"data": data}, {"n": n})


def dgemm(m: Manager, n: int, where: str | dict[str, str | int] = "slow", seed: int = 0) -> Kernel:
    """Unblocked ``c += a @ b`` for random ``n x n`` matrices, ``c`` starting at zero;
    ``where`` may give each of ``a``, ``b``, ``c`` its own place."""
    places = _places(where, ("a", "b", "c"))
    rng = np.random.default_rng(seed)
    arrays = {
        "a": _filled(m, rng.random((n, n)), places["a"]),
        "b": _filled(m, rng.random((n, n)), places["b"]),
        "c": m.array((n, n), np.float64, where=places["c"], fill=0.0),
    }
    return Kernel(m, "dgemm", arrays, {"n": int(n)})


def probe(m: Manager, length: int, order: str, read: bool, write: bool, where: str | int = "slow") -> Kernel:
    """A calibration probe: touch every element of a ``uint64`` array of ``length`` (a power
    of two, at least 4096) once, in ``order`` (``random``, ``strided``, ``sequential``)."""
    if order not in PROBE_ORDERS:
        raise InvalidArgumentError(f"probe order {order!r}: use one of {PROBE_ORDERS}")
    n = _pow2("probe length", length, 4096)
    data = m.array(n, np.uint64, where=where, fill=0)
    return Kernel(
        m, "probe", {"data": data}, {"len": n, "order": PROBE_ORDERS.index(order), "read": int(read), "write": int(write)}
    )
