"""Paired measurement: two variants in turn, iteration by iteration, same inputs."""

import pytest

pytest.importorskip("torch")

from tiermem.bench.models import build
from tiermem.bench.paired import Side, paired
from tiermem.exceptions import InvalidArgumentError

SLOW = "emulated:optane-pmem"


def test_pairs_time_both_sides_on_the_same_inputs() -> None:
    w = build("resnet", 2)
    r = paired(w, Side("all-fast", 1 << 30, 64 << 20), Side("LM", 32 << 20, 1 << 30), SLOW, pairs=3, warmup=1)
    assert (r["a"], r["b"]) == ("all-fast", "LM")
    assert len(r["a_times"]) == len(r["b_times"]) == len(r["ratios"]) == 3
    assert r["ratios"] == [b / a for a, b in zip(r["a_times"], r["b_times"], strict=True)]
    assert r["median"] == sorted(r["ratios"])[1]
    # Both trained the same model on the same inputs: tiering changes no arithmetic.
    assert r["max_loss_diff"] == 0.0


@pytest.mark.parametrize("pairs,warmup", [(0, 1), (2, -1)])
def test_bad_counts_are_refused(pairs: int, warmup: int) -> None:
    w = build("resnet", 2)
    with pytest.raises(InvalidArgumentError, match="pairs must be at least 1"):
        paired(w, Side("all-fast", 1 << 30, 64 << 20), Side("LM", 32 << 20, 1 << 30), SLOW, pairs=pairs, warmup=warmup)
