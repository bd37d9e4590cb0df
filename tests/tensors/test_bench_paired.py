"""Paired measurement: two variants in turn, iteration by iteration, same inputs."""

import math

import pytest

pytest.importorskip("torch")

from tiermem.bench.models import build
from tiermem.bench.paired import Side, median_interval, paired
from tiermem.exceptions import InvalidArgumentError

SLOW = "emulated:optane-pmem"


def test_pairs_time_both_sides_on_the_same_inputs() -> None:
    w = build("resnet", 2)
    r = paired(w, Side("all-fast", 1 << 30, 64 << 20), Side("LM", 32 << 20, 1 << 30), SLOW, pairs=3, warmup=1)
    assert (r["a"], r["b"]) == ("all-fast", "LM")
    assert len(r["a_times"]) == len(r["b_times"]) == len(r["ratios"]) == 3
    assert r["ratios"] == [b / a for a, b in zip(r["a_times"], r["b_times"], strict=True)]
    assert r["median"] == sorted(r["ratios"])[1]
    # Three pairs bound the median only by their extremes, three times in four.
    assert r["interval"] == [min(r["ratios"]), max(r["ratios"])] and r["coverage"] == 0.75
    # Both trained the same model on the same inputs: tiering changes no arithmetic.
    assert r["max_loss_diff"] == 0.0


@pytest.mark.parametrize("pairs,warmup", [(0, 1), (2, -1)])
def test_bad_counts_are_refused(pairs: int, warmup: int) -> None:
    w = build("resnet", 2)
    with pytest.raises(InvalidArgumentError, match="pairs must be at least 1"):
        paired(w, Side("all-fast", 1 << 30, 64 << 20), Side("LM", 32 << 20, 1 << 30), SLOW, pairs=pairs, warmup=warmup)


def test_the_median_interval_takes_the_widest_order_statistics_its_level_needs() -> None:
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert median_interval(xs) == (1.0, 5.0, 1 - 2 / 32)
    ten = [float(i) for i in range(10)]
    # k = 2 covers 1 - 2 (1 + 10) / 1024 >= 0.9; k = 3 would cover 0.89.
    assert median_interval(ten) == (1.0, 8.0, 1 - 22 / 1024)
    assert median_interval(ten, 0.85) == (2.0, 7.0, 1 - 112 / 1024)
    assert median_interval([2.0]) == (2.0, 2.0, 0.0)


def test_the_median_interval_covers_the_median_as_often_as_it_says() -> None:
    import random

    rng = random.Random(7)
    for n in (5, 9, 20):
        trials, held, cover = 4000, 0, 0.0
        for _ in range(trials):
            lo, hi, cover = median_interval([rng.expovariate(1.0) for _ in range(n)])
            held += lo <= math.log(2) <= hi  # the exponential's median
        sd = math.sqrt(cover * (1 - cover) / trials)
        assert abs(held / trials - cover) < 4 * sd, (n, held / trials, cover)


@pytest.mark.parametrize("xs,level,what", [([], 0.9, "no values"), ([1.0], 1.0, "level must be"), ([1.0], 0.0, "level must be")])
def test_bad_interval_input_is_refused(xs: list[float], level: float, what: str) -> None:
    with pytest.raises(InvalidArgumentError, match=what):
        median_interval(xs, level)
