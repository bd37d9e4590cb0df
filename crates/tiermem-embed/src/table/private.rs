//! The devices of a table that brings its own manager (made without one): sized here, once,
//! for every caller (the Python table, the torch modules, the DLRM trainer).

/// Room for a cache's page rounding on top of its rows.
const CACHE_HEADROOM: u64 = 4 << 20;
/// Room for alignment on top of the base rows.
const BASE_HEADROOM: u64 = 1 << 20;
/// The least a private DRAM device is made with.
const MIN_DRAM: u64 = 1 << 20;

/// The devices, `(spec, bytes)` fastest first, of a private manager for a table of
/// `table_bytes` whose rows live on device `spec`, cached or not: `cache` is the cache's
/// size and slack as fractions of the table. DRAM holds the rows (a direct table on
/// `dram`) or the cache (its rows, at most the table's, and room for page rounding); `spec`
/// holds the base rows when it is not `dram`.
#[must_use]
pub fn private_devices(
    spec: &str,
    table_bytes: u64,
    cache: Option<(f64, f64)>,
) -> Vec<(String, u64)> {
    let mut devs = Vec::with_capacity(2);
    if cache.is_some() || spec == "dram" {
        let need = match cache {
            _ if spec == "dram" => table_bytes,
            Some((lower, slack)) => {
                (table_bytes as f64 * (lower + slack).clamp(0.0, 1.0)) as u64 + CACHE_HEADROOM
            }
            None => table_bytes,
        };
        devs.push(("dram".to_owned(), need.max(MIN_DRAM)));
    }
    if spec != "dram" {
        devs.push((spec.to_owned(), table_bytes + BASE_HEADROOM));
    }
    devs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_manager_holds_the_rows_and_the_cache() {
        let mib = 1u64 << 20;
        assert_eq!(
            private_devices("dram", 100 * mib, None),
            [("dram".to_owned(), 100 * mib)]
        );
        assert_eq!(
            private_devices("dram", 10, None),
            [("dram".to_owned(), mib)]
        );
        assert_eq!(
            private_devices("numa:1", 100 * mib, None),
            [("numa:1".to_owned(), 101 * mib)]
        );
        assert_eq!(
            private_devices("emulated:cxl", 100 * mib, Some((0.25, 0.05))),
            [
                ("dram".to_owned(), 34 * mib),
                ("emulated:cxl".to_owned(), 101 * mib)
            ]
        );
        // A cache is never larger than its table.
        assert_eq!(
            private_devices("emulated:cxl", 100 * mib, Some((1.0, 0.5)))[0].1,
            104 * mib
        );
    }
}
