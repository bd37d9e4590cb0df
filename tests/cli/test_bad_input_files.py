"""Files a user hands the benches that used to end in a traceback: each is a clear error
naming the file and what is wrong with it (exit status 2), and nothing is written."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tiermem.cli.main import main
from tiermem.embedding.block.traces import Trace


def _traces(d: Path) -> dict[str, tuple[Path, str]]:
    ok = d / "ok.npz"
    Trace(np.array([0, 2, 4], np.int64), np.array([1, 2, 3, 4], np.int64), 10).save(ok)
    data = ok.read_bytes()
    (d / "truncated.npz").write_bytes(data[: len(data) // 2])
    np.save(d / "array.npy", np.arange(5))
    Trace(np.array([0], np.int64), np.array([], np.int64), 10).save(d / "zero.npz")
    Trace(np.array([0, 2], np.int64), np.array([1, 2], np.int64), 10).save(d / "one.npz")
    return {
        "truncated": (d / "truncated.npz", "not a readable .npz"),
        "npy": (d / "array.npy", r"a single array \(.npy\)"),
        "zero": (d / "zero.npz", "0 queries; bench ssd needs at least 2"),
        "one": (d / "one.npz", "1 queries; bench ssd needs at least 2"),
        "missing": (d / "missing.npz", "no such file"),
        "folder": (d, "a folder"),
    }


@pytest.mark.parametrize("case", ["truncated", "npy", "zero", "one", "missing", "folder"])
def test_bench_ssd_names_a_bad_trace_file(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, message = _traces(tmp_path)[case]
    out = tmp_path / "out.json"
    assert main(["bench", "ssd", "--quick", "--trace", str(path), "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and re.search(message, err), err
    assert "Traceback" not in err and not out.exists()


def test_bench_criteo_names_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "criteo", "--quick", "--file", str(tmp_path / "day_0.tsv")]) == 2
    err = capsys.readouterr().err
    assert "day_0.tsv" in err and "does not exist" in err and "Traceback" not in err
    assert main(["bench", "criteo", "--quick", "--file", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
