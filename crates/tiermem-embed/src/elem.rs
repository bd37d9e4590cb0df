//! Element types and the small row operations every kernel is built from. All are
//! `#[inline(always)]` so they are compiled into each kernel instantiation (and vectorised
//! with whatever instruction set that instantiation enables).

use super::DType;

/// Run `$body` with the type `$e` bound to the [`Elem`] of `$dtype` (one arm per
/// [`DType`]: the one place a new storage type is dispatched).
macro_rules! with_elem {
    ($dtype:expr, $e:ident => $body:expr) => {
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

impl Elem for F16 {
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::from_bits(self.0).to_f32()
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        F16(half::f16::from_f32(x).to_bits())
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
}
