"""The copy-contention probe: a share in [0, 1] from real copies beside a real kernel, and its
bad arguments refused by name."""

from __future__ import annotations

import pytest

from tiermem.exceptions import InvalidArgumentError, UnknownDeviceError
from tiermem.plan.torch import copy_contention


def test_the_probe_measures_a_share() -> None:
    s = copy_contention("emulated:optane-pmem", rounds=3, nbytes=1 << 20, kernel_seconds=0.01)
    assert 0.0 <= s <= 1.0


@pytest.mark.parametrize("kw", [{"rounds": 0}, {"nbytes": 0}, {"kernel_seconds": 0.0}, {"kernel_seconds": float("nan")}])
def test_bad_probe_arguments_are_refused(kw: dict) -> None:
    with pytest.raises(InvalidArgumentError, match="copy_contention: rounds, nbytes and kernel_seconds must be positive"):
        copy_contention("emulated:optane-pmem", **kw)


def test_an_unknown_slow_device_is_refused() -> None:
    with pytest.raises(UnknownDeviceError, match="no emulated profile named 'no-such-device'"):
        copy_contention("emulated:no-such-device", rounds=1)
