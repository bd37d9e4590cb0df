//! Bag and offset parsing (`Bags::new`) and lookups over what it accepts: any values,
//! offsets and weights the fuzzer makes are refused with an error or give the same sums as a
//! plain loop; nothing is read or written out of bounds (`cargo fuzz` builds with ASan).
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use tiermem_core::device::Device;
use tiermem_embed::bags::Bags;
use tiermem_embed::{lookup, DType, LookupOut, Mode, Table};
use tiermem_core::manager::Manager;
use tiermem_core::policy;

const ROWS: usize = 64;
const W: usize = 4;

fn table() -> &'static (Arc<Manager>, Table) {
    static T: OnceLock<(Arc<Manager>, Table)> = OnceLock::new();
    T.get_or_init(|| {
        let m = Arc::new(
            Manager::new(vec![Device::open("dram", 1 << 20).unwrap()], policy::builtin("lru").unwrap())
                .unwrap(),
        );
        let t = Table::direct(&m, 0, ROWS, W, DType::F32).unwrap();
        let rows: Vec<f32> = (0..ROWS * W).map(|i| i as f32).collect();
        t.write_rows(0, &rows).unwrap();
        (m, t)
    })
}

fn i64s(b: &[u8], n: usize, small: bool) -> Vec<i64> {
    b.chunks_exact(8)
        .take(n)
        .map(|c| {
            let v = i64::from_le_bytes(c.try_into().unwrap());
            if small { v % 80 } else { v }
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let (nv, no, flags) = (data[0] as usize % 32, data[1] as usize % 16, data[2]);
    let rest = &data[3..];
    let values = i64s(rest, nv, flags & 1 == 1);
    let offsets = i64s(rest.get(nv * 8..).unwrap_or(&[]), no, true);
    let weights: Vec<f32> = (0..values.len()).map(|i| i as f32 * 0.5).collect();
    let w = (flags & 2 == 2).then_some(&weights[..]);
    let Ok(bags) = Bags::new(0, &values, &offsets, w) else {
        return;
    };
    let (_, t) = table();
    let n = bags.batch();
    let mode = if w.is_some() || flags & 4 == 0 { Mode::Sum } else { Mode::Mean };
    let mut out = vec![0f32; n * W + 1];
    let res = lookup(&[t], &[bags], mode, LookupOut { data: &mut out[..n * W], row_stride: W, cols: &[0] }, 0);
    assert_eq!(out[n * W], 0.0, "a lookup wrote past its output");
    let Ok(_) = res else {
        return;
    };
    for b in 0..n {
        let r = bags.bag(b);
        let mut want = [0f32; W];
        for p in r.clone() {
            let s = w.map_or(1.0, |w| w[p]);
            for (j, x) in want.iter_mut().enumerate() {
                *x += s * (values[p] as usize * W + j) as f32;
            }
        }
        if mode == Mode::Mean && !r.is_empty() {
            for x in &mut want {
                *x /= r.len() as f32;
            }
        }
        for j in 0..W {
            let got = out[b * W + j];
            assert!((got - want[j]).abs() <= 1e-3 * want[j].abs().max(1.0), "bag {b}: {got} vs {}", want[j]);
        }
    }
});
