"""Sparse matrices in CRS with the structures of the matrices Arima & Schulz sample
(Arima & Schulz Table 2, from the SuiteSparse collection), generated so that no download is needed.

Each named matrix gets the structure class of the real one (a 2D or 3D stencil, a 3D finite-
element mesh, a band, a road network, a power-law graph, a circuit, a uniform random graph)
and roughly its nonzeros per row; the sizes are yours. They reproduce the *access patterns*
of ``x[cols]`` in SpMV that the staging decision samples, not the matrices' values::

    rowptr, cols, ncols = matrices.generate("road_usa", ncols=1 << 20)
    rowptr, cols, ncols = matrices.generate("audikw_1", ncols=1 << 20, row_scale=1 / 32)

``row_scale`` keeps the first rows only, as the paper scales rows 1 to 1/32 to vary how
often each ``x`` element is used (``U``).
"""

from __future__ import annotations

import math

import numpy as np

from ..exceptions import InvalidArgumentError

__all__ = ["TABLE2", "STRUCTURES", "generate"]

#: Structure classes.
STRUCTURES = ("stencil2d", "stencil3d", "mesh3d", "banded", "road", "powerlaw", "circuit", "uniform")

#: Arima & Schulz Table 2: each matrix's structure class and (approximate) nonzeros per row.
TABLE2: dict[str, tuple[str, float]] = {
    "2cubes_sphere": ("mesh3d", 16.2),
    "audikw_1": ("mesh3d", 82.3),
    "eu-2005": ("powerlaw", 22.3),
    "europe_osm": ("road", 2.1),
    "F1": ("mesh3d", 44.9),
    "FullChip": ("circuit", 8.9),
    "G_n_pin_pout": ("uniform", 9.9),
    "GL7d20": ("uniform", 29.0),
    "Hamrle3": ("circuit", 3.8),
    "hugebubbles-00020": ("stencil2d", 3.0),
    "HV15R": ("mesh3d", 140.4),
    "offshore": ("mesh3d", 16.3),
    "pkustk14": ("banded", 98.0),
    "poisson3Db": ("stencil3d", 7.0),
    "pre2": ("circuit", 8.8),
    "rajat29": ("circuit", 4.9),
    "road_usa": ("road", 2.4),
    "scircuit": ("circuit", 5.6),
    "soc-sign-epinions": ("powerlaw", 6.5),
    "thermomech_dK": ("banded", 14.0),
    "thermomech_dM": ("banded", 7.0),
    "tmt_unsym": ("stencil2d", 5.0),
    "torso3": ("mesh3d", 17.1),
    "tx2010": ("road", 4.8),
    "wiki-Talk": ("powerlaw", 2.1),
    "wikipedia-20061104": ("powerlaw", 12.6),
}


def _counts(rng: np.random.Generator, rows: int, per_row: float) -> np.ndarray:
    """Nonzeros per row: ``per_row`` on average (the fraction as a coin per row)."""
    base = int(per_row)
    return base + (rng.random(rows) < per_row - base).astype(np.int64)


def _cols(structure: str, row: np.ndarray, slot: np.ndarray, ncols: int, per_row: float, rng: np.random.Generator) -> np.ndarray:
    """Column of each entry from its row and its slot within the row."""
    n = ncols
    if structure == "stencil2d":
        s = max(2, math.isqrt(n))
        offs = np.array([0, 1, -1, s, -s, s + 1, -s - 1], dtype=np.int64)
        return row + offs[slot % len(offs)]
    if structure == "stencil3d":
        s = max(2, round(n ** (1 / 3)))
        offs = np.array([0, 1, -1, s, -s, s * s, -s * s], dtype=np.int64)
        return row + offs[slot % len(offs)]
    if structure == "mesh3d":
        # A node couples to the nodes of its elements: a few neighbouring planes and lines,
        # each a short run of consecutive columns.
        s = max(2, round(n ** (1 / 3)))
        run = 3
        centres = np.array([a * s * s + b * s for a in (0, -1, 1, -2, 2) for b in (0, -1, 1, -2, 2)], dtype=np.int64)
        return row + centres[(slot // run) % len(centres)] + slot % run - 1
    if structure == "banded":
        return row + slot - int(per_row) // 2
    if structure == "road":
        near = rng.integers(-64, 65, size=len(row))
        far = rng.random(len(row)) < 0.1
        return np.where(far, rng.integers(0, n, size=len(row)), row + near).astype(np.int64)
    if structure == "powerlaw":
        # Targets drawn from a Zipf law over a fixed random permutation of the columns: a
        # few hubs, scattered.
        perm = np.random.default_rng(7).permutation(n)
        rank = np.minimum(rng.zipf(1.6, size=len(row)) - 1, n - 1)
        return perm[rank]
    if structure == "circuit":
        near = row + rng.integers(-8, 9, size=len(row))
        anywhere = rng.integers(0, n, size=len(row))
        return np.where(slot == 0, row, np.where(slot % 2 == 1, near, anywhere))
    return rng.integers(0, n, size=len(row))  # uniform


def generate(
    name: str,
    ncols: int,
    row_scale: float = 1.0,
    max_per_row: float | None = None,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, int]:
    """``(rowptr, cols, ncols)`` of a square matrix of ``ncols`` rows with the structure of
    Table 2's ``name`` (or a structure class's name, at 8 nonzeros per row), keeping the
    first ``row_scale`` of its rows; ``max_per_row`` caps the nonzeros per row (to bound
    memory). Columns within a row are sorted and clipped to the matrix."""
    if name in TABLE2:
        structure, per_row = TABLE2[name]
    elif name in STRUCTURES:
        structure, per_row = name, 8.0
    else:
        raise InvalidArgumentError(f"unknown matrix {name!r}: use a name of tiermem.hpc.matrices.TABLE2 or one of {STRUCTURES}")
    if ncols < 64:
        raise InvalidArgumentError(f"a matrix needs at least 64 columns, got {ncols}")
    if not 0 < row_scale <= 1:
        raise InvalidArgumentError(f"row_scale must be in (0, 1], got {row_scale}")
    if max_per_row is not None:
        per_row = min(per_row, float(max_per_row))
    rng = np.random.default_rng(seed)
    rows = max(1, int(ncols * row_scale))
    counts = _counts(rng, rows, per_row)
    if structure == "circuit":  # a few dense rows (supply nets)
        counts[:: max(1, rows // 64)] *= 16
    rowptr = np.zeros(rows + 1, dtype=np.uint64)
    np.cumsum(counts, out=rowptr[1:])
    row = np.repeat(np.arange(rows, dtype=np.int64), counts)
    slot = np.arange(len(row), dtype=np.int64) - np.repeat(rowptr[:-1].astype(np.int64), counts)
    cols = np.clip(_cols(structure, row, slot, ncols, per_row, rng), 0, ncols - 1)
    keys = (row << 32) | cols  # sorts by row, then column
    keys.sort()
    return rowptr, (keys & 0xFFFFFFFF).astype(np.uint32), int(ncols)
