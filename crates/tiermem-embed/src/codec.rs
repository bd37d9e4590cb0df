//! Row codecs: how a stored row becomes the `f32` the kernels compute in, and back. Every
//! per-element type ([`Elem`]: `f32`, bfloat16, float16) is a codec element by element;
//! [`Int8Rows`] is FBGEMM's 8-bit row-wise layout (`width` bytes of codes, then an `f32`
//! scale and an `f32` bias: a value is `scale * code + bias`), for inference. Lookups and
//! row copies go through a codec ([`with_codec`]); updates need an [`Elem`].

use super::elem::{add_row, load_row, store_row, Elem};

/// Run `$body` with the type `$c` bound to the [`RowCodec`] of `$dtype` (one arm per
/// [`DType`]).
macro_rules! with_codec {
    ($dtype:expr, $c:ident => $body:expr) => {
        match $dtype {
            $crate::DType::Int8 => {
                type $c = $crate::codec::Int8Rows;
                $body
            }
            float => $crate::elem::with_elem!(float, $c => $body; int8 => unreachable!("matched above")),
        }
    };
}
pub(crate) use with_codec;

/// A stored row's encoding (see the module docs). Pointers are to a row's first byte; the
/// row holds `width` values for a `width`-long slice.
pub(crate) trait RowCodec: Send + Sync + 'static {
    /// `acc[k] += scale * row[k]`.
    ///
    /// # Safety
    /// `row` must be valid for one stored row of `acc.len()` values.
    unsafe fn add_row(acc: &mut [f32], row: *const u8, scale: f32);

    /// `acc[k] += row[k]`.
    ///
    /// # Safety
    /// As [`RowCodec::add_row`].
    unsafe fn sum_row(acc: &mut [f32], row: *const u8);

    /// `out[k] = row[k]`.
    ///
    /// # Safety
    /// As [`RowCodec::add_row`], for `out.len()` values.
    unsafe fn load_row(out: &mut [f32], row: *const u8);

    /// Encode `vals` into the row at `dst` (non-temporal stores where the type allows and
    /// `nt` is set; see [`store_row`]).
    ///
    /// # Safety
    /// `dst` must be valid for one stored row of `vals.len()` values.
    unsafe fn store_row(dst: *mut u8, vals: &[f32], nt: bool);
}

impl<E: Elem> RowCodec for E {
    #[inline(always)]
    unsafe fn add_row(acc: &mut [f32], row: *const u8, scale: f32) {
        // SAFETY: forwarded contract; rows of element types are element-aligned.
        unsafe { add_row::<E>(acc, row.cast(), scale) }
    }

    #[inline(always)]
    unsafe fn sum_row(acc: &mut [f32], row: *const u8) {
        // SAFETY: as above.
        unsafe { super::elem::sum_row::<E>(acc, row.cast()) }
    }

    #[inline(always)]
    unsafe fn load_row(out: &mut [f32], row: *const u8) {
        // SAFETY: as above.
        unsafe { load_row::<E>(out, row.cast()) }
    }

    #[inline(always)]
    unsafe fn store_row(dst: *mut u8, vals: &[f32], nt: bool) {
        // SAFETY: as above.
        unsafe { store_row::<E>(dst.cast(), vals, nt) }
    }
}

/// FBGEMM's 8-bit row-wise rows (`SparseType.INT8`; PyTorch's
/// `quantized.embedding_bag_byte_prepack`).
pub(crate) struct Int8Rows;

impl Int8Rows {
    /// Bytes of a stored row of `width` values: the codes, the scale and the bias.
    pub(crate) const fn row_bytes(width: usize) -> usize {
        width + 8
    }

    /// The row's `(scale, bias)`.
    ///
    /// # Safety
    /// `row` must be valid for a stored row of `width` values.
    #[inline(always)]
    unsafe fn scale_bias(row: *const u8, width: usize) -> (f32, f32) {
        // SAFETY: the scale and bias are the 8 bytes after the codes, inside the row; they
        // may be unaligned (any width).
        unsafe {
            let sb = row.add(width).cast::<[u8; 4]>();
            (
                f32::from_le_bytes(sb.read_unaligned()),
                f32::from_le_bytes(sb.add(1).read_unaligned()),
            )
        }
    }

    /// `out[k] = a * code[k] + b` style accumulation: `acc[k] += w * (scale * code + bias)`.
    ///
    /// # Safety
    /// As [`RowCodec::add_row`].
    #[inline(always)]
    unsafe fn accumulate(acc: &mut [f32], row: *const u8, w: f32) {
        // SAFETY: forwarded contract.
        let (scale, bias) = unsafe { Self::scale_bias(row, acc.len()) };
        let (a, b) = (w * scale, w * bias);
        for (k, x) in acc.iter_mut().enumerate() {
            // SAFETY: k < width, inside the row's codes.
            *x += a * f32::from(unsafe { row.add(k).read() }) + b;
        }
    }
}

impl RowCodec for Int8Rows {
    #[inline(always)]
    unsafe fn add_row(acc: &mut [f32], row: *const u8, scale: f32) {
        // SAFETY: forwarded contract.
        unsafe { Self::accumulate(acc, row, scale) }
    }

    #[inline(always)]
    unsafe fn sum_row(acc: &mut [f32], row: *const u8) {
        // SAFETY: forwarded contract.
        unsafe { Self::accumulate(acc, row, 1.0) }
    }

    #[inline(always)]
    unsafe fn load_row(out: &mut [f32], row: *const u8) {
        // SAFETY: forwarded contract.
        let (scale, bias) = unsafe { Self::scale_bias(row, out.len()) };
        for (k, o) in out.iter_mut().enumerate() {
            // SAFETY: k < width, inside the row's codes.
            *o = scale * f32::from(unsafe { row.add(k).read() }) + bias;
        }
    }

    /// Quantise as FBGEMM does (`FloatToFused8BitRowwiseQuantizedSBFloat`): bias the row's
    /// minimum, scale its range over 255, codes rounded to nearest even.
    unsafe fn store_row(dst: *mut u8, vals: &[f32], _nt: bool) {
        let min = vals.iter().copied().fold(f32::INFINITY, f32::min);
        let max = vals.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let range = max - min;
        let inverse = 255.0 / (range + 1e-8);
        for (k, v) in vals.iter().enumerate() {
            let code = ((v - min) * inverse).round_ties_even().clamp(0.0, 255.0) as u8;
            // SAFETY: k < width, inside the row's codes.
            unsafe { dst.add(k).write(code) };
        }
        // SAFETY: the scale and bias follow the codes inside the row (unaligned writes).
        unsafe {
            let sb = dst.add(vals.len()).cast::<[u8; 4]>();
            sb.write_unaligned((range / 255.0).to_le_bytes());
            sb.add(1).write_unaligned(min.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(vals: &[f32]) -> (Vec<u8>, Vec<f32>) {
        let mut row = vec![0u8; Int8Rows::row_bytes(vals.len())];
        let mut back = vec![0f32; vals.len()];
        // SAFETY: `row` holds one stored row of `vals.len()` values.
        unsafe {
            Int8Rows::store_row(row.as_mut_ptr(), vals, false);
            Int8Rows::load_row(&mut back, row.as_ptr());
        }
        (row, back)
    }

    #[test]
    fn int8_rows_keep_each_value_within_half_a_step() {
        let vals: Vec<f32> = (0..37)
            .map(|k| ((k * 7919) % 101) as f32 / 13.0 - 3.0)
            .collect();
        let (row, back) = roundtrip(&vals);
        let (min, max) = (-3.0f32, 100.0 / 13.0 - 3.0);
        let step = (max - min) / 255.0;
        for (v, b) in vals.iter().zip(&back) {
            assert!((v - b).abs() <= step / 2.0 + 1e-5, "{v} came back as {b}");
        }
        assert_eq!(row[vals.iter().position(|&v| v == min).unwrap()], 0);
        assert_eq!(row[vals.iter().position(|&v| v == max).unwrap()], 255);
    }

    #[test]
    fn a_constant_row_comes_back_exactly() {
        let (row, back) = roundtrip(&[2.5; 5]);
        assert!(row[..5].iter().all(|&c| c == 0));
        assert_eq!(back, vec![2.5; 5]);
    }

    #[test]
    fn weighted_sums_dequantise_each_row() {
        let (row, back) = roundtrip(&[1.0, -2.0, 0.5]);
        let mut acc = vec![1.0f32; 3];
        // SAFETY: `row` is one stored row of 3 values.
        unsafe { Int8Rows::add_row(&mut acc, row.as_ptr(), 2.0) };
        for (a, b) in acc.iter().zip(&back) {
            assert!((a - (1.0 + 2.0 * b)).abs() < 1e-5);
        }
    }
}
