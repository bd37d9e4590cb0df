//! A table file edited at will (header, layout, data blocks, length): opening it is a table
//! or an error, never a panic or an allocation the file does not back; every row of a table
//! that opens reads back or is a named error; a row written reads back as written. The
//! input's first bytes pick the geometry (narrow, one-block and multi-block rows); the rest
//! are edits `(offset u32, byte)`, and a flag re-seals the header's and layout's checksums
//! after them, so the fuzzer reaches the checks behind them.
#![no_main]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use libfuzzer_sys::fuzz_target;
use tiermem_embed::blockfile::format::{BLOCK, HEADER_BYTES};
use tiermem_embed::blockfile::BlockFile;
use tiermem_embed::DType;

type Geometry = (u64, u32, bool);
static FILES: Mutex<Option<HashMap<Geometry, Vec<u8>>>> = Mutex::new(None);

fn dir() -> PathBuf {
    // On the disk, in the fuzz crate's target folder (`make fuzz` removes it after): table
    // files refuse memory file systems.
    let d = std::env::current_dir()
        .unwrap()
        .join("target")
        .join(format!("scratch-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A fresh table file's bytes for this geometry (made once, then cached).
fn base(g: Geometry) -> Vec<u8> {
    let mut cache = FILES.lock().unwrap();
    let cache = cache.get_or_insert_with(HashMap::new);
    cache
        .entry(g)
        .or_insert_with(|| {
            let p = dir().join(format!("base-{}-{}-{}", g.0, g.1, g.2));
            let _ = std::fs::remove_file(&p);
            let dt = if g.2 { DType::Bf16 } else { DType::F32 };
            drop(BlockFile::create(&p, "base", g.0, g.1, dt, false, 2).unwrap());
            let b = std::fs::read(&p).unwrap();
            std::fs::remove_file(&p).unwrap();
            b
        })
        .clone()
}

fn reseal(b: &mut [u8]) {
    if b.len() < BLOCK {
        return;
    }
    let rows = u64::from_le_bytes(b[12..20].try_into().unwrap());
    let lay = (rows.saturating_mul(4)).min((b.len() - BLOCK) as u64) as usize;
    let crc = crc32c::crc32c(&b[BLOCK..BLOCK + lay]);
    b[64..68].copy_from_slice(&crc.to_le_bytes());
    let h = crc32c::crc32c(&b[..68]);
    b[68..72].copy_from_slice(&h.to_le_bytes());
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let width = [1u32, 5, 1022, 1100, 3000][data[0] as usize % 5];
    let rows = 1 + u64::from(data[1] % 40);
    let g = (rows, width, data[2] & 1 == 1);
    let mut bytes = base(g);
    for e in data[3..].chunks_exact(5) {
        let off = u32::from_le_bytes(e[0..4].try_into().unwrap()) as usize;
        if off >= 1 << 31 {
            bytes.truncate(off % (bytes.len() + 1)); // cut the file short
        } else if !bytes.is_empty() {
            let at = off % bytes.len();
            bytes[at] = e[4];
        }
    }
    if data[2] & 2 == 2 {
        reseal(&mut bytes);
    }
    let _ = HEADER_BYTES;
    let path = dir().join("t.tbl");
    std::fs::write(&path, &bytes).unwrap();
    if let Ok(f) = BlockFile::open(&path, "fuzz", 2, None, false) {
        let n = f.rows();
        let stride = f.stride();
        let all: Vec<u64> = (0..n).collect();
        let mut out = vec![0u8; all.len() * stride];
        if f.read_rows(&all, &mut out).is_ok() {
            let row: Vec<u8> = (0..stride).map(|i| (i * 7 + 3) as u8).collect();
            if f.write_rows(&[n - 1], &row).is_ok() {
                let mut back = vec![0u8; stride];
                f.read_rows(&[n - 1], &mut back).unwrap();
                assert_eq!(back, row, "a row written reads back as written");
            }
        }
        let _ = f.read_blocks_of(&all, |r, b| assert!(r < n && b.len() == stride));
    }
});
