"""TorchRec's own DLRM with tiermem's collection swapped in (torchrec_dlrm_twins.py, in its
own process): the same loss curve as TorchRec over FBGEMM's CPU kernels, with every table in
a table file on the disk, and again after a checkpoint and a rebuilt model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchrec")


def test_torchrecs_dlrm_trains_on_tiermems_tables_with_fbgemms_curve(tmp_path) -> None:
    script = Path(__file__).with_name("torchrec_dlrm_twins.py")
    r = subprocess.run([sys.executable, str(script), str(tmp_path), "30"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    theirs, ours, resumed = res["torchrec_fbgemm"], res["tiermem"], res["resumed"]
    assert len(theirs) == len(ours) == len(resumed) == 30
    assert ours == pytest.approx(theirs, rel=1e-5)
    assert resumed == pytest.approx(ours, rel=1e-6)
    assert sum(theirs[-10:]) < sum(theirs[:10])  # it learns
    for run in ("whole", "first", "resumed"):
        assert sorted(p.name for p in (tmp_path / run).glob("*.tbl")) == ["t_ctx.tbl", "t_item.tbl", "t_user.tbl"]
