"""A user's table files survive the two obvious paths (run the script again; rebuild the model
over the same files), with their optimizer state; files tiermem made for one run are gone when
the run ends, however it ends; a file a dead process left is reclaimed, a user's never."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tiermem  # noqa: E402
from tiermem.embedding import EmbeddingTable  # noqa: E402
from tiermem.exceptions import InvalidArgumentError  # noqa: E402
from tiermem.torch import TieredEmbeddingBag, TieredEmbeddingBagCollection  # noqa: E402


def _module(path: Path, **kw) -> TieredEmbeddingBag:
    kw.setdefault("optimizer", "adagrad")
    return TieredEmbeddingBag(600, 8, mode="sum", where=f"block:{path}", cache=0.5, lr=0.1, seed=0, **kw)


def _train(m: torch.nn.Module, seed: int, steps: int = 3) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, 600, (32, 3), generator=g)
        m(idx).pow(2).mean().backward()


def test_rebuilding_a_model_keeps_the_trained_rows_and_the_optimizer_state(disk_dir: Path) -> None:
    """Before: the rebuilt module drew fresh random rows over the trained file. After: the rows
    and Adagrad's state come back, and training on gives what training without a break gives."""
    a, ref = disk_dir / "a.tbl", disk_dir / "ref.tbl"
    m = _module(a)
    r = _module(ref)
    _train(m, 1)
    _train(r, 1)
    trained = m.weight.clone()
    del m
    m = _module(a)  # the resume: the same constructor over the same file
    assert m.table.attached and m.table.trained_with == "adagrad"
    torch.testing.assert_close(m.weight, trained, rtol=0, atol=0)
    _train(m, 2)
    _train(r, 2)  # never closed
    torch.testing.assert_close(m.weight, r.weight, rtol=0, atol=0)
    st_m, st_r = m.table.optimizer_state(), r.table.optimizer_state()
    assert st_m is not None and st_r is not None and st_m[2] == st_r[2] == 6
    np.testing.assert_array_equal(st_m[1], st_r[1])


def test_a_collection_rebuilt_over_its_files_keeps_its_rows(disk_dir: Path) -> None:
    where = f"block:{disk_dir}"
    made = TieredEmbeddingBagCollection([(500, 8), (400, 8)], where=where, cache=0.5, optimizer="sgd", seed=3)
    before = [t.to_numpy() for t in made.tables]
    del made
    again = TieredEmbeddingBagCollection([(500, 8), (400, 8)], where=where, cache=0.5, optimizer="sgd", seed=4)
    for t, b in zip(again.tables, before):
        assert t.attached
        np.testing.assert_array_equal(t.to_numpy(), b)


def test_reattaching_with_another_shape_or_optimizer_is_an_error_naming_both(disk_dir: Path) -> None:
    a = disk_dir / "a.tbl"
    m = _module(a)
    _train(m, 1, steps=1)
    del m
    with pytest.raises(InvalidArgumentError, match=r"600 rows of width 8 \(float32\); asked for 600 x 16"):
        TieredEmbeddingBag(600, 16, mode="sum", where=f"block:{a}", cache=0.5)
    with pytest.raises(InvalidArgumentError, match=r"trained with optimizer 'adagrad'.*uses 'sgd'"):
        _module(a, optimizer="sgd")
    # The table API refuses the mix at the update, naming both.
    t = EmbeddingTable(600, 8, device=f"block:{a}", cache=0.5)
    with pytest.raises(InvalidArgumentError, match=r"trained with the optimizer 'adagrad'.*'sgd'"):
        t.update(np.array([1]), np.array([0]), np.ones((1, 8), np.float32), optimizer="sgd", lr=0.1)
    t.reset_optimizer()
    t.update(np.array([1]), np.array([0]), np.ones((1, 8), np.float32), optimizer="sgd", lr=0.1)


def test_initialising_an_existing_file_needs_init_overwrite(disk_dir: Path) -> None:
    a = disk_dir / "a.tbl"
    m = _module(a)
    _train(m, 1)
    trained = m.weight.clone()
    del m
    with pytest.raises(InvalidArgumentError, match="init='overwrite'"):
        TieredEmbeddingBag(600, 8, mode="sum", where=f"block:{a}", cache=0.5, _weight=torch.zeros(600, 8))
    fresh = _module(a, init="overwrite", optimizer="sgd")
    assert not torch.equal(fresh.weight, trained)
    assert fresh.table.optimizer_state() is None and fresh.table.trained_with is None
    with pytest.raises(InvalidArgumentError, match="init="):
        _module(disk_dir / "b.tbl", init="fresh")


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True, timeout=120)


SCRIPT = """
import tiermem
m = tiermem.Manager({"dram": "1 MiB", "block:dev.bin": "8 MiB", "mapped:map.bin": "8 MiB"})
a = m.array((1 << 18,), "float32", fill=1.0)
keep_alive = [m, a]   # the script ends with its objects alive
print("ok")
"""


def test_running_a_script_twice_works_and_leaves_no_device_file(disk_dir: Path) -> None:
    """Before: the device files outlived the script and the second run was refused."""
    for _ in range(2):
        r = _run(SCRIPT, disk_dir)
        assert r.returncode == 0 and "ok" in r.stdout, r.stderr
        assert not (disk_dir / "dev.bin").exists() and not (disk_dir / "map.bin").exists()


def test_a_dead_process_device_file_is_reclaimed_a_users_file_is_not(disk_dir: Path) -> None:
    p = subprocess.Popen(
        [sys.executable, "-c", SCRIPT.replace('print("ok")', 'print("ok", flush=True); import time; time.sleep(60)')],
        cwd=disk_dir,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and "ok" in p.stdout.readline()
    # While it lives, its files are locked: refused.
    r = _run(SCRIPT, disk_dir)
    assert r.returncode != 0 and "in use by another tiermem manager" in r.stderr
    p.send_signal(signal.SIGKILL)
    p.wait()
    p.stdout.close()
    assert (disk_dir / "dev.bin").exists()  # SIGKILL: nothing could remove it
    r = _run(SCRIPT, disk_dir)
    assert r.returncode == 0, r.stderr  # reclaimed
    assert not (disk_dir / "dev.bin").exists()
    # A file tiermem did not make is never overwritten.
    (disk_dir / "dev.bin").write_bytes(b"the user's data")
    r = _run(SCRIPT, disk_dir)
    assert r.returncode != 0 and "does not overwrite" in r.stderr
    assert (disk_dir / "dev.bin").read_bytes() == b"the user's data"


def test_table_files_stay_scratch_tables_go_on_every_exit(disk_dir: Path) -> None:
    """A table file outlives the script (persistent by design); files registered as scratch
    (what `tiermem train dlrm --modes block` makes) go at exit, on an error and on SIGTERM."""
    code = """
    import sys, signal, os, time
    from tiermem.embedding import EmbeddingTable
    from tiermem._files import remove_at_exit
    from tiermem.cli.main import _exit_on_signals
    _exit_on_signals()
    keep = EmbeddingTable(100, 8, device="block:kept.tbl", cache=0.5)
    scratch = EmbeddingTable(100, 8, device="block:scratch.tbl", cache=0.5)
    scratch.update([1], [0], [[1.0] * 8], optimizer="sgd")
    remove_at_exit("scratch.tbl")
    how = sys.argv[1] if len(sys.argv) > 1 else "end"
    print("ready", flush=True)
    if how == "error":
        raise RuntimeError("boom")
    if how == "term":
        time.sleep(60)
    """
    for how in ("end", "error", "term"):
        p = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), how],
            cwd=disk_dir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert p.stdout is not None and "ready" in p.stdout.readline()
        if how == "term":
            time.sleep(0.2)
            p.send_signal(signal.SIGTERM)
        p.communicate(timeout=60)
        left = sorted(os.listdir(disk_dir))
        assert "kept.tbl" in left and not any(f.startswith("scratch") for f in left), (how, left)


def test_the_dlrm_trainer_registers_its_block_tables_for_removal(disk_dir: Path) -> None:
    code = f"""
    from tiermem.dlrm.model import DLRMConfig
    from tiermem.dlrm.trainer import Trainer
    c = DLRMConfig(rows=(3_000, 20_000, 60_000), dim=16, bottom_mlp=(16,), top_mlp=(8, 1), bag=4, batch_size=64)
    t = Trainer(c, "block", fast_budget=c.table_bytes // 4, slow="block:{disk_dir}")
    print(len(t.files), flush=True)
    raise SystemExit(3)   # no close(): an error path
    """
    r = _run(code, disk_dir)
    assert r.returncode == 3, r.stderr
    assert int(r.stdout.split()[0]) >= 1
    assert not any(f.endswith(".tmb") or ".tmb." in f for f in os.listdir(disk_dir)), os.listdir(disk_dir)


def test_the_manager_made_device_file_is_marked_as_tiermems(disk_dir: Path) -> None:
    m = tiermem.Manager({"dram": "1 MiB", "block:" + str(disk_dir / "d.bin"): "4 MiB"})
    try:
        assert os.getxattr(disk_dir / "d.bin", "user.tiermem") == b"device"
    except OSError:
        pytest.skip("this file system keeps no extended attributes")
    finally:
        del m


def test_optimizer_state_of_another_layout_generation_is_an_error_naming_both(disk_dir: Path) -> None:
    a = disk_dir / "a.tbl"
    m = _module(a)
    _train(m, 1, steps=1)
    del m
    old = (disk_dir / "a.tbl.optim").read_bytes()  # written at generation 1
    t = EmbeddingTable(600, 8, device=f"block:{a}", cache=0.5)
    t.relayout(np.random.default_rng(0).permutation(600))
    del t
    os.unlink(disk_dir / "a.tbl.optim")
    (disk_dir / "a.tbl.optim").write_bytes(old)  # a companion of the file before its relayout
    with pytest.raises(InvalidArgumentError, match="written at layout generation 1, the file is at generation 2"):
        _module(a)
