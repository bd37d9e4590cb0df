"""``tiermem stress``: random mixes of the public operations on several threads, checked
against a plain-NumPy shadow model, under a watchdog.

Every worker draws operations at random from one shared set of structures: tiered arrays on
an LRU manager whose DRAM holds a fraction of them (so guards, moves and evictions race), a
Python-policy manager, embedding tables (dynamic, admit and static caches, and a direct one)
in collections named in different orders (so lookups, updates, flushes and reclaims race),
guards of every kind (NumPy, torch, overwrite, views that outlive their guard), and
checkpoints written and read back. What must hold whatever the schedule:

- every read guard sees the value the last write guard left (the shadow's);
- every lookup equals the same lookup on the shadow rows (updates run with ``lr=0``, so
  rows keep their values while every update path runs);
- no operation raises anything but the errors its race allows (``GuardError`` when another
  guard holds the array, ``PinnedError`` for a move of a guarded array, ``AllPinnedError``
  / ``DeviceFullError`` when everything in fast memory is pinned);
- ``Manager.check()`` passes at the end, and every array's bytes equal the shadow's;
- no thread goes 10 s without finishing an operation (else every thread's stack is printed
  and the run fails: a hang).
"""

from __future__ import annotations

import faulthandler
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .exceptions import (
    AllPinnedError,
    DeviceFullError,
    GuardError,
    InvalidArgumentError,
    PinnedError,
)
from .manager import Manager
from .report.output import show

#: Errors a race may legitimately produce.
EXPECTED = (GuardError, PinnedError, AllPinnedError, DeviceFullError)
#: Seconds without any finished operation after which the run counts as hung.
WATCHDOG_SECONDS = 10.0

ROWS, WIDTH = 4000, 16


@dataclass
class Report:
    """What a stress run did and found."""

    seconds: float = 0.0
    threads: int = 0
    ops: Counter = field(default_factory=Counter)
    expected_errors: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "threads": self.threads,
            "ops": dict(self.ops),
            "total_ops": sum(self.ops.values()),
            "expected_errors": dict(self.expected_errors),
            "failures": self.failures,
            "ok": self.ok,
        }


class _Slot:
    """One array and its shadow value (the fill of its last write guard)."""

    def __init__(self, m: Manager, n: int, value: int) -> None:
        self.array = m.array(n, "uint32", fill=value)
        self.value = value


class _World:
    def __init__(self, seed: int, scratch: str) -> None:
        self.rng = np.random.default_rng(seed)
        self.m = Manager({"dram": "2 MiB", "emulated:cxl": "64 MiB"}, policy="lru")
        self.slots = [_Slot(self.m, int(n), i) for i, n in enumerate(self.rng.integers(1 << 14, 1 << 17, 24))]
        from .embedding import EmbeddingCollection, EmbeddingTable
        from .policies import FifoPolicy

        self.pm = Manager({"dram": "1 MiB", "emulated:cxl": "16 MiB"}, policy=FifoPolicy())
        self.pslots = [_Slot(self.pm, 1 << 15, 100 + i) for i in range(8)]
        self.tm = Manager({"dram": "8 MiB", "emulated:optane-pmem": "64 MiB"}, policy="lru")
        self.rows = self.rng.standard_normal((ROWS, WIDTH)).astype(np.float32)
        self.tables = [
            EmbeddingTable(ROWS, WIDTH, manager=self.tm, cache=0.02, cacheslack=0.01, policy="dynamic"),
            EmbeddingTable(ROWS, WIDTH, manager=self.tm, cache=0.02, cacheslack=0.01, policy="admit"),
            EmbeddingTable(ROWS, WIDTH, manager=self.tm, cache=0.1, policy="static"),
            EmbeddingTable(ROWS, WIDTH, manager=self.tm, device=1),
            EmbeddingTable(ROWS, WIDTH, manager=self.tm, device=0),
        ]
        for t in self.tables:
            t.load(self.rows)
        # Tables in different orders, so lock ordering is exercised. Each keeps one kind of
        # optimizer state (a checkpoint streams it while updates run).
        self.colls = [
            EmbeddingCollection(self.tables[:4]),
            EmbeddingCollection(self.tables[3::-1]),
            EmbeddingCollection([self.tables[1], self.tables[3]]),
            EmbeddingCollection(self.tables[4:]),
        ]
        self.optimizer = ["sgd", "adagrad", "sgd", "rowwise_adagrad"]
        self.scratch = scratch
        self.values = 10_000  # fresh fill values come from here (under the GIL)

    def fresh(self) -> int:
        self.values += 1
        return self.values


def _op_write(w: _World, r: random.Random) -> str:
    s = r.choice(w.slots)
    v = w.fresh()
    kind = r.choice(("numpy", "plain", "overwrite", "torch"))
    if kind == "numpy":
        with s.array.write() as view:
            view[:] = v
            s.value = v
    elif kind == "overwrite":
        with s.array.write(overwrite=True) as view:
            view.fill(v)
            s.value = v
    elif kind == "torch":
        with s.array.write("torch") as t:
            t.view(-1)[:] = v
            s.value = v
    else:
        with s.array.write() as view:
            np.asarray(view)[:] = v  # a plain view used inside its guard only
            s.value = v
    return f"write_{kind}"


def _op_read(w: _World, r: random.Random) -> str:
    s = r.choice(w.slots)
    with s.array.read() as view:
        want = s.value
        if not (view[0] == want and view[-1] == want and (view == want).all()):
            raise AssertionError(f"array {s.array.id}: read {int(view[0])}..{int(view[-1])}, shadow {want}")
    return "read"


def _op_escape(w: _World, r: random.Random) -> str:
    """A view derived inside a guard that outlives it holds the array where it is: a move is
    refused while the view lives, whatever the other threads do."""
    s = r.choice(w.slots)
    with s.array.read() as view:
        kept = np.asarray(view)[:16]
    try:
        s.array.evict()
        raise AssertionError(f"array {s.array.id} was evicted while a view of it was held")
    except PinnedError:
        pass
    del kept
    return "escape_view"


def _op_move(w: _World, r: random.Random) -> str:
    s = r.choice(w.slots)
    how = r.choice(("evict", "prefetch", "force", "softevict"))
    a = s.array
    {"evict": a.evict, "prefetch": a.prefetch, "force": lambda: a.prefetch(force=True), "softevict": a.softevict}[how]()
    return how


def _op_policy(w: _World, r: random.Random) -> str:
    s = r.choice(w.pslots)
    if r.random() < 0.5:
        v = w.fresh()
        with s.array.write() as view:
            view[:] = v
            s.value = v
        return "python_policy_write"
    with s.array.read() as view:
        if not (view == s.value).all():
            raise AssertionError(f"python-policy array {s.array.id}: bytes differ from the shadow")
    return "python_policy_read"


def _bags(r: random.Random, n: int) -> tuple[np.ndarray, np.ndarray]:
    vals = np.array([r.randrange(ROWS) for _ in range(n * 4)], np.int64)
    return vals, np.arange(0, n * 4 + 1, 4, dtype=np.int64)


def _op_lookup(w: _World, r: random.Random) -> str:
    c = r.choice(w.colls)
    bags = [_bags(r, 32) for _ in c.tables]
    out = c.lookup(bags)
    col = 0
    for (vals, _), t in zip(bags, c.tables):
        want = w.rows[vals].reshape(32, 4, WIDTH).sum(axis=1)
        got = out[:, col : col + WIDTH]
        if not np.allclose(got, want, rtol=1e-5, atol=1e-5):
            raise AssertionError(f"lookup on {t!r} differs from the shadow rows")
        col += WIDTH
    return "lookup"


def _op_update(w: _World, r: random.Random) -> str:
    k = r.randrange(len(w.colls))
    c, opt = w.colls[k], w.optimizer[k]
    bags = [_bags(r, 16) for _ in c.tables]
    c.update(bags, np.ones((16, c.width), np.float32), optimizer=opt, lr=0.0)
    return f"update_{opt}"


def _op_flush(w: _World, r: random.Random) -> str:
    t = r.choice(w.tables[:3])
    t.flush(write_back=True)  # flush_clean refuses dirty rows, which lr=0 updates still make
    return "flush"


def _op_checkpoint(w: _World, r: random.Random) -> str:
    from . import checkpoint
    from .embedding import EmbeddingTable

    t = r.choice(w.tables)
    path = os.path.join(w.scratch, f"ck-{threading.get_ident()}.bin")
    checkpoint.save(path, {"n": 1}, {"t": t})
    back = EmbeddingTable(ROWS, WIDTH)
    checkpoint.Checkpoint(path).restore_table("t", back)
    if not np.array_equal(back.to_numpy(), w.rows):
        raise AssertionError("a checkpoint's rows differ from the shadow")
    return "checkpoint"


OPS = [
    (_op_write, 4),
    (_op_read, 5),
    (_op_escape, 1),
    (_op_move, 3),
    (_op_policy, 2),
    (_op_lookup, 3),
    (_op_update, 2),
    (_op_flush, 1),
    (_op_checkpoint, 0.2),
]


def run(seconds: float, threads: int, seed: int = 0, progress: Any = None) -> Report:
    """Run the stress test; returns what it did and any failure (see the module doc)."""
    if not 0 < seconds <= 24 * 3600:
        raise InvalidArgumentError(f"seconds must be in (0, 86400], got {seconds!r}")
    if not 1 <= threads <= 256:
        raise InvalidArgumentError(f"threads must be from 1 to 256, got {threads!r}")
    rep = Report(threads=threads)
    with tempfile.TemporaryDirectory(prefix="tiermem-stress-") as scratch:
        w = _World(seed, scratch)
        stop = threading.Event()
        last = [time.monotonic()]
        lock = threading.Lock()
        funcs, weights = zip(*OPS)

        def worker(k: int) -> None:
            r = random.Random(seed * 1000 + k)
            while not stop.is_set():
                f = r.choices(funcs, weights)[0]
                try:
                    name = f(w, r)
                    with lock:
                        rep.ops[name] += 1
                except EXPECTED as e:
                    with lock:
                        rep.expected_errors[f"{f.__name__[4:]}: {type(e).__name__}"] += 1
                except BaseException as e:
                    with lock:
                        rep.failures.append(f"thread {k}, {f.__name__[4:]}: {type(e).__name__}: {e}")
                    stop.set()
                last[0] = time.monotonic()

        ts = [threading.Thread(target=worker, args=(k,), name=f"stress-{k}", daemon=True) for k in range(threads)]
        t0 = time.monotonic()
        for t in ts:
            t.start()
        while not stop.is_set():
            time.sleep(0.2)
            now = time.monotonic()
            if progress is not None:
                progress(now - t0, sum(rep.ops.values()))
            if now - t0 >= seconds:
                break
            if now - last[0] > WATCHDOG_SECONDS:
                rep.failures.append(f"hang: no operation finished in {WATCHDOG_SECONDS:.0f} s; stacks follow")
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                break
        stop.set()
        for t in ts:
            t.join(WATCHDOG_SECONDS)
            if t.is_alive():
                rep.failures.append(f"hang: {t.name} did not stop within {WATCHDOG_SECONDS:.0f} s")
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                break
        rep.seconds = time.monotonic() - t0
        if not any(t.is_alive() for t in ts):
            _final_checks(w, rep)
    return rep


def _final_checks(w: _World, rep: Report) -> None:
    for m in (w.m, w.pm, w.tm):
        try:
            m.check()
        except AssertionError as e:
            rep.failures.append(f"check(): {e}")
    for s in w.slots + w.pslots:
        got = s.array.to_numpy()
        if not (got == s.value).all():
            rep.failures.append(f"array {s.array.id}: contents differ from the shadow at the end")
    for t in w.tables:
        if not np.array_equal(t.to_numpy(), w.rows):
            rep.failures.append(f"{t!r}: rows differ from the shadow at the end")


def main_cli(args: Any) -> int:
    """``tiermem stress``."""
    from ._files import write_json_atomic
    from .report.progress import Progress

    steps = max(1, int(args.seconds))
    with Progress(steps, f"stress ({args.threads} threads)") as p:
        done = [0]

        def tick(elapsed: float, ops: int) -> None:
            while done[0] < min(int(elapsed), steps):
                done[0] += 1
                p.step(f"{ops} ops")

        rep = run(args.seconds, args.threads, args.seed, tick)
    out = rep.to_json()
    show(f"tiermem stress: {out['total_ops']} operations in {rep.seconds:.1f} s on {rep.threads} threads")
    for name, n in sorted(rep.ops.items()):
        show(f"  {name:22s} {n}")
    if rep.expected_errors:
        show("  refused as the races allow: " + ", ".join(f"{k} x{v}" for k, v in sorted(rep.expected_errors.items())))
    if args.json:
        write_json_atomic(args.json, out)
        show(f"wrote {args.json}")
    if rep.failures:
        show("FAILED:\n  " + "\n  ".join(rep.failures), err=True)
        return 1
    show("clean: no hang, no panic, check() passed, every array and table equals its shadow")
    return 0
