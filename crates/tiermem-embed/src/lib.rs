//! Tiered embedding tables (thesis §5.2–5.4): row storage directly on one device or cached
//! (base rows on a slow byte-addressable device, hot rows in cache pages in fast memory),
//! and the kernels that run on them: ensemble lookups (non-reducing, sum, mean, per-sample
//! weights) and fused backward + optimizer updates (SGD, Adagrad, row-wise Adagrad) that never
//! build a dense gradient.
//!
//! The split follows thesis Table 5.2: kernels see a table only through
//! [`Table::featuresize`] and a row-pointer source ([`rows::RowSource`]), so one kernel
//! serves the direct table, the cached table and every cache policy.

/// The widest row a table takes (elements): 16 Mi, 64 MiB of `f32` per row.
pub const MAX_WIDTH: usize = 1 << 24;

pub mod bags;
pub mod blockfile;
pub mod cache;
pub(crate) mod codec;
pub mod criteo;
pub(crate) mod elem;
pub mod home;
pub mod layout;
pub mod lookup;
pub mod minicache;
pub mod mrc;
pub mod optim;
pub mod reference;
pub mod reindex;
pub mod rows;
pub mod table;
pub mod update;
pub mod workload;

pub use bags::Bags;
pub use cache::{CacheConfig, CachePolicy, PolicyRef};
pub use lookup::{lookup, LookupOut, Mode};
pub use optim::{Optimizer, OptimizerConfig, RowOptimizer};
pub use table::{Cache, Shape, Table, TableStats};
pub use update::update;

use tiermem_core::{bail, Result};

/// Storage type of a table's elements. Kernels accumulate and update in `f32` whatever the
/// storage type; outputs are `f32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// IEEE single precision.
    F32,
    /// bfloat16 (the top half of an `f32`; stores round to nearest even).
    Bf16,
    /// IEEE half precision (stores round to nearest even).
    F16,
    /// FBGEMM's 8-bit row-wise rows: a byte per value, then an `f32` scale and an `f32`
    /// bias per row (stores quantise each row over its range); for inference: tables of
    /// these rows take no updates.
    Int8,
}

impl DType {
    /// Every storage type's name as NumPy and PyTorch spell it ([`DType::parse`] also
    /// takes `f32` and `bf16`).
    pub const NAMES: &'static [&'static str] = &["float32", "bfloat16", "float16", "int8_rowwise"];

    /// Parse a name of [`DType::NAMES`] or `f32`, `bf16`, `f16`, `int8`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "f32" | "float32" => Ok(DType::F32),
            "bf16" | "bfloat16" => Ok(DType::Bf16),
            "f16" | "float16" => Ok(DType::F16),
            "int8_rowwise" | "int8" => Ok(DType::Int8),
            _ => bail!(
                "unknown embedding dtype '{s}' (known: {})",
                Self::NAMES.join(", ")
            ),
        }
    }

    /// Bytes a row of `width` values takes (before any padding to a stride).
    #[must_use]
    pub fn row_bytes(self, width: usize) -> usize {
        match self {
            DType::F32 => 4 * width,
            DType::Bf16 | DType::F16 => 2 * width,
            DType::Int8 => codec::Int8Rows::row_bytes(width),
        }
    }

    /// Name as NumPy/PyTorch spell it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::Bf16 => "bfloat16",
            DType::F16 => "float16",
            DType::Int8 => "int8_rowwise",
        }
    }
}

/// Dispatch `$body` with `const $w: usize` set to `$width` when it is one of the widths with
/// kernels specialised at compile time (16, 32, 64, 128, 256 elements: partial sums kept in
/// registers), or to 0 (the general path) for any other width.
macro_rules! with_width {
    ($width:expr, $w:ident => $body:expr) => {
        match $width {
            16 => {
                const $w: usize = 16;
                $body
            }
            32 => {
                const $w: usize = 32;
                $body
            }
            64 => {
                const $w: usize = 64;
                $body
            }
            128 => {
                const $w: usize = 128;
                $body
            }
            256 => {
                const $w: usize = 256;
                $body
            }
            _ => {
                const $w: usize = 0;
                $body
            }
        }
    };
}
pub(crate) use with_width;

/// Define `dispatch::<E, R, W>(j: &Job, rows: &R) -> $ret` (`E` bounded by `$bound`:
/// [`elem::Elem`] or [`codec::RowCodec`]), which runs the module's
/// `unsafe fn body::<E, R, W>` compiled for the best instruction set this CPU has (AVX-512F,
/// AVX2 or baseline; `TIERMEM_DISABLE_AVX512=1` skips the first). `body` must be
/// `#[inline(always)]` so each variant gets its own vectorised copy.
macro_rules! isa_dispatch {
    ($ret:ty, $bound:ident) => {
        fn dispatch<E: $bound, R: RowSource, const W: usize>(j: &Job<'_>, rows: &R) -> $ret {
            match ::tiermem_core::arch::isa() {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX-512F was detected at run time; `body`'s contract is the caller's.
                ::tiermem_core::arch::Isa::Avx512 => unsafe { body_avx512::<E, R, W>(j, rows) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX2 was detected at run time; as above.
                ::tiermem_core::arch::Isa::Avx2 => unsafe { body_avx2::<E, R, W>(j, rows) },
                // SAFETY: `body`'s contract is the caller's.
                _ => unsafe { body::<E, R, W>(j, rows) },
            }
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f")]
        unsafe fn body_avx512<E: $bound, R: RowSource, const W: usize>(j: &Job<'_>, r: &R) -> $ret {
            // SAFETY: forwarded contract.
            unsafe { body::<E, R, W>(j, r) }
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2")]
        unsafe fn body_avx2<E: $bound, R: RowSource, const W: usize>(j: &Job<'_>, r: &R) -> $ret {
            // SAFETY: forwarded contract.
            unsafe { body::<E, R, W>(j, r) }
        }
    };
}
pub(crate) use isa_dispatch;
