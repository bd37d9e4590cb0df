"""8-bit row-wise rows (FBGEMM's layout: codes, then an f32 scale and bias per row) against
PyTorch's own quantised embedding ops (``quantized.embedding_bag_byte_prepack``,
``..._unpack`` and ``..._rowwise_offsets``, FBGEMM's kernels on CPU): rows direct, cached
over a slower device and in a table file; lookups within 1e-5 relative; updates refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tiermem import InvalidArgumentError  # noqa: E402
from tiermem.embedding import DTYPES, EmbeddingTable  # noqa: E402

ROWS, DIM = 2000, 37  # an odd width: scale and bias unaligned in every row
PLACES = ["direct", "cached", "table-file"]


def _table(place: str, tmp_path: Path) -> EmbeddingTable:
    kw: dict = {
        "direct": {},
        "cached": {"device": "emulated:optane-pmem", "cache": 0.1},
        "table-file": {"device": f"table:{tmp_path / 'q.tm'}", "cache": 1.0},
    }[place]
    return EmbeddingTable(ROWS, DIM, dtype="int8_rowwise", **kw)


@pytest.fixture(scope="module")
def data() -> dict:
    g = torch.Generator().manual_seed(7)
    w = torch.randn(ROWS, DIM, generator=g) * 3
    w[5] = 1.25  # a constant row: range 0
    packed = torch.ops.quantized.embedding_bag_byte_prepack(w)
    idx = torch.randint(0, ROWS, (3000,), generator=g)
    sizes = torch.randint(0, 60, (100,), generator=g)
    sizes[::7] = 0  # empty bags
    sizes[-1] += 3000 - int(sizes.sum()) if int(sizes.sum()) < 3000 else 0
    off = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(sizes, 0)[:-1]]).clamp(max=3000)
    psw = torch.rand(3000, generator=g)
    return {
        "w": w,
        "packed": packed,
        "deq": torch.ops.quantized.embedding_bag_byte_unpack(packed),
        "idx": idx,
        "off": off,
        "psw": psw,
    }


def _close(ours: np.ndarray, ref: torch.Tensor) -> None:
    ref_np = ref.numpy()
    scale = max(float(np.abs(ref_np).max()), 1e-30)
    assert float(np.abs(ours - ref_np).max()) / scale < 1e-5


@pytest.mark.parametrize("place", PLACES)
def test_rows_are_fbgemms_quantisation(place: str, data: dict, tmp_path: Path) -> None:
    t = _table(place, tmp_path)
    assert t.dtype == "int8_rowwise" and t.row_bytes == 48  # 37 codes + 8, rounded to 4
    t.load(data["w"].numpy())
    # The same codes, scales and biases as prepack: each value within one f32 rounding.
    np.testing.assert_allclose(t.to_numpy(), data["deq"].numpy(), rtol=0, atol=1e-6)
    assert np.all(t.read(5, 1) == 1.25)


@pytest.mark.parametrize("place", PLACES)
def test_lookups_match_pytorchs_quantised_kernels(place: str, data: dict, tmp_path: Path) -> None:
    t = _table(place, tmp_path)
    t.load(data["w"].numpy())
    idx, off, psw, packed = data["idx"], data["off"], data["psw"], data["packed"]
    q = torch.ops.quantized.embedding_bag_byte_rowwise_offsets
    _close(t.lookup(idx.numpy(), off.numpy(), mode="sum"), q(packed, idx, off, False, 0, False, None, None, False))
    _close(
        t.lookup(idx.numpy(), off.numpy(), per_sample_weights=psw.numpy()),
        q(packed, idx, off, False, 0, False, psw, None, False),
    )
    # The quantised op has no mean (it sums whatever the mode says): mean and plain
    # embedding are checked against float ops over the dequantised rows.
    deq = data["deq"]
    _close(t.lookup(idx.numpy(), off.numpy(), mode="mean"), torch.nn.functional.embedding_bag(idx, deq, off, mode="mean"))
    _close(t.lookup(idx[:200].numpy(), mode="none"), torch.nn.functional.embedding(idx[:200], deq))


@pytest.mark.parametrize("place", PLACES)
def test_updates_are_refused_and_change_nothing(place: str, data: dict, tmp_path: Path) -> None:
    t = _table(place, tmp_path)
    t.load(data["w"].numpy())
    before = t.to_numpy()
    idx, off = data["idx"].numpy(), data["off"].numpy()
    grad = np.ones((len(off), DIM), np.float32)
    with pytest.raises(InvalidArgumentError, match="8-bit row-wise rows.*inference"):
        t.update(idx, off, grad, optimizer="sgd", lr=0.1)
    with pytest.raises(InvalidArgumentError, match="8-bit row-wise rows"):
        t.sparse_grad(idx, off, grad)
    np.testing.assert_array_equal(t.to_numpy(), before)


def test_a_table_file_of_int8_rows_reopens_as_such(data: dict, tmp_path: Path) -> None:
    path = tmp_path / "q.tm"
    t = EmbeddingTable(ROWS, DIM, dtype="int8", device=f"table:{path}", cache=1.0)
    t.load(data["w"].numpy())
    t.sync()
    rows = t.to_numpy()
    del t
    again = EmbeddingTable(ROWS, DIM, dtype="int8_rowwise", device=f"table:{path}", cache=0.5)
    assert again.attached and again.dtype == "int8_rowwise"
    np.testing.assert_array_equal(again.to_numpy(), rows)
    del again
    with pytest.raises(Exception, match="int8_rowwise"):
        EmbeddingTable(ROWS, DIM, dtype="float32", device=f"table:{path}", cache=0.5)


def test_the_storage_type_is_named() -> None:
    assert DTYPES["int8"] == "int8_rowwise"
    with pytest.raises(InvalidArgumentError, match="int8_rowwise"):
        EmbeddingTable(10, 4, dtype="int4")
