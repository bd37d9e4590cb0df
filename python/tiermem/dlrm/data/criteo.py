"""Streaming reader for the Criteo display-advertising TSV format (the Kaggle challenge's
``train.txt``, the Terabyte ``day_N`` files): per line, a 0/1 label, 13 integer features and
26 categorical features as 32-bit hexadecimal strings, tab-separated, any of the 39
features possibly empty.

As the DLRM reference preprocesses it: a missing integer is 0, negative integers are
clamped to 0, and each becomes ``log(x + 1)``; a categorical value is hashed into its table
(``int(hex, 16) % rows[t]``), a missing one is 0. The file is read in binary, one batch at a
time, so memory stays bounded whatever its size; :attr:`CriteoReader.position` is the byte
offset after the last batch handed out, from which a resumed run continues.

Parsing, hashing and batching run in the core (``engine="core"``, the default; the GIL is
released while a batch fills), or in Python (``engine="python"``, the reference the core is
tested against: the same batches, counts and reasons on any file). ``start``/``end`` bound
the lines read to those starting in a byte range, so that ranks given adjacent ranges from
:func:`line_ranges` read every line once.

Malformed lines (a wrong column count, a label other than 0/1, an integer or hexadecimal
field that does not parse or does not fit 64 bits, a line longer than ``max_line`` bytes) are
skipped and counted (``bad_lines="skip"``), or stop the read with :class:`CriteoFormatError`
naming the line and the reason (``bad_lines="error"``). A line is never held whole beyond
``max_line`` bytes, so memory stays bounded even for a file with no newline at all.
"""

from __future__ import annotations

import copy
import math
import os
import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from ... import _tiermem
from ...exceptions import InvalidArgumentError
from .batch import Batch

# The format's sizes, defined once in the core (``tiermem_core::criteo``).
INT_FEATURES: int = _tiermem.CRITEO["int_features"]
CAT_FEATURES: int = _tiermem.CRITEO["cat_features"]
COLUMNS = 1 + INT_FEATURES + CAT_FEATURES
#: Longest line read (bytes); real Criteo lines are a few hundred bytes.
MAX_LINE = 64 << 10
#: Longest integer field: an int64 in decimal with its sign.
_MAX_INT_DIGITS: int = _tiermem.CRITEO["max_int_digits"]
#: Longest categorical field: 64 bits in hexadecimal (the data has 32).
_MAX_HEX_DIGITS: int = _tiermem.CRITEO["max_hex_digits"]
#: Malformed lines whose reasons a reader keeps.
_EXAMPLES: int = _tiermem.CRITEO["examples"]


class CriteoFormatError(InvalidArgumentError):
    """A malformed line in a Criteo file read with ``bad_lines="error"``."""


def _parse(line: bytes, rows: Sequence[int]) -> tuple[float, list[float], list[int]]:
    """One line, or ValueError naming what is wrong."""
    cols = line.rstrip(b"\r\n").split(b"\t")
    if len(cols) != COLUMNS:
        raise ValueError(f"{len(cols)} columns, expected {COLUMNS}")
    label = cols[0]
    if label not in (b"0", b"1"):
        raise ValueError(f"label {label[:20]!r} is not 0 or 1")
    ints = []
    for k in range(1, 1 + INT_FEATURES):
        c = cols[k]
        if not c:
            ints.append(0.0)
            continue
        if len(c) > _MAX_INT_DIGITS:
            raise ValueError(f"integer feature {k} has {len(c)} digits (more than a 64-bit integer)")
        try:
            v = int(c)
        except ValueError:
            raise ValueError(f"integer feature {k} is {c[:20]!r}") from None
        ints.append(math.log(max(v, 0) + 1.0))
    cats = []
    for k in range(CAT_FEATURES):
        c = cols[1 + INT_FEATURES + k]
        if not c:
            cats.append(0)
            continue
        if len(c) > _MAX_HEX_DIGITS:
            raise ValueError(f"categorical feature {k + 1} has {len(c)} hex digits (more than 64 bits)")
        try:
            v = int(c, 16)
        except ValueError:
            raise ValueError(f"categorical feature {k + 1} is {c[:20]!r}, not hexadecimal") from None
        if v < 0:
            raise ValueError(f"categorical feature {k + 1} is negative")
        cats.append(v % rows[k])
    return float(label == b"1"), ints, cats


class CriteoReader:
    """Batches of ``batch_size`` samples from a Criteo TSV file.

    Args:
        path: the file.
        rows: rows per table (26 entries): categorical values are hashed into them.
        batch_size: samples per batch; the last, shorter batch is dropped unless
            ``keep_last`` (training wants equal batches).
        bad_lines: ``"skip"`` (count them, see :attr:`bad`) or ``"error"``.
        start: byte offset to start from (a checkpoint's :attr:`position`, or a bound from
            :func:`line_ranges`).
        end: read only lines that start before this byte offset (default: the whole file).
        max_line: longest line in bytes; a longer one is a malformed line.
        engine: ``"core"`` (parsed in the core) or ``"python"`` (the reference).
        prefetch: batches parsed ahead on a background thread (0: none). The core parser
            releases the GIL, so they are parsed while the caller trains; :attr:`position`,
            :attr:`lines` and :attr:`bad` still describe the batches handed out.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        rows: Sequence[int],
        batch_size: int,
        *,
        bad_lines: str = "skip",
        start: int = 0,
        keep_last: bool = False,
        max_line: int = MAX_LINE,
        end: int | None = None,
        engine: str = "core",
        prefetch: int = 0,
    ) -> None:
        if not isinstance(max_line, int) or not 256 <= max_line <= 1 << 30:
            raise InvalidArgumentError(f"max_line must be an integer from 256 to 2**30 bytes, got {max_line!r}")
        if len(rows) != CAT_FEATURES:
            raise InvalidArgumentError(f"Criteo has {CAT_FEATURES} categorical features; got {len(rows)} table sizes")
        if any(int(r) < 1 for r in rows):
            raise InvalidArgumentError("every table needs at least one row")
        if batch_size < 1:
            raise InvalidArgumentError(f"batch_size must be at least 1, got {batch_size}")
        if bad_lines not in ("skip", "error"):
            raise InvalidArgumentError(f"bad_lines {bad_lines!r}: choose 'skip' or 'error'")
        if not os.path.isfile(path):
            raise InvalidArgumentError(f"Criteo file {os.fspath(path)!r} does not exist")
        size = os.path.getsize(path)
        if not 0 <= start <= size:
            raise InvalidArgumentError(f"start offset {start} is outside the file's {size} bytes")
        if end is not None and not start <= end:
            raise InvalidArgumentError(f"end offset {end} is before the start offset {start}")
        if engine not in ("core", "python"):
            raise InvalidArgumentError(f"engine {engine!r}: choose 'core' or 'python'")
        if not isinstance(prefetch, int) or not 0 <= prefetch <= 1024:
            raise InvalidArgumentError(f"prefetch must be an integer from 0 to 1024 batches, got {prefetch!r}")
        self.prefetch = prefetch
        self.end = None if end is None else min(int(end), size)
        self.engine = engine
        self.path = os.fspath(path)
        self.rows = [int(r) for r in rows]
        self.batch_size = int(batch_size)
        self.bad_lines = bad_lines
        self.keep_last = keep_last
        self.max_line = max_line
        #: Byte offset after the last batch handed out.
        self.position = int(start)
        #: Lines read (good and bad) since ``start``.
        self.lines = 0
        #: Malformed lines skipped.
        self.bad = 0
        #: The first few skipped lines as ``(line number from start, reason)``.
        self.bad_examples: list[tuple[int, str]] = []

    def __iter__(self) -> Iterator[Batch]:
        if self.prefetch:
            return self._iter_ahead()
        return self._iter_core() if self.engine == "core" else self._iter_python()

    def _state(self) -> tuple[int, int, int, list[tuple[int, str]]]:
        return self.position, self.lines, self.bad, list(self.bad_examples)

    def _iter_ahead(self) -> Iterator[Batch]:
        """Batches parsed by a reader of the same file on a background thread, up to
        ``prefetch`` ahead; each carries that reader's state after it, which becomes this
        reader's as the batch is handed out. Stopping early stops the thread."""
        shadow = copy.copy(self)  # the same file, range and settings, from here
        shadow.prefetch, shadow.lines, shadow.bad, shadow.bad_examples = 0, 0, 0, []
        lines0, bad0, examples0 = self.lines, self.bad, list(self.bad_examples)
        q: queue.Queue[tuple[Batch | BaseException | None, tuple[int, int, int, list[tuple[int, str]]]]] = queue.Queue(
            self.prefetch
        )
        stop = threading.Event()

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            try:
                for b in shadow:
                    if not put((b, shadow._state())):
                        return
                put((None, shadow._state()))
            except BaseException as e:  # handed to the consumer, which raises it
                put((e, shadow._state()))

        t = threading.Thread(target=produce, name="tiermem-criteo-prefetch", daemon=True)
        t.start()
        try:
            while True:
                item, (pos, lines, bad, examples) = q.get()
                self.position, self.lines, self.bad = pos, lines0 + lines, bad0 + bad
                self.bad_examples = (examples0 + [(lines0 + k, why) for k, why in examples])[:_EXAMPLES]
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            t.join()

    def _iter_core(self) -> Iterator[Batch]:
        b = self.batch_size
        labels = np.empty(b, np.float32)
        dense = np.empty((b, INT_FEATURES), np.float32)
        cats = np.empty((CAT_FEATURES, b), np.int64)
        p = _tiermem.CriteoParser(self.path, self.rows, self.position, self.end, self.max_line, self.bad_lines == "error")
        lines0, bad0, examples0 = self.lines, self.bad, list(self.bad_examples)
        while True:
            n, pos, lines, bad, failed = p.fill(labels, dense, cats)
            self.lines, self.bad = lines0 + lines, bad0 + bad
            if bad:
                self.bad_examples = (examples0 + [(lines0 + k, why) for k, why in p.examples()])[:_EXAMPLES]
            if failed is not None:
                raise CriteoFormatError(f"{self.path}: line {lines0 + failed[0]} (from byte {self.position}): {failed[1]}")
            if n == b:
                self.position = pos
                yield self._batch(labels, dense, cats, n)
                continue
            if n and self.keep_last:
                self.position = pos
                yield self._batch(labels, dense, cats, n)
            elif not n:
                self.position = pos
            return

    def _iter_python(self) -> Iterator[Batch]:
        b = self.batch_size
        labels = np.empty(b, np.float32)
        dense = np.empty((b, INT_FEATURES), np.float32)
        cats = np.empty((CAT_FEATURES, b), np.int64)
        n = 0
        with open(self.path, "rb") as f:
            f.seek(self.position)
            pos = self.position
            for line, used in _bounded_lines(f, self.max_line):
                if self.end is not None and pos >= self.end:
                    break
                pos += used
                self.lines += 1
                if line is not None and not line.strip():
                    continue
                try:
                    if line is None:
                        raise ValueError(f"line longer than {self.max_line} bytes (max_line)")
                    lab, ints, cs = _parse(line, self.rows)
                except ValueError as e:
                    if self.bad_lines == "error":
                        raise CriteoFormatError(f"{self.path}: line {self.lines} (from byte {self.position}): {e}") from None
                    self.bad += 1
                    if len(self.bad_examples) < _EXAMPLES:
                        self.bad_examples.append((self.lines, str(e)))
                    continue
                labels[n] = lab
                dense[n] = ints
                cats[:, n] = cs
                n += 1
                if n == b:
                    self.position = pos
                    yield self._batch(labels, dense, cats, n)
                    n = 0
            if n and self.keep_last:
                self.position = pos
                yield self._batch(labels, dense, cats, n)
            elif not n:
                self.position = pos

    @staticmethod
    def _batch(labels: np.ndarray, dense: np.ndarray, cats: np.ndarray, n: int) -> Batch:
        offs = torch.arange(n + 1, dtype=torch.int64)
        return Batch(
            torch.from_numpy(dense[:n].copy()),
            [torch.from_numpy(c[:n].copy()) for c in cats],
            [offs] * CAT_FEATURES,
            torch.from_numpy(labels[:n].copy()),
        )

    def report(self) -> dict[str, Any]:
        """Lines read, malformed lines skipped and examples of them."""
        return {"lines": self.lines, "bad_lines": self.bad, "examples": list(self.bad_examples)}


def line_ranges(path: str | os.PathLike[str], parts: int) -> list[tuple[int, int]]:
    """``parts`` adjacent byte ranges ``(start, end)`` covering a file, each starting at a
    line start: readers given them (``CriteoReader(..., start=, end=)``) read every line
    once, rank ``r`` the ``r``-th."""
    if parts < 1:
        raise InvalidArgumentError(f"a file splits into at least one range, got {parts}")
    return [(int(a), int(b)) for a, b in _tiermem.criteo_ranges(os.fspath(path), int(parts))]


def _bounded_lines(f: Any, limit: int) -> Iterator[tuple[bytes | None, int]]:
    """``(line, bytes consumed)`` per line, holding at most ``limit + 1`` bytes of one line;
    a longer line is ``(None, its length)``, its rest read and dropped in chunks."""
    while True:
        line = f.readline(limit + 1)
        if not line:
            return
        if len(line) <= limit or line.endswith(b"\n"):
            yield line, len(line)
            continue
        used = len(line)
        while True:
            rest = f.readline(1 << 20)
            used += len(rest)
            if not rest or rest.endswith(b"\n"):
                break
        yield None, used


def write_criteo(path: str | os.PathLike[str], samples: int, seed: int = 0, missing: float = 0.05) -> None:
    """Write ``samples`` lines of synthetic data in the Criteo format (for tests and demos;
    some fields left empty with probability ``missing``)."""
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="ascii") as f:
        for _ in range(samples):
            ints = rng.integers(-2, 1000, INT_FEATURES)
            cats = rng.integers(0, 1 << 32, CAT_FEATURES, dtype=np.uint64)
            hit = rng.random(COLUMNS - 1) < missing
            fields = [str(int(rng.random() < 0.25))]
            fields += ["" if hit[k] else str(int(v)) for k, v in enumerate(ints)]
            fields += ["" if hit[INT_FEATURES + k] else f"{int(v):08x}" for k, v in enumerate(cats)]
            f.write("\t".join(fields) + "\n")
