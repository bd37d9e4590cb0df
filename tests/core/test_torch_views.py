"""PyTorch views: zero-copy tensors inside guards."""

from __future__ import annotations

import numpy as np
import pytest

import tiermem

torch = pytest.importorskip("torch")


def test_tensor_is_zero_copy_and_writes_persist(two_tier: tiermem.Manager) -> None:
    a = two_tier.array((64, 32), "float32", fill=0.0)
    with a.write("torch") as t:
        assert isinstance(t, torch.Tensor) and t.shape == (64, 32) and t.dtype == torch.float32
    with a.write("torch") as t:
        t += torch.arange(32, dtype=torch.float32)
        ptr = t.data_ptr()
        with pytest.raises(tiermem.GuardError):
            a.read().__enter__()
    # The tensor pointed at the array's memory: no copy was made.
    ticket, addr, _ = a._manager._native.open(a.id, False)
    a._manager._native.close(ticket)
    assert addr == ptr
    a.evict()
    expect = np.tile(np.arange(32, dtype="float32"), (64, 1))
    np.testing.assert_array_equal(a.to_numpy(), expect)
    with a.read("torch") as t:
        assert torch.equal(t, torch.from_numpy(expect))


def test_tensor_is_detached_when_the_guard_closes(two_tier: tiermem.Manager) -> None:
    a = two_tier.array(100, "float64", fill=1.0)
    with a.read("torch") as t:
        assert float(t.sum()) == 100.0
    assert t.numel() == 0  # no longer points into tiered memory


def test_differential_matmul_against_torch(two_tier: tiermem.Manager, rng: np.random.Generator) -> None:
    x = rng.standard_normal((48, 40)).astype("float32")
    w = rng.standard_normal((40, 24)).astype("float32")
    a = two_tier.array(x.shape, "float32")
    b = two_tier.array(w.shape, "float32", where="slow")
    with a.write() as v:
        v[...] = x
    with b.write() as v:
        v[...] = w
    with a.read("torch") as ta, b.read("torch") as tb:
        got = (ta @ tb).clone()
    torch.testing.assert_close(got, torch.from_numpy(x) @ torch.from_numpy(w))


def test_bad_kind_is_refused(two_tier: tiermem.Manager) -> None:
    a = two_tier.array(4)
    with pytest.raises(tiermem.InvalidArgumentError, match="kind"):
        a.read("jax")
