//! The Criteo reader over any bytes: every line is a sample or a reason, never a panic; the
//! samples' indices lie in their tables; a file read whole and read in line-aligned ranges
//! gives the same samples; the position ends at the file's end.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiermem_core::criteo::{line_aligned_ranges, Out, Reader, CAT_FEATURES, INT_FEATURES};

const ROWS: [u64; CAT_FEATURES] = [3; CAT_FEATURES];

fn read_all(path: &str, range: (u64, Option<u64>)) -> (Vec<f32>, Vec<i64>, u64) {
    let mut r = Reader::open(path, &ROWS, range, 256, false).unwrap();
    let (mut labels, mut cats) = (Vec::new(), Vec::new());
    loop {
        let (mut l, mut d, mut c) = ([0f32; 4], [0f32; 4 * INT_FEATURES], [0i64; 4 * CAT_FEATURES]);
        let n = r
            .fill(&mut Out { labels: &mut l, dense: &mut d, cats: &mut c })
            .unwrap();
        labels.extend_from_slice(&l[..n]);
        for t in 0..CAT_FEATURES {
            cats.extend_from_slice(&c[t * 4..t * 4 + n]);
        }
        if n < 4 {
            return (labels, cats, r.position());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let file = std::env::temp_dir().join(format!("tiermem-criteo-fuzz-{}", std::process::id()));
    std::fs::write(&file, data).unwrap();
    let path = file.to_str().unwrap().to_string();
    let (labels, cats, end) = read_all(&path, (0, None));
    assert_eq!(end, data.len() as u64);
    assert!(labels.iter().all(|&l| l == 0.0 || l == 1.0));
    assert!(cats.iter().all(|&c| (0..3).contains(&c)));
    let mut parts = Vec::new();
    for (a, b) in line_aligned_ranges(&path, 3).unwrap() {
        parts.extend(read_all(&path, (a, Some(b))).0);
    }
    assert_eq!(parts, labels);
});
