"""Issue 12, items 4-8: bad calibration figures, out-of-bounds writes, views that escape
their guard, guards closed twice, Python policies that move pinned objects."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tiermem
from tiermem import _tiermem


def _child(code: str, env_calibration: Path) -> subprocess.CompletedProcess[str]:
    import os

    env = dict(os.environ, TIERMEM_CALIBRATION=str(env_calibration))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize(
    "field,value",
    [("write_gbps", 0), ("read_gbps", 0), ("write_gbps", 1e-12), ("read_gbps", -3.0), ("latency_ns", 0.0), ("copy_gbps", 1e9)],
)
def test_item4_bad_calibration_figures_are_refused_with_the_file_and_field(tmp_path: Path, field: str, value: float) -> None:
    cal = tmp_path / "calibration.json"
    dram = {"read_gbps": 10.0, "write_gbps": 8.0, "copy_gbps": 6.0, "latency_ns": 90.0, "source": "calibrated"}
    dram[field] = value
    cal.write_text(json.dumps({"version": 1, "dram": dram}))
    p = _child(
        """
        import numpy as np, tiermem
        try:
            tiermem.Manager({"dram": "4 MiB", "emulated:optane-pmem": "16 MiB"})
        except tiermem.InvalidArgumentError as e:
            print("refused:", e)
        # DRAM alone still works, and fully: nothing was bricked.
        m = tiermem.Manager({"dram": "4 MiB"})
        a = m.array(1 << 20, "uint8", fill=7)
        assert int(a.to_numpy().sum()) == 7 << 20
        m.check()
        try:
            tiermem.dram_figures()
        except tiermem.InvalidArgumentError as e:
            print("figures refused")
    """,
        cal,
    )
    assert p.returncode == 0, p.stderr
    assert "refused:" in p.stdout and field in p.stdout and str(cal) in p.stdout, p.stdout
    assert "figures refused" in p.stdout


def test_item5_output_columns_and_row_widths_are_bounded() -> None:
    from tiermem.embedding import EmbeddingTable

    t = EmbeddingTable(16, 8)
    out = np.zeros((2, 8), np.float32)
    vals = np.array([0, 1], np.int64)
    offs = np.array([0, 1, 2], np.int64)
    for col in (2**64 - 4, 2**63, 1):
        with pytest.raises(tiermem.InvalidArgumentError, match="does not fit rows"):
            _tiermem.lookup_into([t._native], ([vals], [offs], [None]), "sum", out, (8, [col]), 0)
    assert not out.any()  # nothing written anywhere
    with pytest.raises((tiermem.InvalidArgumentError, OverflowError)):
        EmbeddingTable(3, 2**62 + 1)
    with pytest.raises(tiermem.InvalidArgumentError, match="at most"):
        _tiermem.Table.new(tiermem.Manager({"dram": "4 MiB"})._native, (3, 2**62 + 1, "float32"), {"kind": "memory", "device": 0})


def test_item6_torch_views_derived_inside_a_guard_cannot_write_into_another_array() -> None:
    pytest.importorskip("torch")
    m = tiermem.Manager({"dram": "1 MiB", "emulated:cxl": "8 MiB"}, policy="lru")
    a = m.array(64 << 10, "float32", fill=1.0)  # 256 KiB
    with a.write("torch") as t:
        part = t[0:16]
        flat = t.view(-1)[100:200]
    assert a.placement["pins"] == 1  # held while the derived views live
    with pytest.raises(tiermem.PinnedError, match="hold"):
        a.evict()
    # Fill DRAM with other arrays: none may reuse a's memory while the views live.
    others = [m.array(64 << 10, "float32", fill=float(i + 2)) for i in range(8)]
    part.fill_(-1.0)
    flat.fill_(-1.0)
    for i, o in enumerate(others):
        assert np.all(o.to_numpy() == i + 2), f"array {i} was written through a stale view"
    m.check()
    del part, flat
    assert a.placement["pins"] == 0
    a.evict()
    m.check()


def test_item6_numpy_plain_views_hold_too() -> None:
    m = tiermem.Manager({"dram": "1 MiB", "emulated:cxl": "8 MiB"}, policy="lru")
    a = m.array(1000, "float64", fill=1.0)
    with a.write() as v:
        raw = np.asarray(v)
        strided = np.lib.stride_tricks.as_strided(v[0:10], shape=(5,), strides=(16,))
    assert a.placement["pins"] == 1
    del raw
    assert a.placement["pins"] == 1  # `strided` still points there
    del strided, v
    assert a.placement["pins"] == 0
    with a.write() as v:  # the plain pattern: the caller's name alone does not hold
        v[:] = 2
    a.evict()
    assert a.placement["pins"] == 0 and not a.in_fast


def test_item7_a_guard_closes_once() -> None:
    m = tiermem.Manager({"dram": "1 MiB", "emulated:cxl": "8 MiB"}, policy="lru")
    a = m.array(1000, "float64", fill=1.0)
    b = m.array(1000, "float64", fill=2.0)
    g1, g2 = a.read(), a.read()
    v1 = g1.__enter__()
    v2 = g2.__enter__()
    g1.__exit__(None, None, None)
    with pytest.raises(tiermem.GuardError, match="closes once"):
        g1.__exit__(None, None, None)
    with pytest.raises(tiermem.GuardError, match="closed already"):
        g1.__enter__()
    # g2 still pins a: it cannot move, so its live view keeps reading a's bytes.
    with pytest.raises(tiermem.PinnedError):
        a.evict()
    assert float(v2[0]) == 1.0
    ticket, _, _ = m._native.open(b.id, False)
    m._native.close(ticket)
    with pytest.raises(tiermem.GuardError, match="not open"):
        m._native.close(ticket)
    g2.__exit__(None, None, None)
    del v1, v2
    m.check()


def test_item8_python_policies_cannot_move_or_free_pinned_objects() -> None:
    class Mover:
        name = "mover"

        def alloc(self, api: Any, nbytes: int, place: int) -> int:
            return api.create_object(0, nbytes)

        def read_use(self, api: Any, obj: int) -> None:
            x = api.primary(obj)
            if api.pins(obj) == 0:
                return
            y = api.allocate(1, api.sizeof(x), obj)
            api.copyto(y, x)
            api.link(x, y)
            api.set_primary(obj, y)  # moves a pinned object: refused

    m = tiermem.Manager({"dram": "1 MiB", "emulated:cxl": "8 MiB"}, policy=Mover())
    a = m.array(1000, "float64", fill=1.0)
    g = a.read()
    v = g.__enter__()
    with pytest.raises(tiermem.PolicyError, match="pinned.*switching its primary region refused"):
        a.read_use()
    assert float(v[0]) == 1.0  # the guard's view still reads a's bytes
    m.check()  # every guard still points at its object's primary
    g.__exit__(None, None, None)
    m.check()
    np.testing.assert_array_equal(a.to_numpy(), np.ones(1000))


def test_item6_a_plain_array_from_a_slice_holds_even_when_the_view_is_gone() -> None:
    m = tiermem.Manager({"dram": "1 MiB", "emulated:cxl": "8 MiB"}, policy="lru")
    a = m.array(1000, "float64", fill=1.0)
    with a.write() as v:
        w = np.asarray(v[0:3])
        del v
    assert a.placement["pins"] == 1
    with pytest.raises(tiermem.PinnedError, match="hold"):
        a.evict()
    del w
    assert a.placement["pins"] == 0
    a.evict()


def test_item6_a_plain_array_from_the_view_holds_when_the_view_name_is_deleted() -> None:
    m = tiermem.Manager({"dram": "1 MiB", "emulated:cxl": "8 MiB"}, policy="lru")
    a = m.array(1000, "float64", fill=1.0)
    with a.read() as v:
        w = np.asarray(v)
        del v
    assert a.placement["pins"] == 1
    del w
    assert a.placement["pins"] == 0
