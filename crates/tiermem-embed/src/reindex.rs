//! Reindexing (thesis Fig. 5.2 step 4): turn one table's lookup indices into per-row update
//! lists in CSR form — a histogram of the rows seen (in first-seen order), a prefix sum, and
//! a second pass placing each index position under its row — so the backward pass can
//! accumulate each row's whole gradient and apply the optimizer once, lock-free, per row.

/// Update lists of one table.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Csr {
    /// Distinct rows, in the order first seen.
    pub rows: Vec<u32>,
    /// `starts[u]..starts[u + 1]` are row `rows[u]`'s entries in `positions`.
    pub starts: Vec<u32>,
    /// Positions in `values` that name each row.
    pub positions: Vec<u32>,
}

/// Reindex `values` (every value already checked to be `< slot_of.len()` after the caller
/// grows it to the table's rows). `slot_of` is scratch, all `u32::MAX` on entry and exit.
///
/// # Panics
/// If `values` has more than `u32::MAX` entries or a value is out of `slot_of`'s range
/// (callers check both first).
pub fn reindex(values: &[i64], slot_of: &mut [u32]) -> Csr {
    assert!(
        u32::try_from(values.len()).is_ok(),
        "too many indices for one call"
    );
    let mut rows = Vec::new();
    let mut counts: Vec<u32> = Vec::new();
    for &v in values {
        let s = &mut slot_of[v as usize];
        if *s == u32::MAX {
            *s = rows.len() as u32;
            rows.push(v as u32);
            counts.push(0);
        }
        counts[*s as usize] += 1;
    }
    let mut starts = Vec::with_capacity(rows.len() + 1);
    let mut sum = 0u32;
    starts.push(0);
    for c in &counts {
        sum += c;
        starts.push(sum);
    }
    // Reuse counts as fill cursors.
    counts.copy_from_slice(&starts[..rows.len()]);
    let mut positions = vec![0u32; values.len()];
    for (p, &v) in values.iter().enumerate() {
        let s = slot_of[v as usize] as usize;
        positions[counts[s] as usize] = p as u32;
        counts[s] += 1;
    }
    for &r in &rows {
        slot_of[r as usize] = u32::MAX;
    }
    Csr {
        rows,
        starts,
        positions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn csr_lists_every_position_once_under_its_row(
            values in proptest::collection::vec(0i64..50, 0..400)
        ) {
            let mut scratch = vec![u32::MAX; 50];
            let c = reindex(&values, &mut scratch);
            prop_assert!(scratch.iter().all(|&s| s == u32::MAX), "scratch restored");
            prop_assert_eq!(c.starts.len(), c.rows.len() + 1);
            prop_assert_eq!(*c.starts.last().unwrap() as usize, values.len());
            let mut seen = vec![false; values.len()];
            let mut rows = c.rows.clone();
            rows.sort_unstable();
            rows.dedup();
            prop_assert_eq!(rows.len(), c.rows.len(), "rows are distinct");
            for (u, &r) in c.rows.iter().enumerate() {
                let ps = &c.positions[c.starts[u] as usize..c.starts[u + 1] as usize];
                prop_assert!(!ps.is_empty());
                prop_assert!(ps.windows(2).all(|w| w[0] < w[1]), "positions ascend");
                for &p in ps {
                    prop_assert_eq!(values[p as usize], i64::from(r));
                    prop_assert!(!seen[p as usize]);
                    seen[p as usize] = true;
                }
            }
            prop_assert!(seen.iter().all(|&s| s));
            // First-seen order.
            let mut first = Vec::new();
            for &v in &values {
                if !first.contains(&(v as u32)) {
                    first.push(v as u32);
                }
            }
            prop_assert_eq!(first, c.rows);
        }
    }

    #[test]
    fn figure_5_2_example() {
        // Bags {1,4,5}, {2,4}, {1,4,5} in the thesis's 1-based example, here 0-based.
        let values = [0i64, 3, 4, 1, 3, 0, 3, 4];
        let mut scratch = vec![u32::MAX; 5];
        let c = reindex(&values, &mut scratch);
        assert_eq!(c.rows, vec![0, 3, 4, 1]);
        assert_eq!(c.starts, vec![0, 2, 5, 7, 8]);
        assert_eq!(c.positions, vec![0, 5, 1, 4, 6, 2, 7, 3]);
        assert!(scratch.iter().all(|&s| s == u32::MAX));
    }
}
