"""The `tiermem` command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tiermem.cli.main import main


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tiermem.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def test_info_report_and_json() -> None:
    out = run("info")
    assert out.returncode == 0, out.stderr
    for word in ("dram", "emulated:optane-pmem", "emulated:cxl", "NUMA topology", "block:PATH"):
        assert word in out.stdout
    data = json.loads(run("info", "--json").stdout)
    names = {d["name"] for d in data["devices"]}
    assert {"dram", "emulated:optane-pmem", "emulated:cxl"} <= names
    assert all(d["real"] in ("real", "emulated") for d in data["devices"])
    assert data["topology"]["nodes"][0]["distances"]


def test_bench_copy_json_schema(tmp_path: Path, disk_dir: Path) -> None:
    f = tmp_path / "copy.json"
    out = run(
        "bench",
        "copy",
        "--quick",
        "--max-size",
        "1 MiB",
        "--json",
        str(f),
        "--devices",
        "dram",
        "emulated:cxl",
        f"block:{disk_dir}/b.bin",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(f.read_text())
    assert data["devices"]["emulated:cxl"] == "emulated" and data["devices"]["dram"] == "real"
    rows = data["rows"]
    assert len(rows) == 9 * len({r["size"] for r in rows})
    for r in rows:
        assert {"src", "dst", "size", "gbps", "baselines"} <= set(r)
        assert set(r["baselines"]) == {"memcpy_1t", "memcpy_mt", "numpy"}
        assert r["gbps"] > 0 and all(v > 0 for v in r["baselines"].values())
    assert "(emulated)" in out.stdout and "tiermem / faster memcpy" in out.stdout
    by_pair = {(r["src"], r["dst"]): r for r in rows}
    assert by_pair[("dram", "emulated:cxl")]["profile_gbps"] > 0
    assert by_pair[("dram", "dram")]["profile_gbps"] is None
    assert by_pair[("dram", f"block:{disk_dir}/b.bin")]["profile_gbps"] is None
    assert by_pair[("dram", "dram")]["vs_memcpy"] > 0
    assert by_pair[("dram", "emulated:cxl")]["vs_memcpy"] is None
    assert not (disk_dir / "b.bin").exists()


def test_calibrate_keeps_figures_that_info_reads(tmp_path: Path, disk_dir: Path) -> None:
    cal = tmp_path / "cal.json"
    env = {"TIERMEM_CALIBRATION": str(cal), "TIERMEM_PROGRESS": "1"}
    out = run("calibrate", "--quick", "--size", "8 MiB", "--dir", str(disk_dir), env=env)
    assert out.returncode == 0, out.stderr
    assert "calibrate [" in out.stderr  # the progress bar
    data = json.loads(cal.read_text())
    assert data["dram"]["source"] == "calibrated" and data["dram"]["read_gbps"] > 0
    assert "emulated:optane-pmem" in data["devices"] and any(k.startswith("block:") for k in data["devices"])
    assert data["copy"] and all(c["gbps"] > 0 for c in data["copy"])
    info = json.loads(run("info", "--json", env=env).stdout)
    assert info["calibrated"] and info["dram"]["source"] == "calibrated"
    assert any(d["name"].startswith("block:") for d in info["devices"])


def test_errors_are_reported_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "copy", "--quick", "--devices", "dram", "hbm:0", "--max-size", "4KiB"]) == 2
    assert "error" in capsys.readouterr().err
    assert main(["calibrate", "--size", "64 KiB"]) == 2
    assert "at least 1 MiB" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # argparse's own refusal, before any work
        main(["bench", "plan", "--sizes", "32,1"])
    assert e.value.code == 2 and "every value in '32,1' must be at least 2" in capsys.readouterr().err


def test_bench_train_quick_json_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "not-yet" / "train.json"  # folders are made before the run
    rc = main(
        [
            "bench",
            "train",
            "--quick",
            "--model",
            "vgg",
            "--batch",
            "2",
            "--ratio",
            "8:1",
            "--variants",
            "all-fast,2lm-model,LM",
            "--json",
            str(out),
            "--out",
            str(tmp_path / "plots"),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "ratio 8:1" in text and "emulated" in text and "best tiermem variant" in text
    res = json.loads(out.read_text())
    runs = {r["policy"]: r for r in res["runs"]}
    assert set(runs) == {"all-fast", "2lm-model", "LM"}
    for r in runs.values():
        assert r["model"] == "vgg" and r["ratio"] == "8:1" and r["seconds_per_iter"] > 0
        assert set(r["bytes"]) == {"dram", "emulated:optane-pmem"}
        assert r["max_loss_diff"] < 1e-5
    assert runs["LM"]["fast_bytes_peak"] <= runs["LM"]["budget_bytes"]
    assert runs["2lm-model"]["bytes"]["emulated:optane-pmem"]["written"] > 0
    # The model that fits: all-fast against plain PyTorch, as a ratio and a line.
    assert res["models"]["vgg"]["fits_vs_pytorch"] > 0 and "fits in fast memory (all-fast" in text
    assert (tmp_path / "plots" / "vgg-time-vs-budget.png").exists() and (tmp_path / "plots" / "vgg-bytes.png").exists()


def test_an_output_folder_that_cannot_be_made_fails_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["bench", "copy", "--quick", "--json", str(blocker / "sub" / "out.json")]) == 2
    err = capsys.readouterr().err
    assert "cannot create the output folder" in err and "sub" in err


def test_bench_train_bad_ratio_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    assert main(["bench", "train", "--quick", "--ratio", "8to1"]) == 2
    assert "write it SLOW:FAST" in capsys.readouterr().err


def test_train_dlrm_over_two_processes_reports_the_difference_from_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "dist.json"
    args = ["train", "dlrm", "--nproc", "2", "--rows", "300,50", "--dim", "8", "--bottom-mlp", "16-8", "--top-mlp", "16-1"]
    args += ["--batch-size", "16", "--iters", "6", "--sharding", "row", "--placement", "cached", "--check-single"]
    assert main([*args, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "dlrm over 2 processes, row-wise shards" in text and "largest loss difference from one process" in text
    assert "t0[0:150] t1[0:25]" in text and "t0[150:300] t1[25:50]" in text  # the plan, rank by rank
    res = json.loads(out.read_text())
    assert len(res["losses"]) == 6 and res["max_difference"] <= 1e-5
    assert main([*args[:-1], "--placement", "block", "--slow", "block:" + str(tmp_path / "nowhere")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_train_dlrm_over_two_processes_reads_criteo_parts_with_planned_caches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tiermem.dlrm.data.criteo import write_criteo

    path = tmp_path / "day.tsv"
    write_criteo(path, 400, seed=1)
    rows = ",".join(["60"] * 26)
    args = ["train", "dlrm", "--nproc", "2", "--criteo", str(path), "--rows", rows, "--dim", "8", "--bottom-mlp", "16-8"]
    args += ["--top-mlp", "16-1", "--batch-size", "32", "--iters", "5", "--placement", "cached", "--check-single"]
    assert main([*args, "--fast-budget", "64KiB"]) == 0
    text = capsys.readouterr().out
    assert "predicted hit rate" in text and "largest loss difference from one process over 5 steps" in text
    assert main([*args, "--placement", "dram", "--fast-budget", "64KiB"]) == 2
    assert "keeps every row in DRAM" in capsys.readouterr().err


def test_the_libraries_own_models_are_bench_workloads() -> None:
    """bench tensors --model hf:gpt2 / tv:resnet50: transformers' GPT-2 and torchvision's
    ResNet-50 at the bench's shapes, trained with the bench's inputs and loss."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("torchvision")
    from tiermem.bench.models import build
    from tiermem.bench.tensors import _reference

    for name in ("hf:gpt2", "tv:resnet50"):
        w = build(name, 1)
        x, y = w.inputs(0)
        out = w.make()(x)
        assert isinstance(out, torch.Tensor) and out.shape[-1] == w.classes
        assert w.tokens == (name == "hf:gpt2")
    losses = _reference(build("tv:resnet50", 2), 2, 0)["losses"]
    assert len(losses) == 2 and losses[0] > 0
