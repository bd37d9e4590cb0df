//! tiermem-hpc: bandwidth-critical HPC kernels over tiered arrays and pattern-aware staging,
//! on `tiermem-core` alone (Arima & Schulz §6: HPCC RandomAccess, PTRANS, Jacobi 2D and 3D, CG's sparse matrix-vector
//! product, FFT) and the H2M slides' multi-buffer DGEMM application.
//!
//! A kernel reaches its operands (manager objects) only through guards, computes with the
//! process's rayon threads, and charges each operand's traffic ([`traffic`]) to the device
//! the operand lives on before its guards close, so on an `emulated` device it runs at
//! that device's speed. [`staging`] runs a kernel slow-only, always staged, or staged when
//! the sampled access pattern says it pays ([`crate::pattern`]).

pub mod dgemm;
pub mod fft;
pub mod jacobi;
pub mod pattern;
pub mod probe;
pub mod ptrans;
pub mod random_access;
pub mod spmv;
pub mod staging;
pub mod traffic;

use rayon::prelude::*;

use tiermem_core::manager::Manager;
use tiermem_core::mechanism::ObjectId;
use tiermem_core::Result;
use traffic::Traffic;

/// One array a kernel uses, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operand {
    /// The manager object holding it.
    pub id: ObjectId,
    /// Its name in reports (`table`, `x`, ...).
    pub name: &'static str,
    /// Bytes per element.
    pub elem: u64,
    /// Elements.
    pub len: u64,
    /// Whether the kernel reads it.
    pub read: bool,
    /// Whether the kernel writes it.
    pub write: bool,
}

impl Operand {
    /// An operand of `len` elements of `elem` bytes in object `id`.
    #[must_use]
    pub fn new(
        id: ObjectId,
        name: &'static str,
        elem: u64,
        len: u64,
        read: bool,
        write: bool,
    ) -> Self {
        Operand {
            id,
            name,
            elem,
            len,
            read,
            write,
        }
    }
}

/// A kernel over tiered arrays.
pub trait Kernel: Send + Sync {
    /// Its name in reports.
    fn name(&self) -> String;
    /// Every array it uses.
    fn operands(&self) -> Vec<Operand>;
    /// The operand whose staging is decided (Arima & Schulz Table 6 target) and the accesses
    /// per element `U` one run makes to it (the paper counts the loop's references).
    fn target(&self) -> (usize, f64);
    /// Byte offsets, in access order, of the first `n` accesses thread `t` of `threads`
    /// makes to operand `op` in one run (the sampler's input).
    ///
    /// # Errors
    /// When an operand cannot be read.
    fn sample(
        &self,
        m: &Manager,
        op: usize,
        t: usize,
        threads: usize,
        n: usize,
    ) -> Result<Vec<u64>>;
    /// One run: compute through guards and charge every operand's traffic (before the
    /// guards close).
    ///
    /// # Errors
    /// When an operand cannot be opened or has the wrong size.
    fn run(&self, m: &Manager) -> Result<()>;
}

/// Threads a kernel runs on (the rayon pool's).
#[must_use]
pub fn threads() -> usize {
    rayon::current_num_threads().max(1)
}

/// Charge `(operand, traffic)` pairs to their devices (call while their guards are open).
///
/// # Errors
/// When an operand no longer exists.
pub fn charge(m: &Manager, ops: &[(ObjectId, Traffic)]) -> Result<()> {
    let t = threads();
    let c: Vec<_> = ops
        .iter()
        .map(|&(id, x)| (id, x.read_bytes, x.steps(t), x.write_bytes))
        .collect();
    m.charge_steps(&c, t)
}

/// The rows of `c = f(a, b)` for `n x n` row-major `f64` matrices, split over the threads:
/// `row(i, c_row, a, b)` writes row `i`; the three matrices' `traffic` is charged before
/// their guards close (`what` names the kernel in errors).
///
/// # Errors
/// When a matrix cannot be opened or is not `n x n`.
pub fn matrix_rows(
    m: &Manager,
    what: &str,
    [a, b, c]: [ObjectId; 3],
    n: u64,
    traffic: [Traffic; 3],
    row: impl Fn(usize, &mut [f64], &[f64], &[f64]) + Sync,
) -> Result<()> {
    let nn = n * n;
    let ga = m.read(a)?;
    let gb = m.read(b)?;
    let mut gc = m.write(c)?;
    let av = view::<f64>(&format!("{what} a"), ga.as_slice(), nn)?;
    let bv = view::<f64>(&format!("{what} b"), gb.as_slice(), nn)?;
    let cv = view_mut::<f64>(&format!("{what} c"), gc.as_mut_slice(), nn)?;
    let n = n as usize;
    let rows = n.div_ceil(threads()).max(1);
    cv.par_chunks_mut(rows * n)
        .enumerate()
        .for_each(|(k, block)| {
            for (r, crow) in block.chunks_mut(n).enumerate() {
                row(k * rows + r, crow, av, bv);
            }
        });
    charge(m, &[(a, traffic[0]), (b, traffic[1]), (c, traffic[2])])
}

/// Plain numbers a guard's bytes can be viewed as.
pub trait Plain: Copy + Send + Sync + 'static {}
impl Plain for f64 {}
impl Plain for u64 {}
impl Plain for i64 {}
impl Plain for u32 {}

fn check_view<T: Plain>(what: &str, bytes: usize, align: usize, want: u64) -> Result<usize> {
    let size = std::mem::size_of::<T>();
    tiermem_core::ensure!(
        align.is_multiple_of(std::mem::align_of::<T>()) && bytes.is_multiple_of(size),
        "{what}: its {bytes} bytes at alignment {align} cannot be viewed as {size}-byte elements"
    );
    tiermem_core::ensure!(
        (bytes / size) as u64 == want,
        "{what}: has {} elements, the kernel needs {want}",
        bytes / size
    );
    Ok(bytes / size)
}

/// View bytes as `want` elements of `T`.
///
/// # Errors
/// When the bytes are misaligned or not `want` elements.
pub fn view<'a, T: Plain>(what: &str, b: &'a [u8], want: u64) -> Result<&'a [T]> {
    let n = check_view::<T>(what, b.len(), b.as_ptr() as usize, want)?;
    // SAFETY: the pointer is aligned for T and covers n * size_of::<T>() initialised bytes
    // (checked above); every bit pattern is a valid T (Plain types only); the borrow of `b`
    // bounds the result's lifetime.
    Ok(unsafe { std::slice::from_raw_parts(b.as_ptr().cast::<T>(), n) })
}

/// View bytes mutably as `want` elements of `T`.
///
/// # Errors
/// When the bytes are misaligned or not `want` elements.
pub fn view_mut<'a, T: Plain>(what: &str, b: &'a mut [u8], want: u64) -> Result<&'a mut [T]> {
    let n = check_view::<T>(what, b.len(), b.as_ptr() as usize, want)?;
    // SAFETY: as in `view`; the exclusive borrow of `b` makes the result exclusive.
    Ok(unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr().cast::<T>(), n) })
}

/// Which of a run's threads owns `[start, end)` of `n` items (a static schedule: equal
/// contiguous shares, as the paper's OpenMP loops).
#[must_use]
pub fn share(n: usize, t: usize, threads: usize) -> (usize, usize) {
    let per = n.div_ceil(threads.max(1));
    ((t * per).min(n), ((t + 1) * per).min(n))
}

/// The kernels [`build`] makes, each with the objects and parameters it takes (names
/// exported to the layers above as the vocabulary, never copied).
pub const KERNELS: &[(&str, &[&str], &[&str])] = &[
    ("random_access", &["table"], &["len", "updates"]),
    ("ptrans", &["a", "b", "c"], &["n"]),
    ("jacobi2d", &["u", "v"], &["ny", "nx", "sweeps"]),
    ("jacobi3d", &["u", "v"], &["nz", "ny", "nx", "sweeps"]),
    (
        "spmv",
        &["rowptr", "cols", "vals", "x", "y"],
        &["rows", "ncols", "nnz", "reps"],
    ),
    ("fft", &["data"], &["n"]),
    ("dgemm", &["a", "b", "c"], &["n"]),
    ("probe", &["data"], &["len", "order", "read", "write"]),
];

/// A kernel by name from its objects and parameters, each given by the names [`KERNELS`]
/// lists (`probe`'s `order`: 0 random, 1 strided, 2 sequential; `read`/`write`: 0 or 1).
///
/// # Errors
/// For an unknown kernel, a missing or unexpected name, or parameters the kernel refuses.
pub fn build(
    kind: &str,
    objects: &std::collections::HashMap<String, ObjectId>,
    params: &std::collections::HashMap<String, u64>,
) -> Result<Box<dyn Kernel>> {
    let Some(&(_, objs, pars)) = KERNELS.iter().find(|k| k.0 == kind) else {
        let names: Vec<_> = KERNELS.iter().map(|k| k.0).collect();
        tiermem_core::bail!("unknown kernel '{kind}' (known: {})", names.join(", "));
    };
    let mut extra: Vec<_> = objects
        .keys()
        .filter(|k| !objs.contains(&k.as_str()))
        .chain(params.keys().filter(|k| !pars.contains(&k.as_str())))
        .cloned()
        .collect();
    extra.sort();
    tiermem_core::ensure!(
        extra.is_empty(),
        "kernel '{kind}' takes objects {objs:?} and parameters {pars:?}; unexpected: {extra:?}"
    );
    let o = |k: &str| {
        objects.get(k).copied().ok_or_else(|| {
            tiermem_core::Error::InvalidArgument(format!("kernel '{kind}' needs object '{k}'"))
        })
    };
    let p = |k: &str| {
        params.get(k).copied().ok_or_else(|| {
            tiermem_core::Error::InvalidArgument(format!("kernel '{kind}' needs parameter '{k}'"))
        })
    };
    Ok(match kind {
        "random_access" => Box::new(random_access::RandomAccess::new(
            o("table")?,
            p("len")?,
            p("updates")?,
        )?),
        "ptrans" => Box::new(ptrans::Ptrans {
            a: o("a")?,
            b: o("b")?,
            c: o("c")?,
            n: p("n")?,
        }),
        "jacobi2d" => Box::new(jacobi::Jacobi::new(
            o("u")?,
            o("v")?,
            vec![p("ny")?, p("nx")?],
            p("sweeps")?,
        )?),
        "jacobi3d" => Box::new(jacobi::Jacobi::new(
            o("u")?,
            o("v")?,
            vec![p("nz")?, p("ny")?, p("nx")?],
            p("sweeps")?,
        )?),
        "spmv" => Box::new(spmv::Spmv {
            rowptr: o("rowptr")?,
            cols: o("cols")?,
            vals: o("vals")?,
            x: o("x")?,
            y: o("y")?,
            rows: p("rows")?,
            ncols: p("ncols")?,
            nnz: p("nnz")?,
            reps: p("reps")?,
        }),
        "fft" => Box::new(fft::Fft::new(o("data")?, p("n")?)?),
        "dgemm" => Box::new(dgemm::Dgemm {
            a: o("a")?,
            b: o("b")?,
            c: o("c")?,
            n: p("n")?,
        }),
        _ => {
            let order = match p("order")? {
                0 => probe::Order::Random,
                1 => probe::Order::Strided,
                2 => probe::Order::Sequential,
                x => tiermem_core::bail!(
                    "probe: order {x} is not 0 (random), 1 (strided) or 2 (sequential)"
                ),
            };
            Box::new(probe::Probe::new(
                o("data")?,
                p("len")?,
                order,
                p("read")? != 0,
                p("write")? != 0,
            )?)
        }
    })
}
