"""One house (issue 13): names come from the crates, errors carry their fields, configs
validate in one place, `import tiermem` stays light, the batched op calls are all or
nothing, and the dispatch benchmark keeps its JSON shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tiermem
from tiermem import _tiermem
from tiermem.embedding import CACHE_POLICIES, MODES, OPTIMIZERS, EmbeddingTable, OptimizerConfig, Placement


def test_vocabularies_are_the_crates_registries() -> None:
    assert tiermem.BUILTIN_POLICIES == tuple(_tiermem.POLICIES)
    assert OPTIMIZERS == tuple(_tiermem.OPTIMIZERS) and "rowwise_adagrad" in OPTIMIZERS
    assert CACHE_POLICIES[:-1] == tuple(_tiermem.CACHE_POLICIES) and CACHE_POLICIES[-1] == "simple"
    assert MODES == tuple(_tiermem.MODES) == ("sum", "mean", "none")
    assert _tiermem.PLACES == {"fast": -1, "slow": -2, "auto": -3}
    assert {"memory", "2lm_model"} <= set(_tiermem.HOME_KINDS)
    assert _tiermem.ISAS[-1] == "scalar"
    assert tiermem.MEMORY_SPACES == ("hbw", "low_lat", "large_cap")
    assert tiermem.MEMORY_SPACE_ENV["hbw"] == "TIERMEM_NODES_HBW"
    assert tiermem.TRAIT_KEYS == tuple(_tiermem.TRAIT_KEYS) and tiermem.COMMIT_STRATEGIES == tuple(_tiermem.COMMIT_STRATEGIES)
    # Every registered name is accepted where it is used, and an unknown one is refused with
    # the registry's list.
    m = tiermem.Manager({"dram": "8 MiB", "emulated:cxl": "16 MiB"})
    for p in _tiermem.CACHE_POLICIES:
        EmbeddingTable(64, 16, manager=m, cache=0.5, policy=p)
    t = EmbeddingTable(64, 16, manager=m)
    for o in OPTIMIZERS:
        t.update([[1, 2]], None, [[0.1] * 16], optimizer=o, lr=0.1)
    with pytest.raises(tiermem.InvalidArgumentError, match="known are sgd, adagrad, rowwise_adagrad"):
        t.update([[1, 2]], None, [[0.1] * 16], optimizer="shampoo")


def test_error_fields_are_exception_attributes() -> None:
    m = tiermem.Manager({"dram": "1 MiB"})
    with pytest.raises(tiermem.DeviceFullError) as e:
        m.array(4 << 20, "uint8")
    err = e.value
    assert (err.device, err.requested, err.capacity) == ("dram", 4 << 20, 1 << 20)
    assert err.free <= err.capacity and err.largest <= err.free
    t = EmbeddingTable(10, 4, manager=m)
    with pytest.raises(tiermem.IndexOutOfRangeError) as e2:
        t.lookup([[1, 12]])
    assert (e2.value.table, e2.value.position, e2.value.value, e2.value.rows) == (0, 1, 12, 10)
    a = m.array(64, "uint8")
    with a.read(), pytest.raises(tiermem.PinnedError) as e3:
        a.free()
    assert e3.value.object == a.id and e3.value.pins == 1 and e3.value.action


def test_configs_validate_once_naming_the_setting() -> None:
    assert OptimizerConfig.of("adagrad", lr=0.5).effective_eps == 1e-10
    assert OptimizerConfig.of("rowwise_adagrad").effective_eps == 1e-8
    for bad, what in [
        ({"lr": -1}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"eps": "x"}, "eps"),
        ({"nesterov": True}, "unknown optimizer settings"),
        ({"weight_decay_mode": "l1"}, "weight_decay_mode 'l1'"),
    ]:
        with pytest.raises(tiermem.InvalidArgumentError, match=what):
            OptimizerConfig.of("sgd", **bad)
    with pytest.raises(tiermem.InvalidArgumentError, match="not also"):
        OptimizerConfig.of(OptimizerConfig("sgd"), lr=0.1)
    for place, what in [
        (Placement(cache=1.5), "cache must"),
        (Placement(policy="lfu"), "policy 'lfu'"),
        (Placement(dtype="float64"), "dtype"),
        (Placement(cache=0.5, policy="simple"), "simple"),
    ]:
        with pytest.raises(tiermem.InvalidArgumentError, match=what):
            place.validate()
    assert Placement(dtype="torch.bfloat16").validate().storage_dtype == "bfloat16"


def test_import_tiermem_loads_neither_torch_nor_rich() -> None:
    code = "import sys, tiermem, tiermem.embedding; print(sorted(m for m in ('torch', 'rich') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_op_open_is_all_or_nothing_and_op_close_closes_every_ticket() -> None:
    m = tiermem.Manager({"dram": "64 KiB", "emulated:cxl": "64 KiB"}, policy="all_fast")
    native = m._native
    a = native.alloc(4096, -1)
    # The second output does not fit: nothing stays open or allocated.
    before = native.object_count()
    with pytest.raises(tiermem.DeviceFullError):
        native.op_open([(a, False)], ([4096, 1 << 20], -1, []), False)
    assert native.object_count() == before
    native.check()
    tickets, addrs, outs, moves = native.op_open([(a, True)], ([4096, 8192], -1, []), True)
    assert len(tickets) == len(addrs) == 3 and len(outs) == 2 and all(addrs) and moves == (0, 0)
    assert native.placement(a)[3] == 1  # pinned while the op runs
    native.op_close(tickets, [(a, 4096, 4096), (outs[0], 0, 4096)], 1, [a])
    assert native.placement(a)[3] == 0 and native.placement(a)[2]  # closed, written: dirty
    with pytest.raises(tiermem.GuardError, match="not open"):
        native.op_close(tickets[:1], [], 1, [])
    native.check()


@pytest.mark.torch
def test_bench_dispatch_json(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "d.json"
    r = subprocess.run(
        [sys.executable, "-m", "tiermem.cli.main", "bench", "dispatch", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    ops = {o["op"]: o for o in res["ops"]}
    assert {"add", "linear"} <= set(ops)
    for o in ops.values():
        assert o["tiered_us"] > 0 and o["plain_us"] > 0 and o["floor_us"] > 0
        # A ratio is the median of the rounds' paired ratios, not a ratio of medians.
        assert o["ratio_to_floor"] == o["variants"]["LM"]["ratio_to_floor"] > 0
    for v, worst in res["worst_ratio_to_floor"].items():
        assert worst == max(o["variants"][v]["ratio_to_floor"] for o in ops.values())
    assert "paired" in res["statistic"]
    assert "loadavg_start" in res["load"] and "tiered / floor" in r.stdout


def _rss_growth_mib(env: dict[str, str]) -> int:
    code = (
        "import tiermem\n"
        "def rss(): return int(open('/proc/self/statm').read().split()[1]) * 4096 >> 20\n"
        "tiermem.dram_figures()\n"  # the DRAM probe (if any) before the baseline
        "r0 = rss()\n"
        "m = tiermem.Manager({'dram': '16 MiB', 'emulated:cxl': '1 GiB'})\n"
        "print(rss() - r0)\n"
    )
    full = {k: v for k, v in os.environ.items() if k != "TIERMEM_PREFAULT"}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=300)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip())


def test_slow_tiers_are_not_faulted_in_unless_asked() -> None:
    """The fast device is faulted in when a manager is made; an emulated slow tier by
    default only as it is used; `TIERMEM_PREFAULT=now` (what the measuring commands set)
    faults every device in first."""
    assert _rss_growth_mib({"TIERMEM_PREFAULT": "now"}) >= 1000
    assert _rss_growth_mib({}) < 256
    bad = subprocess.run(
        [sys.executable, "-c", "import tiermem; tiermem.Manager({'dram': '1 MiB', 'emulated:cxl': '1 MiB'})"],
        capture_output=True,
        text=True,
        env={**os.environ, "TIERMEM_PREFAULT": "eager"},
    )
    assert bad.returncode != 0 and "TIERMEM_PREFAULT" in bad.stderr and "expected now, background or lazy" in bad.stderr


def test_bench_tensors_names_unknown_models_and_variants(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    from tiermem.cli.main import main

    assert main(["bench", "tensors", "--quick", "--model", "nope"]) == 2
    assert "model 'nope': known are resnet" in capsys.readouterr().err
    assert main(["bench", "train", "--quick", "--variants", "LM,fast"]) == 2
    assert "variant 'fast': known are all-fast" in capsys.readouterr().err


def test_every_exported_exception_is_importable_from_the_package() -> None:
    ns: dict[str, object] = {}
    exec("from tiermem import *", ns)
    for name in tiermem.exceptions.__all__:
        assert isinstance(ns[name], type) and issubclass(ns[name], Exception), name  # type: ignore[arg-type]
    assert issubclass(tiermem.CorruptFileError, OSError) and issubclass(tiermem.CorruptFileError, tiermem.TiermemError)
