"""The HPC kernels over tiered arrays (tiermem.hpc.kernels): each against NumPy, the same results
whatever staging does, the staging executor's moves and fallbacks, the calibration's shape,
and bad input."""

from __future__ import annotations

import numpy as np
import pytest

import tiermem
from tiermem.exceptions import InvalidArgumentError
from tiermem.hpc import kernels, matrices, staging

SLOW = "emulated:optane-pmem"


def _manager(fast: str = "64 MiB", policy: str = "lru_in_place") -> tiermem.Manager:
    return tiermem.Manager({"dram": fast, SLOW: "256 MiB"}, policy)


def _hpcc_reference(n: int, updates: int) -> np.ndarray:
    table = np.arange(n, dtype=np.uint64)
    x = 1
    for _ in range(updates):
        x = ((x << 1) & (2**64 - 1)) ^ (7 if x >> 63 else 0)
        table[x & (n - 1)] ^= np.uint64(x)
    return table


def _jacobi_reference(u: np.ndarray, sweeps: int) -> np.ndarray:
    inner = tuple(slice(1, -1) for _ in u.shape)
    for _ in range(sweeps):
        v = u.copy()
        acc = u[inner].copy()
        for ax in range(u.ndim):
            for d in (-1, 1):
                sl = list(inner)
                sl[ax] = slice(1 + d, u.shape[ax] - 1 + d)
                acc += u[tuple(sl)]
        v[inner] = acc / (2 * u.ndim + 1)
        u = v
    return u


def _csr_dense(rowptr: np.ndarray, cols: np.ndarray, vals: np.ndarray, ncols: int) -> np.ndarray:
    dense = np.zeros((len(rowptr) - 1, ncols))
    rows = np.repeat(np.arange(len(rowptr) - 1), np.diff(rowptr.astype(np.int64)))
    np.add.at(dense, (rows, cols.astype(np.int64)), vals)
    return dense


def test_random_access_matches_hpcc_serial_stream() -> None:
    k = kernels.random_access(_manager(), 1 << 12)
    k.run()
    assert (k.arrays["table"].to_numpy() == _hpcc_reference(1 << 12, 4 << 12)).all()


def test_ptrans_jacobi_fft_dgemm_match_numpy() -> None:
    m = _manager()
    k = kernels.ptrans(m, 130)
    k.run()
    a, b, c = (k.arrays[n].to_numpy() for n in "abc")
    np.testing.assert_allclose(c, a.T + b)
    for dims, sweeps in (((37, 41), 3), ((11, 13, 17), 2)):
        k = kernels.jacobi(m, dims, sweeps=sweeps)
        u0 = k.arrays["u"].to_numpy()
        k.run()
        out = k.arrays["v" if sweeps % 2 else "u"].to_numpy()
        np.testing.assert_allclose(out, _jacobi_reference(u0, sweeps))
    k = kernels.fft(m, 1 << 11)
    d0 = k.arrays["data"].to_numpy()
    k.run()
    np.testing.assert_allclose(k.arrays["data"].to_numpy(), np.fft.fft(d0), rtol=1e-9, atol=1e-9)
    k = kernels.dgemm(m, 70)
    k.run()
    k.run()
    np.testing.assert_allclose(k.arrays["c"].to_numpy(), 2 * k.arrays["a"].to_numpy() @ k.arrays["b"].to_numpy())


@pytest.mark.parametrize("structure", matrices.STRUCTURES)
def test_spmv_matches_numpy_on_every_structure(structure: str) -> None:
    rowptr, cols, n = matrices.generate(structure, 600, row_scale=0.5)
    assert rowptr[0] == 0 and (np.diff(rowptr.astype(np.int64)) >= 0).all() and rowptr[-1] == len(cols)
    assert len(rowptr) == 301 and cols.max() < n
    k = kernels.spmv(_manager(), (rowptr, cols, n), reps=2)
    k.run()
    dense = _csr_dense(rowptr, cols, k.arrays["vals"].to_numpy(), n)
    np.testing.assert_allclose(k.arrays["y"].to_numpy(), dense @ k.arrays["x"].to_numpy())


def test_every_table2_matrix_generates() -> None:
    for name in matrices.TABLE2:
        rowptr, cols, n = matrices.generate(name, 4096, row_scale=1 / 32, max_per_row=16)
        assert len(rowptr) == 4096 // 32 + 1 and len(cols) == rowptr[-1] and cols.max() < n


@pytest.mark.parametrize("mode", ["slow_only", "always_stage", "pattern_aware"])
def test_results_do_not_depend_on_staging(mode: str) -> None:
    m = _manager()
    line = staging.BreakEven((2.0, 1.0, 0.1), (2.0, 1.0, 0.1), (2.0, 1.0, 0.1), 0.1, 0.1)
    k = kernels.fft(m, 1 << 12)
    d0 = k.arrays["data"].to_numpy()
    rep = k.staged(mode, line)
    np.testing.assert_allclose(k.arrays["data"].to_numpy(), np.fft.fft(d0), rtol=1e-9, atol=1e-9)
    assert rep["staged"] == (mode != "slow_only")  # FFT's pattern pays on this line
    assert k.arrays["data"].device == SLOW  # staged data goes home after the kernel
    if mode == "pattern_aware":
        assert 0 <= rep["rates"]["r_paf"] <= 1 and 0 <= rep["rates"]["r_sf"] <= 1 and rep["decision"]["stage"]
    m.check()


def test_read_only_target_is_dropped_not_copied_back() -> None:
    m = _manager()
    k = kernels.ptrans(m, 256)  # the target `a` is only read
    m.reset_stats()
    rep = k.staged("always_stage")
    assert rep["staged"] and not rep["write"]
    # The slow device wrote only c (the output), never a copy of a back.
    assert m.stats()[SLOW]["bytes_written"] == 256 * 256 * 8
    a = k.arrays["a"]
    assert a.device == SLOW and not a.placement["dirty"]


def test_written_target_is_copied_back() -> None:
    m = _manager()
    k = kernels.random_access(m, 1 << 12)
    rep = k.staged("always_stage")
    assert rep["staged"] and rep["copy_back_seconds"] > 0
    assert (k.arrays["table"].to_numpy() == _hpcc_reference(1 << 12, 4 << 12)).all()


def test_write_only_target_is_not_copied_in() -> None:
    m = _manager()
    n = 1 << 14
    reference = kernels.probe(m, n, "random", read=False, write=True)
    reference.run()  # writes each element's visiting order into it
    want = reference.arrays["data"].to_numpy()
    reference.free()
    k = kernels.probe(m, n, "random", read=False, write=True)
    with k.arrays["data"].write(overwrite=True) as v:
        v[:] = 7  # stale bytes, never read
    m.reset_stats()
    rep = k.staged("always_stage")
    assert rep["staged"] and rep["copy_in_skipped"] and rep["write"] and not rep["read"]
    # The slow device was never read: no copy in; its bytes were written back after.
    assert m.stats()[SLOW]["bytes_read"] == 0 and m.stats()[SLOW]["bytes_written"] == n * 8
    data = k.arrays["data"]
    assert data.device == SLOW and (data.to_numpy() == want).all()
    m.check()
    # A target that is also read is copied in.
    k2 = kernels.random_access(m, 1 << 12)
    assert not k2.staged("always_stage")["copy_in_skipped"]


def test_chunked_executor_stages_each_chunk_in_turn() -> None:
    # Four source vectors (chunks) of 64 KiB with the matrix in fast memory, which has room
    # for the matrix and one and a half chunks: every chunk is staged in its turn.
    n, chunks = 1 << 13, 4
    rowptr, cols, _ = matrices.generate("uniform", n)
    fixed = (len(rowptr) * 8 + len(cols) * 12 + chunks * n * 8 + 3 * 4096) * 9 // 8
    m = _manager(fast=f"{fixed + n * 12} B")
    where: dict[str, str | int] = {"rowptr": "fast", "cols": "fast", "vals": "fast", "x": "slow", "y": "fast"}
    tasks = kernels.spmv_chunks(m, (rowptr, cols, n), chunks, where=where)
    assert all(t.arrays["cols"] is tasks[0].arrays["cols"] for t in tasks)  # one matrix
    use = m.usage()["dram"]
    free = use["capacity"] - use["used"]
    assert chunks * n * 8 > free > n * 8  # the chunks together do not fit; one does
    xs = [t.arrays["x"].to_numpy() for t in tasks]
    line = staging.BreakEven((2.0, 1.0, 0.1), (2.0, 1.0, 0.1), (2.0, 1.0, 0.1), 0.1, 0.1)
    out = kernels.run_chunks(tasks, "pattern_aware", line)
    assert out["staged"] == chunks and len(out["chunks"]) == chunks
    assert all(r["decision"]["stage"] and not r["fallback"] for r in out["chunks"])  # a uniform gather pays
    assert out["copy_seconds"] > 0 and out["seconds"] >= out["kernel_seconds"]
    vals = tasks[0].arrays["vals"].to_numpy()
    dense = _csr_dense(rowptr, cols, vals, n)
    for t, x in zip(tasks, xs, strict=True):
        np.testing.assert_allclose(t.arrays["y"].to_numpy(), dense @ x, rtol=1e-12)
        assert t.arrays["x"].device == SLOW  # each chunk went home after its task
    for t in tasks:
        t.free()
    m.check()
    with pytest.raises(InvalidArgumentError, match="no tasks"):
        kernels.run_chunks([], "always_stage")


def test_a_target_larger_than_fast_memory_is_not_staged() -> None:
    m = _manager(fast="1 MiB")
    k = kernels.random_access(m, 1 << 18)  # 2 MiB
    rep = k.staged("always_stage")
    assert not rep["staged"] and "larger than fast memory" in rep["fallback"]
    assert (k.arrays["table"].to_numpy() == _hpcc_reference(1 << 18, 4 << 18)).all()


def test_calibration_measures_every_corner() -> None:
    line = staging.calibrate(_manager(fast="64 MiB"), 1 << 20, reps=1)
    # Timings are the benchmark's business (a busy machine may reorder them); here only
    # their shape: every gain a finite number, copies take time.
    assert line.t_1st > 0 and line.t_3rd > 0
    assert all(np.isfinite(g) for b in (line.read, line.write, line.read_write) for g in b)
    # Sequential u64s share lines seven times in eight; the random order almost never.
    assert abs(line.lines[2] - 0.875) < 0.02 and line.lines[0] < 0.2
    again = staging.BreakEven.from_dict(line.as_dict())
    assert again == line


def test_line_rule_counts_fetched_lines() -> None:
    line = staging.BreakEven((1.0, 1.0, 0.1), (1.0, 1.0, 0.1), (1.0, 1.0, 0.1), 0.5, 0.5, lines=(0.0, 0.0, 0.875))
    # A banded gather: pages and strides regular, 99% of accesses reuse a line.
    d = line.decide({"r_paf": 1.0, "r_sf": 1.0, "r_lf": 0.99}, u=32, read=True, write=False)
    assert d["stage_paper"] and not d["stage"]  # the paper counts 32 references
    assert d["t_boost"] == pytest.approx(32 * 0.01 * 0.1 / 0.125)
    d = line.decide({"r_paf": 0.0, "r_sf": 0.0, "r_lf": 0.0}, u=1, read=True, write=False)
    assert d["stage"] and d["t_boost"] == d["t_boost_paper"] == pytest.approx(1.0)


def test_a_sweep_whose_band_fits_the_cache_fetches_at_its_front() -> None:
    # A 7-point stencil's gather: every row reads three planes of x, 2 * plane apart. The
    # sample, from the start of each thread's rows, sees each plane fetch its lines; the
    # cache holds the band, so in the loop only the leading plane fetches.
    plane = 4096
    rows = np.arange(1 << 17)
    idx = np.stack([rows + o for o in (0, plane, 2 * plane)], axis=1).ravel()
    r = staging.analyse(idx, elem_bytes=8, threads=2)
    band = 2 * plane * 8 // 64  # lines between the trailing and the leading plane
    assert band < r["band_lines"] <= band + 2048 // 3 * 8 // 64 + 2  # plus the sampled rows
    assert r["r_front"] == pytest.approx(1 / 24, rel=0.05)  # a line per 8 rows of 3 accesses
    assert 1 - r["r_lf"] > 2 * r["r_front"]  # the sample's view: every plane fetches
    line = staging.BreakEven((1.0, 1.0, 0.1), (1.0, 1.0, 0.1), (1.0, 1.0, 0.1), 0.5, 0.5, lines=(0.0, 0.0, 0.875))
    swept = staging.BreakEven(line.read, line.write, line.read_write, 0.5, 0.5, line.lines, cache_lines=4096)
    no_model, model = (b.decide(r, u=3, read=True, write=False) for b in (line, swept))
    assert model["t_boost"] == pytest.approx(no_model["t_boost"] * r["r_front"] / (1 - r["r_lf"]))
    # A band wider than the cache: the line filter's count stands.
    narrow = staging.BreakEven(line.read, line.write, line.read_write, 0.5, 0.5, line.lines, cache_lines=64)
    assert narrow.decide(r, u=3, read=True, write=False)["t_boost"] == no_model["t_boost"]


def test_calibration_on_an_emulated_device_reads_its_stall_counters() -> None:
    # The emulated device's stall per probe is a function of the probe's traffic and of
    # the device's figures (fixed within a process): two calibrations agree on every gain,
    # however busy the machine, where wall-clock differences range over a factor of two.
    a, b = (staging.calibrate(_manager(fast="64 MiB"), 1 << 18, reps=1) for _ in range(2))
    for x, y in zip((a.read, a.write, a.read_write), (b.read, b.write, b.read_write), strict=True):
        assert x == pytest.approx(y, rel=1e-9)
    assert a.read[0] > a.read[2] > 0  # a random read costs more per GB than a sequential one
    assert a.cache_lines > 0


def test_bad_input_is_refused_by_name() -> None:
    m = _manager()
    with pytest.raises(InvalidArgumentError, match="power of two"):
        kernels.random_access(m, 1000)
    with pytest.raises(InvalidArgumentError, match="power of two"):
        kernels.fft(m, 3)
    with pytest.raises(InvalidArgumentError, match="dims"):
        kernels.jacobi(m, (2, 5))
    with pytest.raises(InvalidArgumentError, match=r"\[0, 10\)"):
        kernels.spmv(m, (np.array([0, 1]), np.array([10]), 10))
    with pytest.raises(InvalidArgumentError, match="unknown kernel 'nope'"):
        tiermem._tiermem.Kernel(m._native, "nope", {}, {})
    with pytest.raises(InvalidArgumentError, match="needs object 'table'"):
        tiermem._tiermem.Kernel(m._native, "random_access", {}, {"len": 4, "updates": 128})
    with pytest.raises(InvalidArgumentError, match="unexpected"):
        tiermem._tiermem.Kernel(m._native, "fft", {"data": 1, "extra": 2}, {"n": 4})
    k = kernels.fft(m, 1 << 10)
    with pytest.raises(InvalidArgumentError, match="calibrated break-even line"):
        k.staged("pattern_aware")
    with pytest.raises(InvalidArgumentError, match="unknown staging mode"):
        k.staged("sometimes")
    with pytest.raises(InvalidArgumentError, match="no operand 'q'"):
        k.analyse("q")
    with pytest.raises(InvalidArgumentError, match=r"a place for each of \['a', 'b', 'c'\]"):
        kernels.dgemm(m, 8, where={"a": "fast"})
    with pytest.raises(InvalidArgumentError, match="unknown matrix"):
        matrices.generate("nope", 1024)
    with pytest.raises(InvalidArgumentError, match="row_scale"):
        matrices.generate("road_usa", 1024, row_scale=0)
    with pytest.raises(InvalidArgumentError, match="not a break-even line"):
        staging.BreakEven.from_dict({"read": {}})
    # A wrong-sized operand is named when the kernel opens it.
    small = m.array(10, np.float64, where="slow")
    bad = tiermem._tiermem.Kernel(m._native, "fft", {"data": small.id}, {"n": 8})
    with pytest.raises(InvalidArgumentError, match="FFT data: has 10 elements, the kernel needs 16"):
        bad.run()


def test_recommended_traits_for_dgemm_match_the_slides_shape() -> None:
    # Unblocked DGEMM at n = 512: b is read down its columns a page apart (every access a
    # miss), a and c in order; the slides' profile gives a: hbw, b: low_lat with the highest
    # priority, c: hbw.
    # Gains are timings (the benchmark measures them); only what follows from the sampled
    # patterns and the ranking is asserted.
    m = tiermem.Manager({"dram": "16 MiB", SLOW: "64 MiB"}, "lru_in_place")
    t = kernels.dgemm(m, 512).recommend_traits(reps=1)
    assert t["b"]["sensitivity"] == "latency"
    assert all(t[n]["sensitivity"] == "bandwidth" for n in "ac")
    assert sorted(x["priority"] for x in t.values()) == [1, 2, 3]
    for x in t.values():
        want = ("low_lat" if x["sensitivity"] == "latency" else "hbw") if x["gain"] > 0 else "large_cap"
        assert x["preferred"] == want and x["gain"] >= 0
        tiermem.Traits(**x)  # valid traits
