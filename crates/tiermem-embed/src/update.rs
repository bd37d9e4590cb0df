//! Backward fused with the optimizer (thesis §5.2.1–5.2.2): reindex the lookup's indices
//! into per-row lists, accumulate each distinct row's whole gradient in registers and apply
//! the optimizer to the row in place. The dense gradient is never built. Parallel across
//! tables and across chunks of distinct rows within a table; each row is one task's, so no
//! locks or atomics touch row data.

use rayon::prelude::*;
use tiermem_core::process::in_kernel_pool;

use super::bags::{check_indices, Bags};
use super::elem::{store_row, with_elem, Elem};
use super::lookup::{check_call, chunk_size, Mode};
use super::optim::Optimizer;
use super::reindex::{reindex, Csr};
use super::rows::RowFn;
use super::rows::{RowSource, Tally};
use super::table::{Mutable, Table};
use super::with_width;
use tiermem_core::arch::hints::sfence;
use tiermem_core::sys::huge::HugeSlice;
use tiermem_core::Result;

/// The incoming gradient of an ensemble lookup's output: the same layout as
/// [`super::LookupOut`].
#[derive(Debug, Clone, Copy)]
pub struct GradIn<'a> {
    /// The matrix.
    pub data: &'a [f32],
    /// Floats per row.
    pub row_stride: usize,
    /// First column of each table.
    pub cols: &'a [usize],
}

/// What to do with each distinct row's accumulated gradient.
#[derive(Clone, Copy)]
enum Sink {
    Apply(Optimizer, bool),
    /// Write it to a `(distinct rows) x width` buffer (the sparse gradient).
    Collect(super::lookup::SharedMut),
}

/// Apply the backward pass of a lookup with `opt` fused in. Every index is checked before
/// any row changes. `nt` writes updated rows with non-temporal stores. Takes each table's
/// exclusive lock (in address order, so concurrent calls cannot deadlock).
pub fn update(
    tables: &[&Table],
    bags: &[Bags<'_>],
    mode: Mode,
    grad: GradIn<'_>,
    opt: Optimizer,
    nt: bool,
) -> Result<Tally> {
    check_call(
        tables,
        bags,
        mode,
        grad.data.len(),
        grad.row_stride,
        grad.cols,
    )?;
    for t in tables {
        trainable(t)?;
    }
    let mut guards = super::table::locks::exclusive_all(tables)?;
    let mut states: Vec<&mut Mutable> = guards.iter_mut().map(|g| &mut **g).collect();
    let csrs = prepare(tables, bags, &mut states)?;
    super::lookup::stage_all(tables, bags)?;
    run(
        tables,
        bags,
        mode,
        grad,
        Sink::Apply(opt, nt),
        &mut states,
        csrs,
    )
}

/// The sparse gradient of one table's lookup: the distinct rows (first-seen order) and
/// their gradients (`rows x width`, row-major). For tests and for optimizers outside
/// tiermem.
pub fn sparse_grad(
    table: &Table,
    bags: &Bags<'_>,
    mode: Mode,
    grad: &[f32],
) -> Result<(Vec<u32>, Vec<f32>)> {
    let w = table.featuresize();
    let g = GradIn {
        data: grad,
        row_stride: w,
        cols: &[0],
    };
    check_call(
        &[table],
        std::slice::from_ref(bags),
        mode,
        grad.len(),
        w,
        &[0],
    )?;
    trainable(table)?;
    let mut guard = table.exclusive()?;
    let mut states = vec![&mut *guard];
    let csrs = prepare(&[table], std::slice::from_ref(bags), &mut states)?;
    super::lookup::stage_all(&[table], std::slice::from_ref(bags))?;
    let rows = csrs[0].rows.clone();
    let mut out = vec![0f32; rows.len() * w];
    let sink = Sink::Collect(super::lookup::SharedMut(out.as_mut_ptr()));
    run(&[table], &[*bags], mode, g, sink, &mut states, csrs)?;
    Ok((rows, out))
}

/// Refuse a table that cannot be trained: one opened read-only, or one of 8-bit rows.
fn trainable(t: &Table) -> Result<()> {
    t.writable()?;
    tiermem_core::ensure!(
        t.dtype() != super::DType::Int8,
        "this table holds 8-bit row-wise rows, which are for inference and take no updates \
         (as FBGEMM's); train it in float32 (or float16/bfloat16) and quantise it for serving"
    );
    Ok(())
}

/// Check every index (before anything changes), then reindex each table in parallel.
fn prepare(tables: &[&Table], bags: &[Bags<'_>], states: &mut [&mut Mutable]) -> Result<Vec<Csr>> {
    in_kernel_pool(|| {
        tables
            .par_iter()
            .zip(bags.par_iter())
            .enumerate()
            .try_for_each(|(t, (tab, b))| check_indices(t, b.values(), tab.rows()))?;
        Ok(states
            .par_iter_mut()
            .zip(bags.par_iter())
            .map(|(m, b)| reindex(b.values(), &mut m.slot_of))
            .collect())
    })?
}

/// Per-table data a task needs.
struct Plan<'a> {
    table: &'a Table,
    bags: Bags<'a>,
    csr: Csr,
    bag_of: Vec<u32>,
    /// Padding row (never updated, left out of a mean's count), or `u32::MAX`.
    pad: u32,
    /// Per bag, 1 / (indices that are not padding), for mean bags.
    inv_len: Vec<f32>,
    /// Optimizer state floats per row and the state, if the optimizer keeps any.
    state: Option<(usize, super::lookup::SharedMut)>,
    /// The sink, with the optimizer as it runs at this table's step.
    sink: Sink,
}

fn run(
    tables: &[&Table],
    bags: &[Bags<'_>],
    mode: Mode,
    grad: GradIn<'_>,
    sink: Sink,
    states: &mut [&mut Mutable],
    csrs: Vec<Csr>,
) -> Result<Tally> {
    let mut plans = Vec::with_capacity(tables.len());
    for (((tab, b), m), csr) in tables.iter().zip(bags).zip(states.iter_mut()).zip(csrs) {
        let (sink, state) = match sink {
            Sink::Apply(opt, nt) => {
                if let Some(k) = m
                    .optimizer
                    .filter(|k| m.optimizer_fixed && *k != opt.name())
                {
                    tiermem_core::bail!(
                        "this table's rows were trained with the optimizer '{k}' (its state is \
                         in the table file's companion); updating them with '{}' would mix two \
                         optimizers: use '{k}', or reset the table's optimizer state first",
                        opt.name()
                    );
                }
                m.optimizer = Some(opt.name());
                m.steps += 1;
                let opt = opt.at_step(m.steps);
                let per_row = opt.state_len(tab.featuresize());
                let state = if per_row == 0 {
                    None
                } else {
                    if m.state.as_ref().is_none_or(|(k, _)| *k != opt.name()) {
                        let mut v = HugeSlice::zeroed(tab.rows() * per_row)?;
                        v.fill(opt.initial_state());
                        m.state = Some((opt.name(), v));
                    }
                    let v = &mut m.state.as_mut().expect("just set").1;
                    Some((per_row, super::lookup::SharedMut(v.as_mut_ptr())))
                };
                (Sink::Apply(opt, nt), state)
            }
            Sink::Collect(_) => (sink, None),
        };
        let bag_of = if mode == Mode::None {
            Vec::new()
        } else {
            let mut v = vec![0u32; b.values().len()];
            for bag in 0..b.batch() {
                for p in b.bag(bag) {
                    v[p] = bag as u32;
                }
            }
            v
        };
        let pad = tab.padding_idx().map_or(u32::MAX, |p| p as u32);
        let inv_len = if mode == Mode::Mean {
            (0..b.batch())
                .map(|bag| {
                    let r = b.bag(bag);
                    let n = b.values()[r]
                        .iter()
                        .filter(|&&v| v as u64 != u64::from(pad))
                        .count();
                    if n > 0 {
                        1.0 / n as f32
                    } else {
                        0.0
                    }
                })
                .collect()
        } else {
            Vec::new()
        };
        plans.push(Plan {
            table: tab,
            bags: *b,
            csr,
            bag_of,
            pad,
            inv_len,
            state,
            sink,
        });
    }
    let mut jobs = Vec::new();
    for (t, p) in plans.iter().enumerate() {
        let n = p.csr.rows.len();
        let step = chunk_size(n, tables.len());
        for first in (0..n).step_by(step) {
            jobs.push((t, first, (first + step).min(n)));
        }
    }
    let tallies: Vec<(usize, Tally)> = in_kernel_pool(|| {
        jobs.par_iter()
            .map(|&(t, first, last)| {
                let p = &plans[t];
                let job = Job {
                    plan: p,
                    mode,
                    grad,
                    col: grad.cols[t],
                    sink: p.sink,
                    first,
                    last,
                };
                let tally = p.table.with_rows(false, Upd { job: &job });
                (t, tally)
            })
            .collect()
    })?;
    if matches!(sink, Sink::Apply(_, true)) {
        sfence();
    }
    let mut total = Tally::default();
    for (_, x) in &tallies {
        total.add(x);
    }
    Ok(total)
}

struct Job<'a> {
    plan: &'a Plan<'a>,
    mode: Mode,
    grad: GradIn<'a>,
    col: usize,
    sink: Sink,
    first: usize,
    last: usize,
}

struct Upd<'a, 'b> {
    job: &'a Job<'b>,
}

impl RowFn<Tally> for Upd<'_, '_> {
    fn call<R: RowSource>(self, rows: &R) -> Tally {
        let j = self.job;
        let t = with_width!(j.plan.table.featuresize(), W => with_elem!(j.plan.table.dtype(), E => dispatch::<E, R, W>(j, rows); int8 => unreachable!("updates of 8-bit rows are refused before any job runs")));
        rows.charge(&t);
        t
    }
}

super::isa_dispatch!(Tally, Elem);

/// Distinct rows ahead of the one being updated that are prefetched.
const ROW_PREFETCH: usize = 4;

/// Accumulate and apply the gradients of distinct rows `first..last` of one table.
///
/// # Safety
/// The table's exclusive lock is held; the grad matrix was checked by `check_call`; the
/// optimizer state (if any) has one entry per row (row-wise) or element; no other job
/// handles these rows.
#[inline(always)]
unsafe fn body<E: Elem, R: RowSource, const W: usize>(j: &Job<'_>, src: &R) -> Tally {
    let p = j.plan;
    let width = if W > 0 { W } else { p.table.featuresize() };
    let weights = p.bags.weights();
    let mut tally = Tally::default();
    let mut gbuf = vec![0f32; if W > 0 { 0 } else { width }];
    let mut wbuf = vec![0f32; if W > 0 { 0 } else { width }];
    let mut gs = [0f32; 256];
    let mut ws = [0f32; 256];
    for u in j.first..j.last {
        let (g, w): (&mut [f32], &mut [f32]) = if W > 0 {
            (&mut gs[..W], &mut ws[..W])
        } else {
            (&mut gbuf[..], &mut wbuf[..])
        };
        g.fill(0.0);
        // The rows are updated in first-seen (random) order: fetch a later one while this
        // one's gradient is summed.
        if u + ROW_PREFETCH < j.last {
            src.prefetch(p.csr.rows[u + ROW_PREFETCH] as usize);
        }
        // A cached table finds a row's slot through its pointer-table entry: fetch the
        // entry further ahead, so the row prefetch above does not wait for it.
        if u + 4 * ROW_PREFETCH < j.last {
            src.prefetch_far(p.csr.rows[u + 4 * ROW_PREFETCH] as usize);
        }
        let entries = &p.csr.positions[p.csr.starts[u] as usize..p.csr.starts[u + 1] as usize];
        for &pos in entries {
            let pos = pos as usize;
            let (grow, scale) = match j.mode {
                Mode::None => (pos, 1.0),
                Mode::Sum => (p.bag_of[pos] as usize, weights.map_or(1.0, |w| w[pos])),
                Mode::Mean => {
                    let b = p.bag_of[pos] as usize;
                    (b, p.inv_len[b])
                }
            };
            let gr = &j.grad.data[grow * j.grad.row_stride + j.col..][..width];
            for k in 0..width {
                g[k] += scale * gr[k];
            }
        }
        let row = p.csr.rows[u] as usize;
        if p.csr.rows[u] == p.pad {
            g.fill(0.0);
        }
        match j.sink {
            Sink::Collect(out) => {
                // SAFETY: the buffer has (distinct rows) x width floats; u is ours.
                unsafe {
                    std::slice::from_raw_parts_mut(out.0.add(u * width), width).copy_from_slice(g);
                }
            }
            Sink::Apply(..) if p.csr.rows[u] == p.pad => {}
            Sink::Apply(opt, nt) => {
                let dst = src.write(row, &mut tally).cast::<E>();
                let in_place = !nt
                    && opt.elementwise(
                        g,
                        // SAFETY: the row source gives `width` valid elements and k < width;
                        // the exclusive lock is held and no other job handles this row.
                        |k| unsafe { dst.add(k).read() }.to_f32(),
                        // SAFETY: as above.
                        |k, v| unsafe { dst.add(k).write(E::from_f32(v)) },
                    );
                if in_place {
                    // Updated element by element: no row-sized copies to and from a buffer
                    // (which compile to memcpy calls that dominated this loop).
                    continue;
                }
                for (k, x) in w.iter_mut().enumerate() {
                    // SAFETY: the row source gives `width` valid elements; exclusive lock.
                    *x = unsafe { dst.add(k).read() }.to_f32();
                }
                let s: &mut [f32] = match p.state {
                    // SAFETY: the state has `per_row` floats for each row; this row is ours.
                    Some((per_row, st)) => unsafe {
                        std::slice::from_raw_parts_mut(st.0.add(row * per_row), per_row)
                    },
                    None => &mut [],
                };
                opt.apply(w, g, s);
                // SAFETY: as above.
                unsafe { store_row::<E>(dst, w, nt) };
            }
        }
    }
    tally
}
