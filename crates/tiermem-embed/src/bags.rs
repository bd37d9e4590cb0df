//! Bags of indices in the `torch.nn.EmbeddingBag` / KeyedJaggedTensor layout: `values` holds
//! every index, bag `b` is `values[offsets[b]..offsets[b + 1]]` (CSR; `offsets` has one more
//! entry than there are bags), and optional per-sample weights run parallel to `values`.

use std::ops::Range;

use tiermem_core::{ensure, Error, Result};

/// Validated bags for one table.
#[derive(Debug, Clone, Copy)]
pub struct Bags<'a> {
    values: &'a [i64],
    offsets: &'a [i64],
    weights: Option<&'a [f32]>,
}

impl<'a> Bags<'a> {
    /// Check the layout: `offsets` starts at 0, never decreases and ends at `values.len()`;
    /// `weights`, if given, has one entry per value. `table` names the table in errors.
    /// Indices are range-checked by the kernels, which read them anyway.
    pub fn new(
        table: usize,
        values: &'a [i64],
        offsets: &'a [i64],
        weights: Option<&'a [f32]>,
    ) -> Result<Self> {
        ensure!(
            !offsets.is_empty(),
            "table {table}: offsets is empty; it needs one entry per bag plus the end \
             (include_last_offset layout)"
        );
        ensure!(
            offsets[0] == 0,
            "table {table}: offsets[0] is {}, it must be 0",
            offsets[0]
        );
        if let Some(b) = offsets.windows(2).position(|w| w[1] < w[0]) {
            return Err(Error::InvalidArgument(format!(
                "table {table}: offsets must not decrease, but offsets[{}] = {} > offsets[{}] = {}",
                b,
                offsets[b],
                b + 1,
                offsets[b + 1]
            )));
        }
        let last = offsets[offsets.len() - 1];
        ensure!(
            usize::try_from(last).ok() == Some(values.len()),
            "table {table}: the last offset is {last} but there are {} indices (it must equal \
             the number of indices)",
            values.len()
        );
        if let Some(w) = weights {
            ensure!(
                w.len() == values.len(),
                "table {table}: {} per-sample weights for {} indices (need one per index)",
                w.len(),
                values.len()
            );
        }
        Ok(Bags {
            values,
            offsets,
            weights,
        })
    }

    /// Number of bags.
    #[must_use]
    pub fn batch(&self) -> usize {
        self.offsets.len() - 1
    }

    /// All indices.
    #[must_use]
    pub fn values(&self) -> &'a [i64] {
        self.values
    }

    /// Per-sample weights.
    #[must_use]
    pub fn weights(&self) -> Option<&'a [f32]> {
        self.weights
    }

    /// Positions in `values` of bag `b`.
    #[must_use]
    pub fn bag(&self, b: usize) -> Range<usize> {
        // Validated in `new`: non-negative, non-decreasing, bounded by values.len().
        self.offsets[b] as usize..self.offsets[b + 1] as usize
    }
}

/// Check that every index of table `table` lies in `0..rows`, naming the first that does not.
pub fn check_indices(table: usize, values: &[i64], rows: usize) -> Result<()> {
    match values.iter().position(|&v| (v as u64) >= rows as u64) {
        None => Ok(()),
        Some(position) => Err(Error::IndexOutOfRange {
            table,
            position,
            value: values[position],
            rows,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_errors_name_the_problem() {
        let v = [1i64, 2, 3];
        let e = |o: &[i64]| Bags::new(2, &v, o, None).unwrap_err().to_string();
        assert!(e(&[]).contains("offsets is empty"));
        assert!(e(&[1, 3]).contains("offsets[0] is 1"));
        assert!(e(&[0, 2, 1, 3]).contains("offsets[1] = 2 > offsets[2] = 1"));
        assert!(e(&[0, 4]).contains("last offset is 4"));
        assert!(e(&[0, 2]).contains("table 2"));
        let w = [1.0f32];
        assert!(Bags::new(0, &v, &[0, 3], Some(&w)).is_err());
        let b = Bags::new(0, &v, &[0, 0, 3], None).unwrap();
        assert_eq!((b.batch(), b.bag(0), b.bag(1)), (2, 0..0, 0..3));
        assert!(matches!(
            check_indices(1, &[0, -1], 5),
            Err(Error::IndexOutOfRange {
                table: 1,
                position: 1,
                value: -1,
                rows: 5
            })
        ));
    }
}
