"""Shared fixtures: small managers, a disk-backed scratch directory, seeded RNGs."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import tiermem
from tiermem.report.scratch import scratch_dir

# Under pytest-xdist, PyTorch's and OpenMP's thread pools in each worker (and in every process
# a test starts) get the worker's share of the cores, so the workers do not oversubscribe the
# machine. Set before any test imports torch.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture
def disk_dir() -> Iterator[Path]:
    """A fresh directory on a disk file system (block devices refuse tmpfs)."""
    d = scratch_dir() / f"tiermem-test-{os.getpid()}-{os.urandom(4).hex()}"
    d.mkdir(parents=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def two_tier() -> tiermem.Manager:
    """1 MiB of DRAM in front of 16 MiB of emulated CXL memory, LRU policy."""
    return tiermem.Manager({"dram": "1 MiB", "emulated:cxl": "16 MiB"}, policy="lru")


@pytest.fixture(scope="session", autouse=True)
def _dram_measured_once(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The DRAM figures, measured once per test process (about a second and 1.2 GB on a
    machine with a large last-level cache) and kept in the tests' calibration file, so the
    processes the tests start read them for the whole run (a measurement processes share,
    ``calib::shared``, serves only a minute)."""
    from tiermem import _tiermem
    from tiermem._files import write_json_atomic

    path = tmp_path_factory.getbasetemp() / "calibration.json"
    os.environ["TIERMEM_CALIBRATION"] = str(path)
    if not path.exists():
        write_json_atomic(path, {"version": 1, "dram": {**_tiermem.dram_figures(), "source": "calibrated"}})


@pytest.fixture(autouse=True)
def _calibration_isolated(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never read or write the user's calibration file or kernel profile cache."""
    monkeypatch.setenv("TIERMEM_CALIBRATION", str(tmp_path_factory.getbasetemp() / "calibration.json"))
    monkeypatch.setenv("TIERMEM_PROFILES", str(tmp_path_factory.getbasetemp() / "kernel-profiles.json"))


@pytest.fixture
def small_resnet(monkeypatch: pytest.MonkeyPatch) -> None:
    """``resnet`` as a two-stage ResNet of two bottlenecks each on 32x32 inputs, for tests that
    run whole commands (``plan``, ``bench plan``) on it: the same kinds of kernels, repeated
    blocks included, in a fraction of the full workload's kernels and time."""
    from tiermem.bench import models

    small = models.Workload("resnet", lambda: models.ResNet((2, 2), width=8, classes=10), 64, (3, 32, 32), 10)
    monkeypatch.setitem(models.WORKLOADS, "resnet", small)
