"""Measured slow-downs of kernels, kept on disk by kernel signature (AutoTM's profile cache,
thesis §3.3: "DNNs typically contain many identical kernels ... profiling for a given DNN
only needs to be performed once").

A capture measures each kernel's extra time with its operands on the slow device (its
all-slow time less its all-fast time, each the best of a few iterations). That difference is
noisy on a shared machine: a 100 ms convolution varies by several milliseconds from run to
run, as much as the slow device adds to it. Kernels with the same signature
(:func:`~tiermem.torch.tensors.tensor.signature`: the op and every argument's shape, strides,
dtype or value) do the same work, so their differences are pooled: within one capture (the
repeated layers of a network) and, through this file, across captures on the same machine
and devices. The mean of the unclipped differences is used (clipping each first would bias it
upwards), and only the mean is clipped at zero.

The file (``tiermem-profiles-1``, JSON, written atomically) holds, per *setup* (the devices,
the PyTorch version and thread count: a profile from another setup does not apply), per
signature, the number of samples and their sum. ``$TIERMEM_PROFILES``
names it; the default is ``~/.cache/tiermem/kernel-profiles.json``. Two captures writing it
at once do not corrupt it (each write replaces it whole); the last one's samples win.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import Any

import torch

from ..._files import check_writable, write_json_atomic
from ..graph import GraphError, read_json

__all__ = ["PROFILES_FORMAT", "KernelProfiles", "default_profiles_path", "setup_key"]

PROFILES_FORMAT = "tiermem-profiles-1"


def default_profiles_path() -> Path:
    env = os.environ.get("TIERMEM_PROFILES")
    return Path(env) if env else Path.home() / ".cache" / "tiermem" / "kernel-profiles.json"


def setup_key(devices: list[str]) -> str:
    """What a profile depends on besides the kernel: the devices, PyTorch's version and its
    thread count. Not the devices' measured bandwidths: without a calibration file they are
    measured afresh by every process and never repeat exactly, and pooling is what smooths
    such run-to-run differences. A device whose name stays while its hardware changes (a
    ``numa:N`` node on another machine) needs its samples removed: delete the file."""
    return f"{';'.join(devices)}|torch {torch.__version__}|threads {torch.get_num_threads()}"


class KernelProfiles:
    """Samples of kernels' slow-downs by signature for one setup, read from and saved to
    ``path`` (None: in memory only, pooling within one capture). A damaged file, or one that
    cannot be written, is refused here, before any recording."""

    def __init__(self, key: str, path: str | Path | None = None) -> None:
        self.key = key
        self.path = None if path is None else Path(path)
        self._doc: dict[str, Any] = {"format": PROFILES_FORMAT, "setups": {}}
        if self.path is not None:
            with contextlib.suppress(OSError):  # check_writable says why, by name
                self.path.parent.mkdir(parents=True, exist_ok=True)
            check_writable(str(self.path), "kernel profile cache")
            if self.path.exists():
                self._doc = _read(self.path)
        self._mine: dict[str, list[float]] = self._doc["setups"].setdefault(key, {})
        #: Signatures found in the file when it was read (before this capture added any).
        self.known = len(self._mine)

    def pooled(self, sig: str) -> tuple[int, float]:
        """``(samples, sum of extra seconds)`` recorded for ``sig``."""
        n, s = self._mine.get(sig, (0, 0.0))
        return int(n), float(s)

    def add(self, sig: str, samples: int, total: float) -> None:
        n, s = self.pooled(sig)
        self._mine[sig] = [n + samples, s + total]

    def save(self) -> None:
        if self.path is not None:
            write_json_atomic(str(self.path), self._doc)


def _read(path: Path) -> dict[str, Any]:
    def bad(why: str) -> GraphError:
        return GraphError(f"kernel profile cache {path}: {why}; delete it (it is rebuilt by the next capture) or name another")

    doc = read_json(path, "kernel profile cache")
    if not isinstance(doc, dict) or doc.get("format") != PROFILES_FORMAT:
        raise bad(f"not a {PROFILES_FORMAT} file")
    setups = doc.get("setups")
    if not isinstance(setups, dict):
        raise bad("no 'setups' object")
    for key, sigs in setups.items():
        if not isinstance(sigs, dict):
            raise bad(f"setup {key!r} is not an object")
        for sig, v in sigs.items():
            ok = (
                isinstance(v, list)
                and len(v) == 2
                and isinstance(v[0], int)
                and v[0] > 0
                and isinstance(v[1], (int, float))
                and math.isfinite(v[1])
            )
            if not ok:
                raise bad(f"the entry for signature {sig[:80]!r} is not [samples > 0, finite seconds]")
    return doc
