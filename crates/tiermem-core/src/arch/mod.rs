//! The lowest floor: what the CPU offers. Instruction-set detection (picked once per
//! process; `TIERMEM_DISABLE_AVX512=1` and `TIERMEM_DISABLE_NT=1` turn the faster paths
//! off), streaming copy kernels and cache hints. Depends on nothing else in the crate.

pub mod copy;
pub mod hints;

use std::sync::OnceLock;

/// Which instruction set the non-temporal kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F streaming stores (64 bytes).
    Avx512,
    /// AVX streaming stores (32 bytes).
    Avx2,
    /// No streaming stores: plain `memcpy`.
    Scalar,
}

/// The kernel set chosen for this process.
pub fn isa() -> Isa {
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
