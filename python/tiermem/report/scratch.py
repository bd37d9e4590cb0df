"""Where block-device scratch files go: a directory on a disk, never tmpfs."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

_MEMORY_FS = {"tmpfs", "ramfs"}


def fs_type(path: str | os.PathLike[str]) -> str:
    """File-system type of ``path`` from /proc/mounts (longest matching mount point)."""
    p = os.path.realpath(path)
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    mnt = parts[1].replace("\\040", " ")
                    if (p == mnt or p.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                        best, kind = mnt, parts[2]
    except OSError:
        pass
    return kind


def scratch_dir(requested: str | None = None) -> Path:
    """``requested`` if given; else the temp dir if it is on a disk; else ~/.cache/tiermem."""
    if requested:
        d = Path(requested)
    else:
        d = Path(tempfile.gettempdir())
        if fs_type(d) in _MEMORY_FS:
            d = Path.home() / ".cache" / "tiermem" / "scratch"
    d.mkdir(parents=True, exist_ok=True)
    return d
