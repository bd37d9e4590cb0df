//! Property tests of the HPC kernels' building blocks and of the staging executor: the
//! traffic model's accounting, HPCC's stream jumps, static schedules, and that a staged run
//! leaves the same data and the manager's invariants whatever the mode and the fast room.

use std::collections::HashMap;

use proptest::prelude::*;
use tiermem_core::mechanism::Place;
use tiermem_hpc::pattern::{Boosts, BreakEven};
use tiermem_hpc::random_access::{next, starts};
use tiermem_hpc::staging::{run, Mode};
use tiermem_hpc::traffic::{Stream, LINE};
use tiermem_hpc::{build, share};

use crate::two_tier;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Every fetch is a whole line, a miss is a fetch, and touching the same address twice
    /// in a row costs nothing the second time.
    #[test]
    fn a_stream_charges_whole_lines_and_misses_only_fetches(addrs in prop::collection::vec(0u64..1 << 24, 1..400)) {
        let mut s = Stream::default();
        for &a in &addrs {
            s.touch(a, false);
            let before = s.traffic;
            s.touch(a, false);
            prop_assert_eq!(s.traffic, before);
        }
        let t = s.traffic;
        prop_assert_eq!(t.read_bytes % LINE, 0);
        prop_assert!(t.misses <= t.read_bytes / LINE && t.misses >= 1);
        prop_assert!(t.read_bytes / LINE <= addrs.len() as u64);
    }

    /// `starts(a + b)` is `b` steps of the stream from `starts(a)`.
    #[test]
    fn stream_jumps_agree_with_stepping(a in 0i64..1 << 40, b in 0usize..300) {
        let mut x = starts(a);
        for _ in 0..b {
            x = next(x);
        }
        prop_assert_eq!(starts(a + b as i64), x);
    }

    /// Threads' shares are contiguous, disjoint and cover every item.
    #[test]
    fn shares_partition_the_items(n in 0usize..10_000, threads in 1usize..70) {
        let mut end = 0;
        for t in 0..threads {
            let (lo, hi) = share(n, t, threads);
            prop_assert!(lo == end.min(n) && lo <= hi);
            end = hi;
        }
        prop_assert_eq!(end, n);
    }

    /// A staged FFT leaves the data a slow-only FFT leaves, the target back home, and the
    /// manager consistent, whatever the mode and however little fast memory there is.
    #[test]
    fn staging_never_changes_the_result(log2 in 6u32..12, mode in 0u8..3, fast_kib in 4u64..256) {
        let n = 1u64 << log2;
        let m = two_tier(fast_kib << 10, 8 << 20, "lru_in_place");
        let line = BreakEven {
            read: Boosts { random: 1.0, strided: 1.0, sequential: 1.0 },
            write: Boosts { random: 1.0, strided: 1.0, sequential: 1.0 },
            read_write: Boosts { random: 1.0, strided: 1.0, sequential: 1.0 },
            t_1st: 0.1,
            t_3rd: 0.1,
            lines: [0.0; 3],
            cache_lines: 0,
        };
        let mut results = Vec::new();
        for md in [Mode::SlowOnly, [Mode::SlowOnly, Mode::AlwaysStage, Mode::PatternAware(line, 0.0)][mode as usize]] {
            let id = m.alloc(n * 16, Place::Device(1)).unwrap();
            {
                let mut g = m.write(id).unwrap();
                for (i, b) in g.as_mut_slice().iter_mut().enumerate() {
                    *b = (i * 7 % 251) as u8;
                }
            }
            let k = build("fft", &HashMap::from([("data".into(), id)]), &HashMap::from([("n".into(), n)])).unwrap();
            let rep = run(&m, k.as_ref(), md).unwrap();
            // Capacities round up to whole pages.
            prop_assert!(!rep.staged || n * 16 <= m.devices()[0].capacity);
            prop_assert_eq!(rep.fallback.is_some(), md != Mode::SlowOnly && !rep.staged);
            prop_assert_eq!(m.placement(id).unwrap().device, 1);
            results.push(m.read(id).unwrap().as_slice().to_vec());
            m.check().map_err(TestCaseError::fail)?;
            m.free(id).unwrap();
        }
        prop_assert!(results[0] == results[1]);
    }
}
