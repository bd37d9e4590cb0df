//! Element types and the small row operations every kernel is built from. All are
//! `#[inline(always)]` so they are compiled into each kernel instantiation (and vectorised
//! with whatever instruction set that instantiation enables).

use super::DType;

/// Run `$body` with the type `$e` bound to the [`Elem`] of `$dtype` (one arm per
/// per-element [`DType`]: the one place a new element type is dispatched), or `$int8` for
/// 8-bit row-wise rows, which have no per-element type (see [`crate::codec`]).
macro_rules! with_elem {
    ($dtype:expr, $e:ident => $body:expr; int8 => $int8:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $e = f32;
                $body
            }
            $crate::DType::Bf16 => {
                type $e = $crate::elem::Bf16;
                $body
            }
            $crate::DType::F16 => {
                type $e = $crate::elem::F16;
                $body
            }
            $crate::DType::Int8 => $int8,
        }
    };
}
pub(crate) use with_elem;

/// A storage element: converts to and from the `f32` the kernels compute in.
pub(crate) trait Elem: Copy + Send + Sync + 'static {
    /// The matching [`DType`].
    const DTYPE: DType;
    /// Widen to `f32`.
    fn to_f32(self) -> f32;
    /// Narrow from `f32` (round to nearest even).
    fn from_f32(x: f32) -> Self;
}

impl Elem for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

/// bfloat16 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub(crate) struct Bf16(pub u16);

impl Elem for Bf16 {
    const DTYPE: DType = DType::Bf16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self.0) << 16)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        if x.is_nan() {
            return Bf16(0x7fc0);
        }
        let b = x.to_bits();
        let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1));
        Bf16((rounded >> 16) as u16)
    }
}

/// IEEE half-precision bits (FBGEMM's `FP16` rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub(crate) struct F16(pub u16);

// The conversions are branch-free integer and float arithmetic (selects, not jumps), so the
// compiler vectorises a row's loop in every kernel instantiation whatever the instruction
// set; the tests check them against the `half` crate on every float16 value and on float32
// values around every rounding boundary.
impl Elem for F16 {
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        let h = u32::from(self.0);
        let shifted = (h & 0x7fff) << 13; // exponent and mantissa in f32 position
        let exp = shifted & 0x0f80_0000;
        let normal = shifted + ((127 - 15) << 23); // rebias
        let inf_nan = normal + ((128 - 16) << 23); // all-ones exponent stays all ones
                                                   // Subnormal (or zero): one more exponent step, then subtract 2^-14 to renormalise.
        let sub = f32::from_bits(normal + (1 << 23)) - f32::from_bits(113 << 23);
        let bits = if exp == 0x0f80_0000 {
            inf_nan
        } else if exp == 0 {
            sub.to_bits()
        } else {
            normal
        };
        f32::from_bits(bits | ((h & 0x8000) << 16))
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        const F16_MAX_PLUS: u32 = (127 + 16) << 23; // 2^16: at or above rounds to infinity
        const DENORM_MAGIC: u32 = ((127 - 15) + (23 - 10) + 1) << 23;
        let bits = x.to_bits();
        let sign = (bits >> 16) & 0x8000;
        let a = bits & 0x7fff_ffff;
        let inf_nan = if a > 0x7f80_0000 { 0x7e00 } else { 0x7c00 };
        // Below 2^-14: the float adder rounds the mantissa into place (to nearest even).
        let sub = (f32::from_bits(a) + f32::from_bits(DENORM_MAGIC)).to_bits() - DENORM_MAGIC;
        // Normal: rebias, add half an ulp less one plus the kept mantissa's low bit (ties
        // to even), and drop the 13 low bits.
        let odd = (a >> 13) & 1;
        let normal =
            (a.wrapping_add(((15u32.wrapping_sub(127)) << 23).wrapping_add(0xfff)) + odd) >> 13;
        let h = if a >= F16_MAX_PLUS {
            inf_nan
        } else if a < (113 << 23) {
            sub
        } else {
            normal
        };
        F16((h | sign) as u16)
    }
}

/// `acc[k] += scale * row[k]` for `k < acc.len()`.
///
/// # Safety
/// `row` must be valid for `acc.len()` reads.
#[inline(always)]
pub(crate) unsafe fn add_row<E: Elem>(acc: &mut [f32], row: *const E, scale: f32) {
    for (k, a) in acc.iter_mut().enumerate() {
        // SAFETY: k < acc.len(), inside the caller's row.
        *a += scale * unsafe { row.add(k).read() }.to_f32();
    }
}

/// `acc[k] += row[k]` (no scale: a plain sum).
///
/// # Safety
/// As [`add_row`].
#[inline(always)]
pub(crate) unsafe fn sum_row<E: Elem>(acc: &mut [f32], row: *const E) {
    for (k, a) in acc.iter_mut().enumerate() {
        // SAFETY: k < acc.len(), inside the caller's row.
        *a += unsafe { row.add(k).read() }.to_f32();
    }
}

/// Copy a row into `f32` output.
///
/// # Safety
/// `row` must be valid for `out.len()` reads.
#[inline(always)]
pub(crate) unsafe fn load_row<E: Elem>(out: &mut [f32], row: *const E) {
    for (k, o) in out.iter_mut().enumerate() {
        // SAFETY: k < out.len(), inside the caller's row.
        *o = unsafe { row.add(k).read() }.to_f32();
    }
}

/// Store `vals` into `dst`, with non-temporal (streaming) stores when `nt` is set and the
/// row is `f32`, 16-byte aligned and a multiple of 16 bytes; ordinary stores otherwise.
/// Streaming stores need an [`tiermem_core::arch::hints::sfence`] before other threads read the data.
///
/// # Safety
/// `dst` must be valid for `vals.len()` writes.
#[inline(always)]
pub(crate) unsafe fn store_row<E: Elem>(dst: *mut E, vals: &[f32], nt: bool) {
    #[cfg(target_arch = "x86_64")]
    if nt
        && E::DTYPE == DType::F32
        && (dst as usize).is_multiple_of(16)
        && vals.len().is_multiple_of(4)
    {
        use std::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
        let d = dst.cast::<f32>();
        for k in (0..vals.len()).step_by(4) {
            // SAFETY: k + 4 <= len; d is 16-byte aligned so d + k is too (k multiple of 4
            // floats); SSE is part of x86_64.
            unsafe { _mm_stream_ps(d.add(k), _mm_loadu_ps(vals.as_ptr().add(k))) };
        }
        return;
    }
    let _ = nt;
    for (k, v) in vals.iter().enumerate() {
        // SAFETY: k < len, inside the caller's row.
        unsafe { dst.add(k).write(E::from_f32(*v)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        for x in [0.0f32, 1.0, -2.5, 3.140_625, 1e-30, 65504.0] {
            let b = Bf16::from_f32(x);
            assert!((b.to_f32() - x).abs() <= x.abs() / 128.0, "{x}");
        }
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
        assert_eq!(Bf16::from_f32(1.0 + 1.0 / 256.0).to_f32(), 1.0);
        assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
        assert_eq!(Bf16::from_f32(f32::INFINITY).to_f32(), f32::INFINITY);
    }

    #[test]
    fn f16_rounds_to_nearest_even_with_subnormals_and_overflow() {
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties go to the even mantissa.
        assert_eq!(F16::from_f32(1.0 + 1.0 / 2048.0).to_f32(), 1.0);
        assert_eq!(
            F16::from_f32(1.0 + 3.0 / 2048.0).to_f32(),
            1.0 + 2.0 / 1024.0
        );
        assert_eq!(F16::from_f32(65504.0).to_f32(), 65504.0);
        assert_eq!(F16::from_f32(1e6).to_f32(), f32::INFINITY);
        let tiny = 2f32.powi(-24); // the smallest subnormal
        assert_eq!(F16::from_f32(tiny).to_f32(), tiny);
        assert_eq!(F16::from_f32(tiny / 4.0).to_f32(), 0.0);
        assert!(F16::from_f32(f32::NAN).to_f32().is_nan());
        assert_eq!(F16::from_f32(-0.0).0, 0x8000);
    }

    #[test]
    fn f16_conversions_equal_the_half_crate_on_every_value_and_boundary() {
        for h in 0..=u16::MAX {
            let (ours, theirs) = (F16(h).to_f32(), half::f16::from_bits(h).to_f32());
            assert!(
                ours.to_bits() == theirs.to_bits() || (ours.is_nan() && theirs.is_nan()),
                "{h:#06x}"
            );
            // Every f16 value, and the f32 values either side of it and halfway to the next.
            let next = half::f16::from_bits(h.wrapping_add(1)).to_f32();
            let mid = (f64::from(theirs) + f64::from(next)) / 2.0;
            for x in [
                theirs,
                f32::from_bits(theirs.to_bits().wrapping_add(1)),
                f32::from_bits(theirs.to_bits().wrapping_sub(1)),
                mid as f32,
            ] {
                let (a, b) = (F16::from_f32(x).0, half::f16::from_f32(x).to_bits());
                let nan = half::f16::from_bits(b).is_nan();
                assert!(
                    a == b || (nan && half::f16::from_bits(a).is_nan()),
                    "{x:e}: {a:#06x} vs {b:#06x}"
                );
            }
        }
    }
}
