"""The core Criteo reader against the Python reference (``engine="python"``): the same
batches, positions, line and bad-line counts and reasons on files with every kind of
malformed line, under fuzzing; byte ranges that split a file between readers."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiermem.dlrm.data import CriteoFormatError, CriteoReader, line_ranges, write_criteo
from tiermem.exceptions import InvalidArgumentError

ROWS = [7 + 13 * k for k in range(26)]


def _line(label: str = "1", ints: list[str] | None = None, cats: list[str] | None = None) -> str:
    ints = ints if ints is not None else [str(k) for k in range(13)]
    cats = cats if cats is not None else [f"{k * 7919:08x}" for k in range(26)]
    return "\t".join([label, *ints, *cats])


def _with(field: int, value: str) -> str:
    cols = _line().split("\t")
    cols[field] = value
    return "\t".join(cols)


#: Lines the reference accepts in unusual forms, and lines it refuses for each reason.
ODD_LINES = [
    _with(1, " 12 "),
    _with(2, "-5"),
    _with(3, "1_000"),
    _with(4, "+007"),
    _with(5, "99999999999999999999"),  # 20 digits: more than 64 bits, still parsed
    _with(6, "-9223372036854775808"),
    _with(14, "0x_ff"),
    _with(15, "0XfF"),
    _with(16, "-0"),
    _with(17, "ffffffffffffffff"),
    _with(18, " a "),
    _with(1, ""),
    _with(20, ""),
    _with(0, "2"),  # bad label
    _with(0, " 1"),
    _with(0, ""),
    _with(1, "1.5"),  # bad integers
    _with(2, "0x10"),
    _with(3, "1__0"),
    _with(4, "_1"),
    _with(5, "123456789012345678901"),  # 21 digits
    _with(6, "+"),
    _with(7, "\x7f"),
    _with(14, "zz12"),  # bad hexadecimal
    _with(15, "-1"),
    _with(16, "0x"),
    _with(17, "11111111111111111"),  # 17 hex digits
    _with(18, "f__f"),
    _with(19, "it's"),
    _with(20, 'say "x"'),
    "1\t2\t3",  # too few columns
    _line() + "\textra",
    "",  # blank lines, not malformed
    "   ",
    "\t\t",
    _line() + "\r",
]


def _write(path: Path, lines: list[str], final_newline: bool = True) -> None:
    path.write_bytes(("\n".join(lines) + ("\n" if final_newline else "")).encode("latin-1"))


def _read(path: Path, engine: str, batch: int, **kw: object) -> tuple[list[tuple[torch.Tensor, ...]], list[int], dict]:
    r = CriteoReader(path, ROWS, batch, engine=engine, **kw)  # type: ignore[arg-type]
    out, positions = [], []
    for b in r:
        out.append((b.labels, b.dense, *b.indices))
        positions.append(r.position)
    return out, positions, {"lines": r.lines, "bad": r.bad, "examples": r.bad_examples, "position": r.position}


def _same(path: Path, batch: int, **kw: object) -> dict:
    core = _read(path, "core", batch, **kw)
    ref = _read(path, "python", batch, **kw)
    assert core[1] == ref[1] and core[2] == ref[2]
    assert len(core[0]) == len(ref[0])
    for a, b in zip(core[0], ref[0], strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    return core[2]


@pytest.mark.parametrize("batch", [1, 3, 64])
@pytest.mark.parametrize("keep_last", [False, True])
def test_core_reader_matches_the_reference_on_odd_and_malformed_lines(tmp_path: Path, batch: int, keep_last: bool) -> None:
    p = tmp_path / "odd.tsv"
    write_criteo(p, 40, seed=5)
    good = p.read_text().splitlines()
    lines = [x for pair in zip(good, ODD_LINES, strict=False) for x in pair] + good[len(ODD_LINES) :]
    lines.insert(3, "1\t" + "9" * 5000)  # longer than max_line
    _write(p, lines, final_newline=False)
    stats = _same(p, batch, keep_last=keep_last, max_line=4096)
    assert stats["bad"] == 20 and stats["lines"] == len(lines)  # 19 refused fields and lines, 1 long line
    assert "longer than 4096" in stats["examples"][0][1]


def test_bad_lines_stop_both_readers_with_the_same_message(tmp_path: Path) -> None:
    for k, bad in enumerate(ODD_LINES[13:31]):
        p = tmp_path / f"bad{k}.tsv"
        _write(p, [_line(), _line(), bad, _line()])
        msgs = []
        for engine in ("core", "python"):
            with pytest.raises(CriteoFormatError) as e:
                list(CriteoReader(p, ROWS, 1, bad_lines="error", engine=engine))
            msgs.append(str(e.value))
        assert msgs[0] == msgs[1] and "line 3 (from byte" in msgs[0], msgs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.lists(
            st.sampled_from(["", "0", "1", "-", "+", "_", " ", "x", "0x", "f", "9", "\r", "\x00", "\xff", "'", "\t"]), max_size=6
        ),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 39),
    st.integers(1, 5),
)
def test_fuzzed_fields_parse_alike(tmp_path: Path, pieces: list[list[str]], field: int, batch: int) -> None:
    lines = [_with(field, "".join(p)) for p in pieces]
    p = tmp_path / "fuzz.tsv"
    _write(p, lines)
    _same(p, batch)


def test_line_ranges_split_a_file_between_readers(tmp_path: Path) -> None:
    p = tmp_path / "day.tsv"
    write_criteo(p, 257, seed=9)
    whole = torch.cat([b.labels for b in CriteoReader(p, ROWS, 1)])
    dense = torch.cat([b.dense for b in CriteoReader(p, ROWS, 1)])
    size = p.stat().st_size
    for parts in (1, 2, 3, 7, 300):
        ranges = line_ranges(p, parts)
        assert ranges[0][0] == 0 and ranges[-1][1] == size
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
        for engine in ("core", "python"):
            got = [b for a, e in ranges for b in CriteoReader(p, ROWS, 1, start=a, end=e, engine=engine)]
            assert torch.equal(torch.cat([b.labels for b in got]), whole)
            assert torch.equal(torch.cat([b.dense for b in got]), dense)
    with pytest.raises(InvalidArgumentError, match="at least one range"):
        line_ranges(p, 0)
    with pytest.raises(InvalidArgumentError, match="before the start"):
        CriteoReader(p, ROWS, 1, start=10, end=5)
    with pytest.raises(InvalidArgumentError, match="engine"):
        CriteoReader(p, ROWS, 1, engine="fast")


def test_bench_criteo_reports_both_readers_alike() -> None:
    from tiermem.bench import criteo as bench_criteo

    res = bench_criteo.run(quick=True, lines=3000)
    assert res["identical"] and res["lines"] == 3000 and res["bad_lines"] == res["damaged_lines"] == 60
    assert res["core_lines_per_second"] > 0 and res["python_lines_per_second"] > 0
    assert "core / python" in bench_criteo.report(res)


@pytest.mark.parametrize("prefetch", [1, 3])
def test_batches_parsed_ahead_on_a_thread_are_the_batches_read_in_turn(tmp_path: Path, prefetch: int) -> None:
    p = tmp_path / "odd.tsv"
    write_criteo(p, 300, seed=9)
    good = p.read_text().splitlines()
    _write(p, [x for pair in zip(good, ODD_LINES * 10, strict=False) for x in pair])
    plain = _read(p, "core", 16)
    ahead = _read(p, "core", 16, prefetch=prefetch)
    # Positions, counts and examples describe the batches handed out, not those parsed ahead.
    assert ahead[1] == plain[1] and ahead[2] == plain[2] and len(ahead[0]) == len(plain[0]) > 5
    assert all(all(torch.equal(x, y) for x, y in zip(a, b, strict=True)) for a, b in zip(ahead[0], plain[0], strict=True))
    r = CriteoReader(p, ROWS, 16, prefetch=prefetch)
    it = iter(r)
    next(it)
    first = r.position
    it.close()  # stopping early stops the thread
    assert first == plain[1][0] and not any(t.name == "tiermem-criteo-prefetch" for t in threading.enumerate())
    with pytest.raises(CriteoFormatError) as e:
        list(CriteoReader(p, ROWS, 16, bad_lines="error", prefetch=prefetch))
    with pytest.raises(CriteoFormatError) as f:
        list(CriteoReader(p, ROWS, 16, bad_lines="error"))
    assert str(e.value) == str(f.value)
    with pytest.raises(InvalidArgumentError, match="prefetch must be an integer from 0 to 1024"):
        CriteoReader(p, ROWS, 16, prefetch=-1)
