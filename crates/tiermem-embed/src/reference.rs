//! Plain scalar reference kernels: the obvious loops over rows read and written with
//! [`Table::read_rows`] / [`Table::write_rows`] (no prefetching, no width specialisation, no
//! streaming stores, no instruction-set variants). The optimised kernels in [`crate::lookup`]
//! and [`crate::update`] are tested against them on every instruction set the CPU has
//! (`tests/it/kernels.rs`).

use std::collections::BTreeMap;

use crate::bags::Bags;
use crate::lookup::Mode;
use crate::optim::Optimizer;
use crate::table::Table;
use tiermem_core::{ensure, Result};

fn row(table: &Table, i: usize) -> Result<Vec<f32>> {
    let mut r = vec![0f32; table.featuresize()];
    table.read_rows(i, &mut r)?;
    Ok(r)
}

fn checked(table: &Table, v: i64) -> Result<usize> {
    ensure!(
        v >= 0 && (v as u64) < table.rows() as u64,
        "index {v} is outside the table's {} rows",
        table.rows()
    );
    Ok(v as usize)
}

/// The lookup of one table's `bags`: `bags x width` floats (`mode` sum or mean), or one row
/// per index (`none`). The padding row is left out, also from a mean's count.
pub fn lookup(table: &Table, bags: &Bags<'_>, mode: Mode) -> Result<Vec<f32>> {
    let w = table.featuresize();
    let pad = table.padding_idx();
    let vals = bags.values();
    if mode == Mode::None {
        let mut out = Vec::with_capacity(vals.len() * w);
        for &v in vals {
            let i = checked(table, v)?;
            out.extend(if Some(i) == pad {
                vec![0.0; w]
            } else {
                row(table, i)?
            });
        }
        return Ok(out);
    }
    let mut out = vec![0f32; bags.batch() * w];
    for b in 0..bags.batch() {
        let acc = &mut out[b * w..(b + 1) * w];
        let mut n = 0usize;
        for p in bags.bag(b) {
            let i = checked(table, vals[p])?;
            if Some(i) == pad {
                continue;
            }
            n += 1;
            let scale = bags.weights().map_or(1.0, |ws| ws[p]);
            for (a, x) in acc.iter_mut().zip(row(table, i)?) {
                *a += scale * x;
            }
        }
        if mode == Mode::Mean && n > 0 {
            let inv = 1.0 / n as f32;
            for a in acc.iter_mut() {
                *a *= inv;
            }
        }
    }
    Ok(out)
}

/// The backward of [`lookup`] with `opt` applied at step `step` (1-based): each distinct
/// row's gradient summed over the positions that used it (in position order), then
/// [`Optimizer::apply`] on the row and `state` (rows x `opt.state_len(width)` floats, the
/// caller's; start it at `opt.initial_state()`). The padding row is never updated.
pub fn update(
    table: &Table,
    bags: &Bags<'_>,
    mode: Mode,
    grad: &[f32],
    opt: Optimizer,
    step: u64,
    state: &mut [f32],
) -> Result<()> {
    let w = table.featuresize();
    let per_row = opt.state_len(w);
    ensure!(
        state.len() == table.rows() * per_row,
        "state has {} floats, the optimizer needs {}",
        state.len(),
        table.rows() * per_row
    );
    let pad = table.padding_idx();
    let vals = bags.values();
    let mut sums: BTreeMap<usize, Vec<f32>> = BTreeMap::new();
    let mut add = |i: usize, grow: &[f32], scale: f32| {
        let s = sums.entry(i).or_insert_with(|| vec![0.0; w]);
        for (a, g) in s.iter_mut().zip(grow) {
            *a += scale * g;
        }
    };
    if mode == Mode::None {
        for (p, &v) in vals.iter().enumerate() {
            add(checked(table, v)?, &grad[p * w..(p + 1) * w], 1.0);
        }
    } else {
        for b in 0..bags.batch() {
            let r = bags.bag(b);
            let n = r.clone().filter(|&p| Some(vals[p] as usize) != pad).count();
            for p in r {
                let scale = match mode {
                    Mode::Mean => {
                        if n > 0 {
                            1.0 / n as f32
                        } else {
                            0.0
                        }
                    }
                    _ => bags.weights().map_or(1.0, |ws| ws[p]),
                };
                add(checked(table, vals[p])?, &grad[b * w..(b + 1) * w], scale);
            }
        }
    }
    let opt = opt.at_step(step);
    for (i, g) in sums {
        if Some(i) == pad {
            continue;
        }
        let mut r = row(table, i)?;
        opt.apply(&mut r, &g, &mut state[i * per_row..(i + 1) * per_row]);
        table.write_rows(i, &r)?;
    }
    Ok(())
}
