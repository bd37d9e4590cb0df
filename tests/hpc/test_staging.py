"""Pattern analysis for staging: the calibration patterns land on their corners of the
(R_sf, R_paf) plane, a CRS matrix's gathers are read as the paper reads them, decisions follow
the break-even line, and bad streams are refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from tiermem.exceptions import InvalidArgumentError
from tiermem.hpc.staging import BreakEven, analyse


def test_calibration_patterns() -> None:
    seq = analyse(np.arange(1 << 20), threads=4)
    assert seq["r_paf"] > 0.99 and seq["r_sf"] > 0.99
    strided = analyse(np.arange(1 << 16) * 1024, threads=4)  # 8 KiB apart
    assert strided["r_paf"] < 0.2 and strided["r_sf"] > 0.99
    rnd = analyse(np.random.default_rng(0).integers(0, 1 << 27, 1 << 16), threads=4)
    assert rnd["r_paf"] < 0.2 and rnd["r_sf"] < 0.2
    assert rnd["samples"] == 4 * 2048


def test_a_banded_matrix_is_dense_and_a_scattered_one_sparse() -> None:
    """SpMV's gathers x[col[k]]: a banded matrix's columns walk along the diagonal, a
    random one's jump."""
    rows, per_row = 1 << 14, 8
    band = (np.arange(rows)[:, None] + np.arange(per_row)[None, :]).ravel()
    scattered = np.random.default_rng(1).integers(0, 1 << 24, rows * per_row)
    b, s = analyse(band, threads=2), analyse(scattered, threads=2)
    assert b["r_paf"] > 0.95 and s["r_paf"] < 0.2
    assert b["r_sf"] > s["r_sf"]


def test_decisions_follow_the_break_even_line() -> None:
    line = BreakEven((2.0, 1.0, 0.1), (2.0, 1.0, 0.1), (3.0, 1.5, 0.2), t_1st=0.5, t_3rd=0.6)
    rnd = {"r_paf": 0.0, "r_sf": 0.0}
    seq = {"r_paf": 1.0, "r_sf": 1.0}
    assert line.decide(rnd, 1.0, True, False)["stage"]
    assert not line.decide(seq, 1.0, True, False)["stage"]
    d = line.decide(rnd, 1.0, True, True)
    assert d["t_boost"] == pytest.approx(3.0) and d["t_copy"] == pytest.approx(1.1)
    assert not line.decide(rnd, 1.0, True, True, t_th=2.0)["stage"]
    assert line.decide(rnd, 0.1, False, True)["t_copy"] == pytest.approx(0.6)  # write-only: no copy in


@pytest.mark.parametrize(
    "call, msg",
    [
        (lambda: analyse(np.array([], dtype=np.int64)), "the index stream is empty"),
        (lambda: analyse(np.array([3])), "at least two addresses"),
        (lambda: analyse(np.array([1, 2, -3, 4])), "index 2 is negative"),
        (lambda: analyse(np.array([0.5, 1.5])), "must be integers"),
        (lambda: analyse(np.arange(10), threads=0), "threads \\(0\\)"),
        (
            lambda: BreakEven((1, 1, 1), (1, 1, 1), (1, 1, 1), 1, 1).decide({"r_paf": 0, "r_sf": 0}, 1.0, False, False),
            "neither reads nor writes",
        ),
        (
            lambda: BreakEven((1, 1, 1), (1, 1, 1), (1, 1, 1), 1, 1).decide({"r_paf": 0, "r_sf": 0}, -1.0, True, False),
            "U must be",
        ),
    ],
)
def test_bad_input_is_refused_by_name(call, msg: str) -> None:
    with pytest.raises(InvalidArgumentError, match=msg):
        call()
