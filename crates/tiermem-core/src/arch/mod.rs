//! The lowest floor: what the CPU offers. Instruction-set detection (picked once per
//! process; `TIERMEM_DISABLE_AVX512=1` and `TIERMEM_DISABLE_NT=1` turn the faster paths
//! off), streaming copy kernels and cache hints. Depends on nothing else in the crate.

pub mod copy;
pub mod hints;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// Which instruction set the non-temporal kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Isa {
    /// AVX-512F streaming stores (64 bytes).
    Avx512,
    /// AVX streaming stores (32 bytes).
    Avx2,
    /// No streaming stores: plain `memcpy`.
    Scalar,
}

/// An instruction set forced by [`force_isa`] (0: none; else `Isa as u8 + 1`).
static FORCED: AtomicU8 = AtomicU8::new(0);

/// The kernel set chosen for this process (or forced by [`force_isa`]).
pub fn isa() -> Isa {
    match FORCED.load(Ordering::Relaxed) {
        1 => return Isa::Avx512,
        2 => return Isa::Avx2,
        3 => return Isa::Scalar,
        _ => {}
    }
    detected()
}

/// Every instruction set this CPU can run, best first (what tests compare kernels over).
#[must_use]
pub fn available() -> Vec<Isa> {
    let best = detected();
    [Isa::Avx512, Isa::Avx2, Isa::Scalar]
        .into_iter()
        .filter(|i| *i as u8 >= best as u8)
        .collect()
}

/// Make [`isa`] return `isa` for the whole process (kernel tests run each instruction set
/// in turn), or the detected one again with `None`. Refuses an instruction set this CPU
/// lacks (running it would be undefined behaviour). Process-wide: every set gives the same
/// results, so other threads only run a different, equally correct, kernel.
pub fn force_isa(isa: Option<Isa>) -> crate::Result<()> {
    if let Some(i) = isa {
        crate::ensure!(
            available().contains(&i),
            "this CPU cannot run {i:?} kernels (it has {:?})",
            available()
        );
    }
    FORCED.store(isa.map_or(0, |i| i as u8 + 1), Ordering::Relaxed);
    Ok(())
}

fn detected() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let off = |v: &str| std::env::var(v).is_ok_and(|s| s == "1");
        if off("TIERMEM_DISABLE_NT") {
            return Isa::Scalar;
        }
        #[cfg(target_arch = "x86_64")]
        {
            if !off("TIERMEM_DISABLE_AVX512") && std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    })
}
