"""DLRM end to end: every mode's loss curve against the PyTorch reference, the 2LM model
behind tables, synthetic and Criteo data (bad lines), checkpoints, fit checks, the CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tiermem  # noqa: E402
from tiermem.cli.main import main  # noqa: E402
from tiermem.dlrm.data import CriteoFormatError, CriteoReader, SyntheticData, write_criteo  # noqa: E402
from tiermem.dlrm.model import DRAM_MODES, MODES, PROFILED_MODES, DLRMConfig  # noqa: E402
from tiermem.dlrm.trainer import Trainer  # noqa: E402
from tiermem.embedding import EmbeddingTable  # noqa: E402
from tiermem.twolm import TwoLmModel  # noqa: E402

SMALL = DLRMConfig(rows=(3000, 2000, 5000), dim=16, bottom_mlp=(32, 16), top_mlp=(16, 1), bag=4, batch_size=128)


def _losses(mode: str, dist: str = "zipf", iters: int = 50, config: DLRMConfig = SMALL, disk: Path | None = None) -> list[float]:
    d = SyntheticData(config.rows, config.dense_features, config.batch_size, config.bag, dist=dist, seed=2)
    prof = [d.batch(i) for i in range(3)] if mode in PROFILED_MODES else None
    # Block tables' caches must hold a batch's rows: half the tables here.
    extra: dict[str, Any] = {"slow": f"block:{disk}", "fast_budget": config.table_bytes // 2} if mode == "block" else {}
    t = Trainer(config, mode, lr=0.1, seed=5, profile=prof, **extra)
    r = t.train((d.batch(i) for i in range(iters)), iters)
    if mode not in DRAM_MODES:
        assert r.fast_bytes_peak <= r.fast_budget, (mode, r.fast_bytes_peak, r.fast_budget)
    t.close()
    if disk is not None:
        assert not list(disk.glob("dlrm-*.tmb")), "block mode left its table files"
    return r.losses


@pytest.mark.parametrize("dist", ["uniform", "zipf"])
def test_every_mode_matches_the_reference_loss_curve(dist: str, disk_dir: Path) -> None:
    ref = _losses("reference", dist)
    assert ref[-1] < ref[0], "the loss falls"
    for mode in MODES[1:]:
        got = _losses(mode, dist, disk=disk_dir)
        assert len(got) == len(ref) == 50
        assert max(abs(a - b) for a, b in zip(got, ref)) <= 1e-4, mode


def test_cat_interaction_and_bfloat16_tables_train() -> None:
    c = DLRMConfig(
        rows=(500, 700), dim=32, bottom_mlp=(16, 4), top_mlp=(8, 1), interaction="cat", batch_size=64, dtype="bfloat16"
    )
    a, b = _losses("dynamic", config=c, iters=10), _losses("2lm-model", config=c, iters=10)
    assert a == b  # the tiered modes share their arithmetic exactly


def test_presets_scale_and_report_their_shape() -> None:
    c = DLRMConfig.preset("large", scale=1e-3, dense_scale=0.01)
    assert c.num_tables == 64 and c.rows[0] == 6000 and c.dim == 256 and c.bag == 100
    assert c.bottom_mlp[-1] == 256 and c.top_mlp[-1] == 1
    assert DLRMConfig.preset("small").rows[2] == 10131227
    assert DLRMConfig.from_dict(c.to_dict()) == c


@pytest.mark.parametrize(
    "bad",
    [
        dict(rows=()),
        dict(rows=(10,), dim=0),
        dict(rows=(10,), dim=8, bottom_mlp=(16, 4)),
        dict(rows=(10,), dim=4, bottom_mlp=(4,), top_mlp=(8, 2)),
        dict(rows=(10,), dim=4, bottom_mlp=(4,), interaction="x"),
    ],
)
def test_bad_configs_are_refused(bad: dict) -> None:
    with pytest.raises(tiermem.InvalidArgumentError):
        DLRMConfig(**{"dim": 4, "bottom_mlp": (4,), **bad})


def test_a_model_that_cannot_fit_fails_before_training_with_the_numbers() -> None:
    c = DLRMConfig.preset("mlperf")  # ~40 GB of tables
    with pytest.raises(tiermem.InvalidArgumentError, match=r"need .*GiB.*available memory"):
        Trainer(c, "dynamic")
    with pytest.raises(tiermem.InvalidArgumentError, match="fast budget"):
        Trainer(SMALL, "static", fast_budget=1000)
    with pytest.raises(tiermem.InvalidArgumentError, match="mode"):
        Trainer(SMALL, "hbm")


def test_block_tables_too_small_to_cache_a_batch_and_too_large_for_the_budget_are_refused(disk_dir: Path) -> None:
    # Every table's cache share would hold fewer rows than one batch touches, so each stays in
    # DRAM whole, and together they exceed the budget: refused at once, with the numbers
    # (this used to spin: the share shrank toward zero and never reached it).
    c = DLRMConfig(rows=(600,) * 4, dim=16, bottom_mlp=(8, 16), top_mlp=(4, 1), bag=10, batch_size=64)
    with pytest.raises(tiermem.InvalidArgumentError, match=r"4 of 4 tables .* one batch's rows"):
        Trainer(c, "block", slow=f"block:{disk_dir}", fast_budget=c.table_bytes // 4)
    with pytest.raises(tiermem.InvalidArgumentError, match="pointer tables"):
        Trainer(c, "block", slow=f"block:{disk_dir}", fast_budget=1000)
    assert not list(disk_dir.glob("dlrm-*.tmb"))


def test_a_folder_of_table_files_is_spelt_table_and_block_its_older_name(disk_dir: Path) -> None:
    """``--slow table:DIR`` (the table-file word) and ``block:DIR`` (its older spelling)
    train the same; a slow device spec is not a folder, and a missing folder is named."""
    d = SyntheticData(SMALL.rows, 13, SMALL.batch_size, SMALL.bag, dist="zipf", seed=2)
    losses = []
    for word in ("table", "block"):
        (disk_dir / word).mkdir()
        t = Trainer(SMALL, "block", slow=f"{word}:{disk_dir / word}", fast_budget=SMALL.table_bytes // 2, seed=1)
        t.train((d.batch(i) for i in range(4)), 4)
        assert list((disk_dir / word).glob("dlrm-*.tmb"))
        losses.append(t.losses)
        t.close()
    assert losses[0] == losses[1]
    with pytest.raises(tiermem.InvalidArgumentError, match="mode 'block' keeps its tables in files"):
        Trainer(SMALL, "block", slow="emulated:optane-pmem")
    with pytest.raises(tiermem.InvalidArgumentError, match=r"--slow table:.*nowhere: no such directory"):
        Trainer(SMALL, "block", slow=f"table:{disk_dir / 'nowhere'}", fast_budget=SMALL.table_bytes // 2)


@pytest.mark.parametrize("mode", ["dynamic", "dynamic+prefetch", "block"])
def test_checkpoint_resume_continues_the_same_curve(tmp_path, disk_dir: Path, mode: str) -> None:
    """Interrupted at batch 12 and resumed from the checkpoint: the same loss curve as a
    straight run. The data state recorded is the one after the last finished step's batch,
    though a prefetching trainer draws the next batch ahead (block tables, and dynamic
    caches with ``prefetch_memory``); block tables are checkpointed as snapshots of their
    files."""
    d = SyntheticData(SMALL.rows, 13, SMALL.batch_size, SMALL.bag, dist="zipf", seed=2)
    prof = [d.batch(i) for i in range(3)] if mode == "block" else None
    extra: dict[str, Any] = {"slow": f"block:{disk_dir}", "fast_budget": SMALL.table_bytes // 2} if mode == "block" else {}
    if mode == "dynamic+prefetch":
        mode, extra = "dynamic", {"prefetch_memory": True}
    ahead = mode == "block" or "prefetch_memory" in extra
    straight = Trainer(SMALL, mode, seed=1, profile=prof, **extra)
    straight.train((d.batch(i) for i in range(20)), 20)
    straight.close()
    if "prefetch_memory" in extra:
        plain = Trainer(SMALL, mode, seed=1)
        plain.train((d.batch(i) for i in range(20)), 20)
        assert plain.losses == straight.losses, "prefetching changes no value"
        plain.close()
    ck = str(tmp_path / "ck.pt")
    first = Trainer(SMALL, mode, seed=1, profile=prof, **extra)
    drawn = [0]

    def interrupted():
        for i in range(10**6):
            if i == 12:
                raise KeyboardInterrupt
            drawn[0] = i + 1
            yield d.batch(i)

    with pytest.raises(KeyboardInterrupt):
        first.train(interrupted(), 20, checkpoint=ck, checkpoint_every=5, data_state=lambda: {"position": drawn[0]})
    first.close()
    resumed = Trainer(SMALL, mode, seed=99, profile=prof, **extra)  # other initial weights: the checkpoint replaces them
    state = resumed.load(ck)
    # A prefetching trainer meets the interrupt while drawing batch 12 ahead, before step 12.
    assert resumed.step == state["position"] == (11 if ahead else 12)
    assert len(resumed.prefetching) == (len(resumed.tables) if ahead else 0)
    resumed.train((d.batch(i) for i in range(resumed.step, 20)), 20 - resumed.step)
    assert resumed.losses == straight.losses
    resumed.close()
    other = DLRMConfig(rows=(10, 10), dim=4, bottom_mlp=(4,), top_mlp=(1,), batch_size=8)
    with pytest.raises(tiermem.InvalidArgumentError, match="another model"):
        Trainer(other, "all-slow").load(ck)


def test_inference_reports_queries_per_second() -> None:
    d = SyntheticData(SMALL.rows, 13, SMALL.batch_size, SMALL.bag, seed=0)
    r = Trainer(SMALL, "static").infer((d.batch(i) for i in range(4)), 3)
    assert r.queries_per_second > 0 and r.iters == 3 and r.losses == []


def test_2lm_model_counts_table_2_2_and_matches_direct_tables() -> None:
    m = tiermem.Manager({"dram": "2 MiB", "emulated:optane-pmem": "64 MiB"}, policy="all_fast")
    hw = TwoLmModel(m, cache_bytes="256 KiB")
    assert "2LM model" in repr(hw)
    a = EmbeddingTable(20000, 16, manager=m, model=hw)
    b = EmbeddingTable(20000, 16, manager=m, device=1)
    w = np.random.default_rng(0).standard_normal((20000, 16)).astype(np.float32)
    a.load(w)
    b.load(w)
    idx = np.random.default_rng(1).integers(0, 20000, (256, 8))
    g = np.ones((256, 16), np.float32)
    hw.reset_stats()
    np.testing.assert_array_equal(a.lookup(idx), b.lookup(idx))
    s = hw.stats()
    assert sum(s["events"].values()) == idx.size  # one 64-byte line per 64-byte row
    assert s["events"]["read_miss_dirty"] > 0  # the loaded rows were written: victims are dirty
    a.update(idx, None, g, lr=0.1)
    b.update(idx, None, g, lr=0.1)
    np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())
    s = hw.stats()
    assert s["events"]["ddo"] == len(np.unique(idx))  # each updated row: read then DDO write-back
    assert 1.0 < s["amplification"] <= 5.0
    st = m.stats()
    assert st["emulated:optane-pmem"]["bytes_written"] > 0 and st["dram"]["bytes_read"] > 0
    assert a.placement == "2lm-model"
    with pytest.raises(tiermem.InvalidArgumentError, match="line"):
        TwoLmModel(m, cache_bytes="64 KiB", line=96)
    with pytest.raises(tiermem.InvalidArgumentError, match="cache and device"):
        EmbeddingTable(10, 4, model=hw, cache=0.5)


def test_criteo_reader_parses_hashes_and_streams(tmp_path) -> None:
    p = tmp_path / "day.tsv"
    write_criteo(p, 100, seed=3)
    rows = [1000 + k for k in range(26)]
    r = CriteoReader(p, rows, 32)
    batches = list(r)
    assert len(batches) == 3 and r.bad == 0  # 100 // 32, the short tail dropped
    b = batches[0]
    assert b.dense.shape == (32, 13) and len(b.indices) == 26 and b.labels.shape == (32,)
    assert all(int(i.max()) < n for i, n in zip(b.indices, rows))
    with open(p, "rb") as f:
        line = f.readline().rstrip(b"\n").split(b"\t")
    first_cat = line[14]
    assert int(b.indices[0][0]) == (int(first_cat, 16) % rows[0] if first_cat else 0)
    assert float(b.dense[0, 0]) == pytest.approx(np.log(max(int(line[1] or 0), 0) + 1.0))
    # Resume from the position after the first batch: the same second batch.
    r2 = CriteoReader(p, rows, 32)
    it = iter(r2)
    next(it)
    again = next(iter(CriteoReader(p, rows, 32, start=r2.position)))
    assert torch.equal(again.dense, batches[1].dense)


def test_criteo_bad_lines_are_skipped_and_counted_or_rejected(tmp_path) -> None:
    p = tmp_path / "bad.tsv"
    write_criteo(p, 20, seed=4)
    lines = p.read_text().splitlines()
    lines[2] = "1\t2\t3"  # wrong column count
    cols = lines[5].split("\t")
    cols[20] = "zz12"  # bad hexadecimal
    lines[5] = "\t".join(cols)
    cols = lines[7].split("\t")
    cols[3] = "1.5"  # bad integer
    lines[7] = "\t".join(cols)
    p.write_text("\n".join(lines) + "\n")
    r = CriteoReader(p, [50] * 26, 4)
    got = sum(b.size for b in r)
    assert r.bad == 3 and got == 16 and r.lines == 20
    assert "columns" in r.bad_examples[0][1] and "hexadecimal" in r.bad_examples[1][1]
    with pytest.raises(CriteoFormatError, match="line 3"):
        list(CriteoReader(p, [50] * 26, 4, bad_lines="error"))
    with pytest.raises(tiermem.InvalidArgumentError):
        CriteoReader(p, [50] * 25, 4)
    with pytest.raises(tiermem.InvalidArgumentError):
        CriteoReader(tmp_path / "missing.tsv", [50] * 26, 4)


def test_train_cli_runs_modes_on_criteo_and_writes_json(tmp_path, capsys) -> None:
    p = tmp_path / "c.tsv"
    write_criteo(p, 300, seed=5)
    out = tmp_path / "res.json"
    rc = main(
        [
            "train",
            "dlrm",
            "--preset",
            "small",
            "--rows",
            ",".join(["400"] * 26),
            "--bottom-mlp",
            "32-16",
            "--top-mlp",
            "16-1",
            "--batch-size",
            "64",
            "--criteo",
            str(p),
            "--iters",
            "2",
            "--warmup",
            "1",
            "--modes",
            "reference,dynamic,2lm-model",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    assert {r["mode"] for r in res["runs"]} == {"reference", "dynamic", "2lm-model"}
    for r in res["runs"]:
        assert r["dist"] == "criteo" and r["seconds_per_iter"] > 0 and r["fast_bytes_peak"] > 0
        assert all(set(v) == {"read", "written"} for v in r["bytes"].values())
    assert res["devices"]["emulated:optane-pmem"] == "emulated"
    # The figures the emulated device was scaled from, in the JSON and printed.
    f = res["dram_figures"]
    assert f == tiermem.dram_figures() and f["read_gbps"] > 0
    text = capsys.readouterr().out
    assert "2LM" in text and "emulated devices scale their profile to DRAM figures" in text
    assert f"read {f['read_gbps']:.1f} GB/s, write {f['write_gbps']:.1f} GB/s" in text


def test_train_cli_checkpoint_resume_and_inference(tmp_path, capsys) -> None:
    ck = str(tmp_path / "ck.pt")
    base = [
        "train",
        "dlrm",
        "--rows",
        "300,400",
        "--dim",
        "8",
        "--bottom-mlp",
        "16-8",
        "--top-mlp",
        "8-1",
        "--batch-size",
        "32",
        "--bag",
        "2",
        "--modes",
        "static",
        "--dist",
        "uniform",
        "--warmup",
        "1",
        "--fast-budget",
        "64 KiB",
    ]
    assert main(base + ["--iters", "3", "--checkpoint", ck, "--checkpoint-every", "2"]) == 0
    assert os.path.isfile(ck)
    assert main(base + ["--iters", "2", "--checkpoint", ck, "--resume"]) == 0
    assert "resumed from" in capsys.readouterr().out
    assert main(base + ["--iters", "2", "--inference"]) == 0
    assert "queries/s" in capsys.readouterr().out
    assert main(base + ["--iters", "2", "--resume", "--checkpoint", str(tmp_path / "none.pt")]) == 2


def test_demo_writes_the_issue_schema_results_and_plots(tmp_path, monkeypatch, capsys) -> None:
    from tiermem.dlrm import model as dlrm

    tiny = DLRMConfig(rows=(4000,) * 3, dim=16, bottom_mlp=(16,), top_mlp=(8, 1), bag=4, batch_size=64, name="demo")
    monkeypatch.setitem(dlrm.PRESETS, "demo", tiny)
    out, js = tmp_path / "res", tmp_path / "demo.json"
    assert main(["demo", "--quick", "--json", str(js), "--out", str(out)]) == 0
    res = json.loads(js.read_text())
    assert res["devices"] == {"dram": "real", "emulated:optane-pmem": "emulated"}
    got = {(r["mode"], r["dist"]) for r in res["runs"]}
    assert got == {(m, d) for m in MODES if m != "block" for d in ("uniform", "zipf")}
    for r in res["runs"]:
        assert r["seconds_per_iter"] > 0 and isinstance(r["fast_bytes_peak"], int)
        assert all(set(v) == {"read", "written"} for v in r["bytes"].values())
        if r["mode"] not in DRAM_MODES:
            assert r["fast_bytes_peak"] <= res["fast_budget"]
        if r["mode"] != "reference":
            assert r["max_loss_diff_vs_reference"] <= 1e-4, r["mode"]
        if r["mode"] == "all-fast":
            assert r["speedup_vs_all-fast"] == 1.0
        if r["mode"] == "dynamic":
            # Each table's way with misses, chosen from the profile; a bypassed table reads through.
            assert len(r["lookup_policies"]) == 3 and set(r["lookup_policies"]) <= {"dynamic", "admit", None}
            assert r["bypass"] == [p is None for p in r["lookup_policies"]]
        if r["mode"] == "tinylfu":
            assert set(r["lookup_policies"]) <= {"tinylfu", None}
            assert r["bypass"] == [p is None for p in r["lookup_policies"]]
        # The clairvoyant bound lies between all-fast and all-slow, on every run of its input.
        same = {x["mode"]: x for x in res["runs"] if x["dist"] == r["dist"]}
        assert 0.0 <= r["bound_hit_rate"] <= 1.0
        b = r["bound_seconds_per_iter"]
        lo, hi = sorted((same["all-fast"]["seconds_per_iter"], same["all-slow"]["seconds_per_iter"]))
        assert same["all-fast"]["seconds_per_iter"] <= b <= max(hi, lo), (b, lo, hi)
        assert r["ratio_to_bound"] == pytest.approx(r["seconds_per_iter"] / b)
    assert (out / "dlrm-breakdown.png").stat().st_size > 0 and (out / "dlrm-loss.png").stat().st_size > 0
    text = capsys.readouterr().out
    assert "vs 2lm-model" in text and "emulated" in text
    assert text.count("tables' caches as planned from the first batches: dynamic: ") == 2
    assert text.count("clairvoyant bound: ") == 2 and "x the bound" in text


def test_the_clairvoyant_hit_rate_counts_the_timed_accesses_of_the_optimal_shared_cache() -> None:
    from tiermem.dlrm.report import _keys, bound_seconds, clairvoyant_hit_rate

    # Two tables' rows 0 and 1 are different keys. A cache of two rows keeps table 0's pair
    # through the warm-up (table 1's row 0, never used again, stays out), hits both, then
    # misses table 1's row 1 once and hits it once; one row used thrice hits twice.
    warm = [_keys(0, [0, 1]), _keys(1, [0])]
    timed = [_keys(0, [0, 1]), _keys(1, [1, 1])]
    assert clairvoyant_hit_rate(warm + timed[:1], 3, 2) == 1.0
    assert clairvoyant_hit_rate(warm + timed, 3, 2) == pytest.approx(3 / 4)
    assert clairvoyant_hit_rate([np.array([5, 5, 5, 6])], 0, 1) == pytest.approx(2 / 4)
    assert clairvoyant_hit_rate(warm + timed, 3, 0) == 0.0
    assert clairvoyant_hit_rate(warm, 3, 5) is None
    runs = {"all-fast": {"seconds_per_iter": 1.0}, "all-slow": {"seconds_per_iter": 3.0}}
    assert bound_seconds(runs, 0.75) == pytest.approx(1.5)
    assert bound_seconds(runs, None) is None and bound_seconds({"all-fast": runs["all-fast"]}, 0.5) is None


def test_2lm_model_policy_for_arrays_counts_traffic_on_both_devices() -> None:
    m = tiermem.Manager({"dram": "64 KiB", "emulated:optane-pmem": "2 MiB"}, policy="2lm_model")
    assert m.policy == "2lm_model"
    a = m.array((64 * 1024,), "float32", fill=1.0)  # 256 KiB: four times the cache
    m.reset_stats()
    with a.read() as v:
        assert float(v.sum()) == 64 * 1024
    s = m.stats()
    assert s["dram"]["bytes_read"] == 256 << 10  # a tag check per line
    assert s["emulated:optane-pmem"]["bytes_read"] == 256 << 10  # every line misses
    assert m.usage()["dram"]["used"] == 0  # the fast device is all cache, holds no object
    assert (
        tiermem.Manager({"dram": "64 KiB", "emulated:optane-pmem": "2 MiB"}, policy="2lm_model:4096").policy == "2lm_model:4096"
    )
    with pytest.raises(tiermem.InvalidArgumentError, match="power of two"):
        tiermem.Manager({"dram": "64 KiB", "emulated:optane-pmem": "2 MiB"}, policy="2lm_model:100")
