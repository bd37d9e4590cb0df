"""A Hypothesis state machine over the public Python API against a plain-NumPy model:
managers (built-in and Python policies), arrays, guards held open across steps and closed in
any order (twice, too), views that outlive their guard, moves, tables and collections
(lookups, fused updates, flushes), and checkpoints. After every step the manager's
invariants hold (`check()`), and every read equals the model."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, precondition, rule

import tiermem
from tiermem import checkpoint
from tiermem.embedding import EmbeddingCollection, EmbeddingTable
from tiermem.policies import FifoPolicy

ROWS, WIDTH = 200, 8
MOVE_ERRORS = (tiermem.PinnedError, tiermem.DeviceFullError, tiermem.AllPinnedError)


class TieredApi(RuleBasedStateMachine):
    arrays = Bundle("arrays")

    @initialize(policy=st.sampled_from([*tiermem.BUILTIN_POLICIES, "python-fifo"]))
    def start(self, policy: str) -> None:
        pol: Any = FifoPolicy() if policy == "python-fifo" else policy
        self.m = tiermem.Manager({"dram": "256 KiB", "emulated:cxl": "4 MiB"}, policy=pol)
        self.model: dict[int, np.ndarray] = {}  # array id -> its bytes
        self.open: list[tuple[Any, Any, tiermem.TieredArray, bool]] = []  # (guard, view, array, write)
        self.closed: list[Any] = []
        self.kept: list[Any] = []  # views that outlived their guard
        self.tm = tiermem.Manager({"dram": "1 MiB", "emulated:cxl": "4 MiB"})
        rng = np.random.default_rng(0)
        self.rows = rng.standard_normal((ROWS, WIDTH)).astype(np.float32)
        self.tables = [
            EmbeddingTable(ROWS, WIDTH, manager=self.tm, cache=0.1, policy="dynamic"),
            EmbeddingTable(ROWS, WIDTH, manager=self.tm, device=1),
        ]
        for t in self.tables:
            t.load(self.rows)
        self.dir = tempfile.mkdtemp(prefix="tiermem-sm-")

    def teardown(self) -> None:
        for g, _, _, _ in getattr(self, "open", []):
            g.__exit__(None, None, None)
        self.kept = []

    def _pinned(self, a: tiermem.TieredArray) -> bool:
        return any(x is a for _, _, x, _ in self.open)

    @rule(target=arrays, n=st.integers(1, 70_000), where=st.sampled_from(["auto", "fast", "slow"]), fill=st.integers(0, 255))
    def new(self, n: int, where: str, fill: int) -> Any:
        try:
            a = self.m.array(n, "uint8", where=where, fill=fill)
        except MOVE_ERRORS:
            return None
        self.model[a.id] = np.full(n, fill, np.uint8)
        return a

    @rule(a=arrays, value=st.integers(0, 255), overwrite=st.booleans(), kind=st.sampled_from(["numpy", "torch"]))
    def write(self, a: Any, value: int, overwrite: bool, kind: str) -> None:
        if a is None or a.id not in self.model:
            return
        if kind == "torch":
            pytest.importorskip("torch")
        try:
            with a.write(kind, overwrite=overwrite) as v:
                v[:] = value
        except tiermem.GuardError:
            assert self._pinned(a), "a write guard was refused with no other guard open"
            return
        except MOVE_ERRORS:
            return
        self.model[a.id][:] = value

    @rule(a=arrays)
    def read(self, a: Any) -> None:
        if a is None or a.id not in self.model:
            return
        try:
            with a.read() as v:
                assert np.array_equal(np.asarray(v), self.model[a.id])
        except tiermem.GuardError:
            assert any(x is a and w for _, _, x, w in self.open), "a read guard was refused with no writer"
        except MOVE_ERRORS:
            pass

    @rule(a=arrays, write=st.booleans())
    def open_guard(self, a: Any, write: bool) -> None:
        if a is None or a.id not in self.model or len(self.open) > 3:
            return
        g = a.write() if write else a.read()
        try:
            v = g.__enter__()
        except (tiermem.GuardError, *MOVE_ERRORS):
            return
        self.open.append((g, v, a, write))

    @precondition(lambda self: self.open)
    @rule(k=st.integers(0, 3), keep=st.booleans())
    def close_guard(self, k: int, keep: bool) -> None:
        g, v, a, write = self.open.pop(k % len(self.open))
        if write:
            v[:] = 77
            self.model[a.id][:] = 77
        if keep:
            self.kept.append(np.asarray(v)[:4])  # a plain view that outlives the guard
        del v
        g.__exit__(None, None, None)
        self.closed.append(g)

    @precondition(lambda self: self.closed)
    @rule(k=st.integers(0, 10))
    def close_twice(self, k: int) -> None:
        with pytest.raises(tiermem.GuardError):
            self.closed[k % len(self.closed)].__exit__(None, None, None)

    @rule()
    def drop_kept(self) -> None:
        self.kept = []

    @rule(a=arrays, how=st.sampled_from(["evict", "prefetch", "force", "softevict", "free"]))
    def move(self, a: Any, how: str) -> None:
        if a is None or a.id not in self.model:
            return
        try:
            if how == "evict":
                a.evict()
            elif how == "prefetch":
                a.prefetch()
            elif how == "force":
                a.prefetch(force=True)
            elif how == "softevict":
                a.softevict()
            else:
                a.free()
                del self.model[a.id]
        except MOVE_ERRORS:
            pass

    @rule(order=st.booleans(), n=st.integers(1, 20), data=st.data())
    def lookup(self, order: bool, n: int, data: Any) -> None:
        tabs = self.tables if order else self.tables[::-1]
        idx = np.array(data.draw(st.lists(st.integers(0, ROWS - 1), min_size=2 * n, max_size=2 * n)), np.int64)
        out = EmbeddingCollection(tabs).lookup([(idx, np.arange(0, 2 * n + 1, 2))] * 2)
        want = self.rows[idx].reshape(n, 2, WIDTH).sum(axis=1)
        np.testing.assert_allclose(out[:, :WIDTH], want, rtol=1e-5, atol=1e-5)

    @rule(n=st.integers(1, 10))
    def update_lr0(self, n: int) -> None:
        idx = np.arange(n, dtype=np.int64) % ROWS
        EmbeddingCollection(self.tables).update(
            [(idx, np.arange(n + 1))] * 2, np.ones((n, 2 * WIDTH), np.float32), optimizer="adagrad", lr=0.0
        )

    @rule()
    def flush(self) -> None:
        self.tables[0].flush(True)

    @rule()
    def checkpoint_roundtrip(self) -> None:
        path = os.path.join(self.dir, "ck.bin")
        checkpoint.save(path, {"k": 1}, {"t": self.tables[0]})
        back = EmbeddingTable(ROWS, WIDTH)
        checkpoint.Checkpoint(path).restore_table("t", back)
        assert np.array_equal(back.to_numpy(), self.rows)

    @invariant()
    def consistent(self) -> None:
        if hasattr(self, "m"):
            self.m.check()
            self.tm.check()


TieredApi.TestCase.settings = settings(
    max_examples=30, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_public_api_state_machine = TieredApi.TestCase
