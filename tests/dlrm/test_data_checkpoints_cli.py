"""Issue 12, items 11-13: the Criteo reader's bounds, checkpoints that are checked and never
unpickled, and command-line and API edges that gave tracebacks or wrong answers."""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tiermem  # noqa: E402
from tiermem import checkpoint  # noqa: E402
from tiermem.cli.main import main  # noqa: E402
from tiermem.dlrm.data import CriteoFormatError, CriteoReader, SyntheticData, write_criteo  # noqa: E402
from tiermem.dlrm.model import DLRMConfig  # noqa: E402
from tiermem.dlrm.trainer import Trainer  # noqa: E402

SMALL = DLRMConfig(rows=(3000, 2000), dim=16, bottom_mlp=(32, 16), top_mlp=(16, 1), bag=4, batch_size=64)


# Item 11 ---------------------------------------------------------------------------------


def test_item11_huge_integers_are_bad_lines_not_crashes(tmp_path: Path) -> None:
    p = tmp_path / "c.tsv"
    write_criteo(p, 10, seed=1)
    lines = p.read_text().splitlines()
    cols = lines[3].split("\t")
    cols[2] = "9" * 400
    lines[3] = "\t".join(cols)
    cols = lines[5].split("\t")
    cols[20] = "f" * 40
    lines[5] = "\t".join(cols)
    p.write_text("\n".join(lines) + "\n")
    r = CriteoReader(p, [100] * 26, 4)
    n = sum(b.size for b in r)
    assert (n, r.bad, r.lines) == (8, 2, 10)
    assert "400 digits" in r.bad_examples[0][1] and "40 hex digits" in r.bad_examples[1][1]
    with pytest.raises(CriteoFormatError, match="line 4.*400 digits"):
        list(CriteoReader(p, [100] * 26, 4, bad_lines="error"))


def test_item11_a_line_without_newline_is_read_in_bounded_memory(tmp_path: Path) -> None:
    p = tmp_path / "long.tsv"
    write_criteo(p, 5, seed=2)
    with open(p, "ab") as f:
        chunk = b"1" * (1 << 20)
        for _ in range(40):  # a 40 MB line with no newline at the end of the file
            f.write(chunk)
    with open(p, "ab") as f:
        f.write(b"\n")
    write_criteo(tmp_path / "tail.tsv", 3, seed=3)
    with open(p, "ab") as f:
        f.write((tmp_path / "tail.tsv").read_bytes())
    tracemalloc.start()
    r = CriteoReader(p, [100] * 26, 1)
    n = sum(b.size for b in r)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert (n, r.bad) == (8, 1) and "longer than" in r.bad_examples[0][1]
    assert peak < 8 << 20, f"peak {peak} bytes for a 40 MB line"


def test_item11_and_13_criteo_file_with_no_valid_line_is_a_clear_error(tmp_path: Path, capsys) -> None:
    p = tmp_path / "bad.tsv"
    p.write_text("not\ta\tcriteo\tline\n" * 50)
    rc = main(
        [
            "train",
            "dlrm",
            "--criteo",
            str(p),
            "--modes",
            "all-slow",
            "--rows",
            ",".join(["50"] * 26),
            "--dim",
            "8",
            "--bottom-mlp",
            "16-8",
            "--top-mlp",
            "8-1",
            "--iters",
            "2",
            "--warmup",
            "0",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "gave no batch at all" in err and "Traceback" not in err


# Item 12 ---------------------------------------------------------------------------------


def _trained(tmp_path: Path) -> tuple[Trainer, str, SyntheticData]:
    d = SyntheticData(SMALL.rows, 13, SMALL.batch_size, SMALL.bag, dist="zipf", seed=2)
    t = Trainer(SMALL, "dynamic", seed=1)
    ck = str(tmp_path / "ck.pt")
    t.train((d.batch(i) for i in range(6)), 6, checkpoint=ck)
    return t, ck, d


def test_item12_flipped_bytes_truncation_and_foreign_files_are_refused_by_name(tmp_path: Path) -> None:
    t, ck, _ = _trained(tmp_path)
    data = bytearray(Path(ck).read_bytes())
    rng = np.random.default_rng(0)
    for name, blob in {
        "flipped": bytes(b ^ 0xFF if i in set(rng.integers(0, len(data) - 100, 200).tolist()) else b for i, b in enumerate(data)),
        "truncated": bytes(data[: len(data) // 2]),
        "empty": b"",
        "foreign": b"hello, this is a text file\n" * 10,
        "old-format": _old_format_checkpoint(),
    }.items():
        f = tmp_path / f"{name}.pt"
        f.write_bytes(blob)
        fresh = Trainer(SMALL, "dynamic", seed=5)
        before = {k: v.clone() for k, v in fresh.model.state_dict().items() if isinstance(v, torch.Tensor)}
        with pytest.raises(checkpoint.CheckpointError, match=str(f)):
            fresh.load(str(f))
        after = fresh.model.state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before), f"{name}: weights changed"


def _old_format_checkpoint() -> bytes:
    import io

    b = io.BytesIO()
    torch.save({"format": "tiermem-dlrm-1"}, b)
    return b.getvalue()


class _Evil:
    def __reduce__(self):  # runs `touch` when unpickled
        return (os.system, (f"touch {os.environ.get('TIERMEM_PWNED', '/nonexistent/pwned')}",))


def test_item12_a_crafted_checkpoint_runs_no_code(tmp_path: Path, monkeypatch) -> None:
    flag = tmp_path / "pwned"
    monkeypatch.setenv("TIERMEM_PWNED", str(flag))
    evil = tmp_path / "evil.pt"
    # A well-formed container (valid checksums) whose state section is a malicious pickle.
    import hashlib
    import json

    blob = pickle.dumps({"format": "tiermem-dlrm-2", "x": _Evil()})
    manifest = json.dumps(
        {
            "format": checkpoint.FORMAT,
            "sections": [{"name": "state", "offset": 0, "length": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}],
        }
    ).encode()
    evil.write_bytes(blob + manifest + struct.pack("<Q32s8s", len(manifest), hashlib.sha256(manifest).digest(), checkpoint.MAGIC))
    with pytest.raises(checkpoint.CheckpointError, match="cannot be loaded safely"):
        Trainer(SMALL, "dynamic").load(str(evil))
    assert not flag.exists()


def test_item12_resume_restores_tables_and_state_streamed(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(checkpoint, "CHUNK", 4096)  # many chunks per table
    t, ck, d = _trained(tmp_path)
    ckp = checkpoint.Checkpoint(ck)
    assert sorted(ckp.tables()) == ["embeddings.collection.tables.0.", "embeddings.collection.tables.1."]
    assert "model" in ckp.state() and not any("weight" in k and "tables" in k for k in ckp.state()["model"])
    r = Trainer(SMALL, "dynamic", seed=9)
    r.load(ck)
    for a, b in zip(t.tables, r.tables):
        np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())
    assert r.step == t.step and r.losses == t.losses


def test_item12_stale_temporaries_go_and_folders_are_checked_first(tmp_path: Path, capsys) -> None:
    t, ck, _ = _trained(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    stale = Path(f"{ck}.tmp-{dead}")
    stale.write_bytes(b"half a checkpoint")
    t.save(ck)
    assert not stale.exists() and not list(tmp_path.glob("ck.pt.tmp-*"))
    rc = main(
        [
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
            "--modes",
            "static",
            "--iters",
            "2",
            "--checkpoint",
            str(tmp_path / "no" / "such" / "ck.pt"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "does not exist" in err


# Item 13 ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--rows", "abc"], "'abc' in 'abc' is not an integer"),
        (["--bottom-mlp", "512-x"], "'x' in '512-x' is not an integer"),
        (["--lr", "nan"], "finite"),
        (["--lr", "-1"], "finite"),
        (["--iters", "0"], "outside 1"),
        (["--scale", "inf"], "finite"),
    ],
)
def test_item13_bad_option_values_are_usage_errors(args: list[str], msg: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["train", "dlrm", *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err and "Traceback" not in err


def test_item13_json_to_a_device_is_refused(tmp_path: Path, capsys) -> None:
    with pytest.raises(tiermem.InvalidArgumentError, match="not a regular file"):
        from tiermem._files import write_json_atomic

        write_json_atomic("/dev/full", {"a": 1})
    assert not Path(f"/dev/full.tmp-{os.getpid()}").exists()


def test_item13_iters_zero_from_the_api_is_refused() -> None:
    d = SyntheticData(SMALL.rows, 13, SMALL.batch_size, SMALL.bag, seed=0)
    with pytest.raises(tiermem.InvalidArgumentError, match="iters must be"):
        Trainer(SMALL, "static").train((d.batch(i) for i in range(3)), 0)
    with pytest.raises(tiermem.InvalidArgumentError, match="all spent on warm-up"):
        Trainer(SMALL, "static").train((d.batch(i) for i in range(2)), 3, warmup=2)


def test_item13_recorder_interval_is_bounded() -> None:
    m = tiermem.Manager({"dram": "1 MiB"})
    for bad in (1e-6, 0, -1, float("nan"), float("inf")):
        with pytest.raises(tiermem.InvalidArgumentError, match="interval"):
            with m.record(bad):
                pass
    with m.record(0.001) as trace:
        import time

        time.sleep(0.05)
    assert 1 <= len(trace) <= 60


def test_item13_rowwise_adagrad_uses_the_initial_accumulator() -> None:
    from tiermem.embedding import EmbeddingTable

    outs = []
    for init in (0.0, 4.0):
        t = EmbeddingTable(4, 4)
        t.load(np.ones((4, 4), np.float32))
        t.update([0], [0], np.ones((1, 4), np.float32), optimizer="rowwise_adagrad", lr=1.0, initial_accumulator_value=init)
        kind, state, _ = t.optimizer_state()
        outs.append((state[0], t.to_numpy()[0, 0]))
    assert outs[0][0] == pytest.approx(1.0) and outs[1][0] == pytest.approx(5.0)
    assert outs[0][1] == pytest.approx(0.0, abs=1e-6) and outs[1][1] == pytest.approx(1 - 1 / np.sqrt(5))


def test_item13_2lm_policy_charges_every_guard_and_write_only_events() -> None:
    def run(body) -> dict:
        m = tiermem.Manager({"dram": "64 KiB", "emulated:optane-pmem": "2 MiB"}, policy="2lm_model")
        a = m.array(4096, "float32", fill=1.0)  # 16 KiB: fits the cache
        before = m.policy_stats()["events"]
        m.reset_stats()
        body(a)
        s = m.stats()
        s["events"] = {k: v - before[k] for k, v in m.policy_stats()["events"].items()}
        return s

    def twice(a):
        with a.read(), a.read():
            pass

    def once(a):
        with a.read():
            pass

    s1, s2 = run(once), run(twice)
    assert s2["dram"]["bytes_read"] == 2 * s1["dram"]["bytes_read"] > 0

    def overwrite(a):
        with a.write(overwrite=True) as v:
            v[:] = 3

    def rmw(a):
        with a.write() as v:
            v[:] = 3

    so, sr = run(overwrite), run(rmw)
    lines = 16384 // 64
    assert so["events"]["write_hit"] == lines and so["events"]["ddo"] == 0
    assert sr["events"]["read_hit"] == lines and sr["events"]["ddo"] == lines and sr["events"]["write_hit"] == 0
    # Table 2.2 prices a write hit like a read hit plus its DDO write-back: same bytes.
    assert so["dram"]["bytes_written"] == sr["dram"]["bytes_written"]
