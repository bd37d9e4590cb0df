//! `tiermem._tiermem.Manager`: the core manager behind an `Arc`, every call made with the GIL
//! released.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use tiermem_core::counters::Recorder;
use tiermem_core::device;
use tiermem_core::manager::{
    Manager, Move, Mover, Moves, OpRequest, TraceCounts, TraceFollower, TraceOp,
};
use tiermem_core::mechanism::{self, GuardUse, Place};
use tiermem_core::policy;

use super::policy::PyPolicy;
use crate::convert::{json_to_object, to_object};
use crate::error::{run, to_py};
use crate::shared::Shared;

/// A place from its code ([`Place::CODES`], exported as `PLACES`).
fn place(code: i64) -> PyResult<Place> {
    Place::from_code(code).map_err(to_py)
}

/// One place code for every output of an op (an int), or one per output (a list): told
/// apart by type first, as a failed extraction would build an error on every op.
struct PlaceCodes(Vec<Place>);

impl PlaceCodes {
    fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<PlaceCodes> {
        if obj.is_instance_of::<pyo3::types::PyInt>() {
            return Ok(PlaceCodes(vec![place(obj.extract()?)?]));
        }
        let codes: Vec<i64> = obj.extract()?;
        Ok(PlaceCodes(
            codes.into_iter().map(place).collect::<PyResult<_>>()?,
        ))
    }
}

/// A plan's moves for an op: `(prefetch as (id, heap offset or None), evict)`.
type PlanMoves = (Vec<(u64, Option<u64>)>, Vec<u64>);

/// An op's outputs for `op_open`: `(sizes, place codes, heap offsets)`.
type OpOutputs<'py> = (Vec<u64>, Bound<'py, PyAny>, Vec<Option<u64>>);

/// What `op_open` returns: tickets, addresses, output ids, `(moves missed, moves refused)`.
type OpOpened = (Vec<u64>, Vec<usize>, Vec<u64>, (usize, usize));

/// A trace follower's counts by name (`TraceCounts`' fields).
type TraceMap = std::collections::HashMap<&'static str, u64>;

fn trace_map(c: TraceCounts) -> TraceMap {
    TraceMap::from([
        ("queued", c.queued),
        ("behind_queued", c.behind_queued),
        ("kept", c.kept),
        ("mismatches", c.mismatches),
        ("resyncs", c.resyncs),
    ])
}

/// A tiered memory manager (see `tiermem.Manager` for the documented facade).
#[pyclass(name = "Manager", module = "tiermem._tiermem", frozen)]
pub struct PyManager {
    pub(crate) inner: Shared<Manager>,
}

impl PyManager {
    /// Run `f(device, offset)` on a scratch object of `nbytes` on device `index`, under the
    /// manager lock (a measurement holds it on purpose), and free the object after.
    fn on_scratch<T>(
        &self,
        index: usize,
        nbytes: u64,
        f: impl FnOnce(&device::Device, u64) -> tiermem_core::Result<T>,
    ) -> tiermem_core::Result<T> {
        self.inner.with_data(|m, _| {
            tiermem_core::ensure!(
                index < m.devices().len(),
                "device index {index} out of range"
            );
            let id = m
                .create_object(index, nbytes)?
                .ok_or_else(|| mechanism::full(m, index, nbytes))?;
            let r = m.region(m.primary(id)?)?.clone();
            let out = f(&m.devices()[index], r.offset);
            m.destroy_object(id)?;
            out
        })
    }
}

#[pymethods]
impl PyManager {
    /// `devices`: (spec, capacity bytes) pairs, fastest first; `policy`: a built-in name or
    /// an object implementing the policy protocol.
    #[new]
    fn new(
        py: Python<'_>,
        devices: Vec<(String, u64)>,
        policy: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let pol: Box<dyn policy::Policy> = match policy.extract::<String>() {
            Ok(name) => policy::builtin(&name).map_err(to_py)?,
            Err(_) => Box::new(PyPolicy::new(policy)?),
        };
        let inner = run(py, move || Manager::new(device::open_all(&devices)?, pol))?;
        Ok(PyManager {
            inner: Shared::new(inner),
        })
    }

    /// A new object of `nbytes` at `place_code`, at heap offset `offset` when given (for the
    /// `planned` policy).
    #[pyo3(signature = (nbytes, place_code, offset = None))]
    fn alloc(
        &self,
        py: Python<'_>,
        nbytes: u64,
        place_code: i64,
        offset: Option<u64>,
    ) -> PyResult<u64> {
        let p = place(place_code)?;
        run(py, || self.inner.alloc_at(nbytes, p, offset))
    }

    fn free(&self, py: Python<'_>, id: u64) -> PyResult<()> {
        run(py, || self.inner.free(id))
    }

    #[pyo3(signature = (id, force = false))]
    fn prefetch(&self, py: Python<'_>, id: u64, force: bool) -> PyResult<()> {
        run(py, || self.inner.prefetch(id, force))
    }

    fn writeback(&self, py: Python<'_>, id: u64) -> PyResult<bool> {
        run(py, || self.inner.writeback(id))
    }

    fn evict(&self, py: Python<'_>, id: u64) -> PyResult<()> {
        run(py, || self.inner.evict(id))
    }

    fn softevict(&self, py: Python<'_>, id: u64) -> PyResult<()> {
        run(py, || self.inner.softevict(id))
    }

    fn read_use(&self, py: Python<'_>, id: u64) -> PyResult<()> {
        run(py, || self.inner.read_use(id))
    }

    fn write_use(&self, py: Python<'_>, id: u64) -> PyResult<()> {
        run(py, || self.inner.write_use(id))
    }

    fn in_fast(&self, py: Python<'_>, id: u64) -> PyResult<bool> {
        run(py, || self.inner.in_fast(id))
    }

    /// (device index, sibling device indices, dirty, open guards).
    fn placement(&self, py: Python<'_>, id: u64) -> PyResult<(usize, Vec<usize>, bool, u32)> {
        let p = run(py, || self.inner.placement(id))?;
        Ok((p.device, p.siblings, p.dirty, p.pins))
    }

    /// Open a guard: returns (address, length). Pair with `close`.
    /// Open a guard: (ticket, address, length). `overwrite`: a write guard whose old
    /// contents are dead (every byte will be written, none read).
    #[pyo3(signature = (id, write, overwrite = false))]
    fn open(
        &self,
        py: Python<'_>,
        id: u64,
        write: bool,
        overwrite: bool,
    ) -> PyResult<(u64, usize, usize)> {
        let how = match (write, overwrite) {
            (_, true) => GuardUse::Overwrite,
            (true, false) => GuardUse::Write,
            (false, false) => GuardUse::Read,
        };
        run(py, || {
            self.inner
                .open_for(id, how)
                .map(|(t, p, n)| (t, p as usize, n))
        })
    }

    /// Close the guard with this ticket (once); closing a hold releases it.
    fn close(&self, py: Python<'_>, ticket: u64) -> PyResult<()> {
        run(py, || self.inner.close(ticket))
    }

    /// Open one op: first a plan's `moves` (`(prefetch, evict)`, as `plan_moves`, each
    /// refusal counted), then a guard per input `(id, write)`, then (or first, with
    /// `outputs_first`) the `outputs`: `(sizes, place_code, offsets)`, a new object of each
    /// size at `place_code` (one code for all, or a list with one per output; at the heap
    /// offsets `offsets` gives, one per output or none, for the `planned` policy) with an
    /// overwrite guard. `trace` is the op's `(position, name number, softening)` for the
    /// trace follower (`follow_trace`). Returns `(tickets, addresses, output ids, (moves
    /// missed, moves refused))`, inputs' tickets first. All or nothing for the guards and
    /// outputs.
    #[pyo3(signature = (inputs, outputs, outputs_first, moves = None, trace = None))]
    fn op_open(
        &self,
        py: Python<'_>,
        inputs: Vec<(u64, bool)>,
        outputs: OpOutputs<'_>,
        outputs_first: bool,
        moves: Option<PlanMoves>,
        trace: Option<(u32, u32, bool)>,
    ) -> PyResult<OpOpened> {
        let (outputs, place_code, offsets) = outputs;
        let PlaceCodes(p) = PlaceCodes::from_py(&place_code)?;
        let inputs: Vec<(u64, GuardUse)> = inputs
            .into_iter()
            .map(|(id, w)| (id, if w { GuardUse::Write } else { GuardUse::Read }))
            .collect();
        let (prefetch, evict) = moves.unwrap_or_default();
        let req = OpRequest {
            inputs: &inputs,
            outputs: &outputs,
            places: &p,
            offsets: &offsets,
            outputs_first,
            moves: Moves {
                prefetch: &prefetch,
                evict: &evict,
            },
            trace: trace.map(|(pos, name, softening)| TraceOp {
                pos,
                name,
                softening,
            }),
        };
        let o = run(py, || self.inner.op_open(&req))?;
        Ok((
            o.tickets,
            o.addrs,
            o.outputs,
            (o.moves.missed, o.moves.refused),
        ))
    }

    /// Close one op: charge `(id, bytes read, bytes written)` per operand on `threads`
    /// threads, close every ticket, soft-evict `softevict`, evict `evict` (a plan's
    /// evictions after the op). Every ticket closes. Returns the evictions refused.
    #[pyo3(signature = (tickets, charges, threads, softevict, evict = Vec::new()))]
    fn op_close(
        &self,
        py: Python<'_>,
        tickets: Vec<u64>,
        charges: Vec<(u64, u64, u64)>,
        threads: usize,
        softevict: Vec<u64>,
        evict: Vec<u64>,
    ) -> PyResult<usize> {
        run(py, || {
            self.inner
                .op_close(&tickets, &charges, threads, &softevict, &evict)
        })
    }

    /// Follow the trace of ops opened with `trace=` (see `tiermem_core::manager::trace`),
    /// queueing prefetches `depth` ops ahead and write-backs `lag` bytes behind to `mover`;
    /// or stop following (`mover=None`). Returns the replaced follower's counts by name, if
    /// there was one.
    #[pyo3(signature = (mover = None, depth = 0, lag = 0))]
    fn follow_trace(
        &self,
        py: Python<'_>,
        mover: Option<&PyMover>,
        depth: usize,
        lag: u64,
    ) -> PyResult<Option<TraceMap>> {
        let follower = match mover {
            Some(mv) => {
                let tx = mv.sender().ok_or_else(|| {
                    to_py(tiermem_core::Error::InvalidArgument(
                        "follow_trace: the mover is stopped".into(),
                    ))
                })?;
                Some(TraceFollower::new(depth, lag, tx))
            }
            None => None,
        };
        let old = run(py, || self.inner.follow_trace(follower))?;
        Ok(old.map(trace_map))
    }

    /// An iteration starts for the trace follower.
    fn trace_iteration(&self, py: Python<'_>) -> PyResult<()> {
        run(py, || self.inner.trace_iteration())
    }

    /// Object `id`, made outside `op_open`, is output `k` of the op at `pos` (for the trace
    /// follower).
    fn trace_made(&self, py: Python<'_>, pos: u32, k: u32, id: u64) -> PyResult<()> {
        run(py, || self.inner.trace_made(pos, k, id))
    }

    /// The trace follower's counts by name (queued, behind_queued, kept, mismatches,
    /// resyncs), or None.
    fn trace_counts(&self, py: Python<'_>) -> PyResult<Option<TraceMap>> {
        Ok(run(py, || self.inner.trace_counts())?.map(trace_map))
    }

    /// A plan's moves around one kernel in one call: evict `evict`, then prefetch
    /// `prefetch` (`(id, heap offset or None)`); returns how many prefetched objects are not
    /// in fast memory after.
    fn plan_moves(
        &self,
        py: Python<'_>,
        prefetch: Vec<(u64, Option<u64>)>,
        evict: Vec<u64>,
    ) -> PyResult<usize> {
        run(py, || self.inner.plan_moves(&prefetch, &evict))
    }

    /// Close the guard with this ticket but keep its object where it is until the ticket is
    /// closed again (a view derived inside the guard outlived it).
    fn hold(&self, py: Python<'_>, ticket: u64) -> PyResult<()> {
        run(py, || self.inner.hold(ticket))
    }

    /// Charge a kernel run outside tiermem: `(id, bytes read, bytes written)` per operand.
    fn charge(
        &self,
        py: Python<'_>,
        operands: Vec<(u64, u64, u64)>,
        threads: usize,
    ) -> PyResult<()> {
        run(py, || self.inner.charge(&operands, threads))
    }

    /// Copy object `src` into object `dst` (same length) `reps` times with the copy engine;
    /// returns the best time in seconds, measured in Rust (no Python call overhead).
    #[pyo3(signature = (dst, src, reps = 1))]
    fn copy_objects(&self, py: Python<'_>, dst: u64, src: u64, reps: usize) -> PyResult<f64> {
        run(py, || {
            tiermem_core::measure::best(reps, || self.inner.copy_objects(dst, src))
        })
    }

    fn set_pair_threads(
        &self,
        py: Python<'_>,
        src: String,
        dst: String,
        threads: usize,
    ) -> PyResult<()> {
        run(py, || {
            self.inner
                .with_data(|m, _| m.copy_engine().set_pair_threads(&src, &dst, threads))
        })
    }

    /// GB/s the emulated profiles allow a large copy between devices `src` and `dst`
    /// (indices), or None when no emulated device takes part or a block device bounds it.
    fn expected_copy_gbps(&self, py: Python<'_>, src: usize, dst: usize) -> PyResult<Option<f64>> {
        run(py, || {
            self.inner.with_data(|m, _| {
                let d = m.devices();
                tiermem_core::ensure!(src < d.len() && dst < d.len(), "device index out of range");
                Ok(m.copy_engine().expected_gbps(&d[src], &d[dst]))
            })
        })
    }

    fn threads_for(&self, py: Python<'_>, src: usize, dst: usize) -> PyResult<usize> {
        run(py, || {
            self.inner.with_data(|m, _| {
                let d = m.devices();
                tiermem_core::ensure!(src < d.len() && dst < d.len(), "device index out of range");
                Ok(m.copy_engine().threads_for(&d[src], &d[dst]))
            })
        })
    }

    /// Measure device `index` on a scratch object of `nbytes` (JSON).
    fn measure_device(
        &self,
        py: Python<'_>,
        index: usize,
        nbytes: u64,
        reps: usize,
    ) -> PyResult<Py<PyAny>> {
        run(py, || {
            self.on_scratch(index, nbytes, |dev, offset| {
                tiermem_core::measure::device_figures(dev, offset, nbytes, reps)
            })
        })
        .and_then(|f| to_object(py, &f))
    }

    /// Measure device `index` (byte-addressable) by access pattern on a scratch object of
    /// `nbytes`: sequential and random reads and writes of each size in `sizes`, each with
    /// the figure its emulated profile cites (JSON list).
    fn measure_accesses(
        &self,
        py: Python<'_>,
        index: usize,
        nbytes: u64,
        sizes: Vec<u64>,
        reps: usize,
    ) -> PyResult<Py<PyAny>> {
        run(py, || {
            self.on_scratch(index, nbytes, |dev, offset| match dev.addr(offset) {
                Some(p) => tiermem_core::measure::access_figures(
                    dev,
                    p,
                    usize::try_from(nbytes).unwrap_or(usize::MAX),
                    &sizes,
                    reps,
                ),
                None => Err(tiermem_core::Error::InvalidArgument(format!(
                    "device '{}' is not byte-addressable: its accesses are blocks (bench blockio)",
                    dev.name
                ))),
            })
        })
        .and_then(|f| to_object(py, &f))
    }

    /// Counters of every device, by device name.
    fn stats(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_object(py, &self.inner.stats())
    }

    fn reset_stats(&self, py: Python<'_>) -> PyResult<()> {
        run(py, || self.inner.reset_stats())
    }

    /// (name, bytes used, peak bytes used, capacity) per device.
    fn usage(&self, py: Python<'_>) -> PyResult<Vec<(String, u64, u64, u64)>> {
        run(py, || {
            Ok(self
                .inner
                .usage()?
                .into_iter()
                .map(|u| (u.device, u.used, u.peak, u.capacity))
                .collect())
        })
    }

    /// What every device is: name, kind, capacity, figures.
    fn devices(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let infos: Vec<_> = self.inner.devices().iter().map(|d| d.info()).collect();
        to_object(py, &infos)
    }

    /// Check the manager's invariants; raises on the first violation.
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.check())
            .map_err(pyo3::exceptions::PyAssertionError::new_err)
    }

    fn object_count(&self, py: Python<'_>) -> PyResult<usize> {
        run(py, || self.inner.object_count())
    }

    /// The policy's own counters as JSON, or None.
    /// The policy's own counters, if it keeps any.
    fn policy_stats(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let text = run(py, || self.inner.policy_stats_json())?;
        text.map(|t| json_to_object(py, &t)).transpose()
    }

    fn policy_name(&self) -> String {
        self.inner.policy_name().to_owned()
    }

    /// Start a recorder sampling bytes per device every `interval` seconds.
    fn record(&self, interval: f64) -> PyResult<PyRecorder> {
        if !(interval > 0.0 && interval < 1e6) {
            return Err(to_py(tiermem_core::Error::InvalidArgument(format!(
                "recording interval {interval}: it must be a positive number of seconds"
            ))));
        }
        let devs = self
            .inner
            .devices()
            .iter()
            .map(|d| (d.name.clone(), d.counters.clone()))
            .collect();
        let rec = Recorder::start(devs, Duration::from_secs_f64(interval)).map_err(to_py)?;
        Ok(PyRecorder {
            rec: Mutex::new(Some(rec)),
        })
    }
}

/// A running time-series recorder.
#[pyclass(name = "Recorder", module = "tiermem._tiermem", frozen)]
pub struct PyRecorder {
    rec: Mutex<Option<Recorder>>,
}

#[pymethods]
impl PyRecorder {
    /// Stop and return the samples as JSON (`[{"t", "read": {...}, "written": {...}}]`).
    fn finish(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let rec = self
            .rec
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let Some(rec) = rec else {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "recorder already finished",
            ));
        };
        let samples = py.detach(|| rec.finish());
        to_object(py, &samples)
    }
}

/// Unlink every device file (`block:`/`mapped:`) this process created and still holds (at
/// interpreter exit; open maps stay valid). Returns how many were removed.
#[pyfunction]
pub fn remove_device_files() -> usize {
    tiermem_core::sys::devfile::remove_created()
}

/// A background mover over a manager (see `tiermem_core::manager::Mover`): requests are
/// queued without waiting or releasing the GIL; its thread never takes the GIL.
#[pyclass(name = "Mover", module = "tiermem._tiermem", frozen)]
pub struct PyMover {
    mover: Mutex<Option<Mover>>,
}

impl PyMover {
    fn sender(&self) -> Option<tiermem_core::manager::MoveSender> {
        self.mover
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .and_then(Mover::sender)
    }

    fn push(&self, m: Move) {
        if let Some(mv) = self
            .mover
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
        {
            mv.push(m);
        }
    }
}

#[pymethods]
impl PyMover {
    #[new]
    fn new(manager: &PyManager) -> PyResult<Self> {
        let mover = Mover::start(Arc::clone(&manager.inner)).map_err(to_py)?;
        Ok(PyMover {
            mover: Mutex::new(Some(mover)),
        })
    }

    /// Queue a forced prefetch of object `id` into fast memory.
    fn prefetch(&self, id: u64) {
        self.push(Move::Prefetch(id));
    }

    /// Queue a write-back of object `id` (left clean where it is).
    fn writeback(&self, id: u64) {
        self.push(Move::Writeback(id));
    }

    /// `(prefetched, written back, skipped)` so far.
    fn counts(&self) -> (u64, u64, u64) {
        let guard = self
            .mover
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let c = guard.as_ref().map(Mover::counts).unwrap_or_default();
        (c.prefetched, c.written_back, c.skipped)
    }

    /// Stop after the requests already queued and wait for the thread (GIL released);
    /// later requests are ignored. Returns the final `(prefetched, written back, skipped)`.
    fn stop(&self, py: Python<'_>) -> (u64, u64, u64) {
        let taken = self
            .mover
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let Some(mut mover) = taken else {
            return (0, 0, 0);
        };
        let c = py.detach(move || {
            mover.stop();
            mover.counts()
        });
        (c.prefetched, c.written_back, c.skipped)
    }
}

impl Drop for PyMover {
    fn drop(&mut self) {
        // Stopping joins the thread, which may wait for the manager lock while a Python
        // policy under it needs the GIL: done with the GIL released (as `Shared` drops).
        let taken = self
            .mover
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(m) = taken {
            Python::try_attach(|py| py.detach(move || drop(m)));
        }
    }
}
