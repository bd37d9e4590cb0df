//! File tables (rows in a plain file, buffered I/O, read through a staged DRAM cache) against
//! direct DRAM tables: bit-identical lookups and updates through flushes, reopening and
//! syncs; a killed write-back's journal replayed whole or dropped whole; a user's file opened
//! read-only and never written; shapes that do not match the file refused with the numbers.

use std::path::Path;
use std::sync::Arc;

use tiermem_core::manager::Manager;
use tiermem_embed::bags::Bags;
use tiermem_embed::cache::policy::Dynamic;
use tiermem_embed::home::FileHome;
use tiermem_embed::optim::Sgd;
use tiermem_embed::update::{update, GradIn};
use tiermem_embed::workload::Rng;
use tiermem_embed::{Cache, CacheConfig, DType, Mode, Optimizer, Shape, Table};

use super::{look, scratch, two_tier};

const ROWS: usize = 500;
const BAGS: usize = 20;

fn cache(stride: usize) -> Cache {
    let bytes = (ROWS * stride) as u64;
    Cache {
        fast: 0,
        config: CacheConfig {
            admission: None,
            lower: bytes / 5,
            slack: bytes / 20,
            policy: &Dynamic,
        },
    }
}

fn file_table(m: &Arc<Manager>, path: &Path, width: usize, dtype: DType, create: bool) -> Table {
    let shape = Shape {
        rows: ROWS,
        width,
        dtype,
    };
    let stride = dtype.row_bytes(width).next_multiple_of(4);
    let home = |s: usize| {
        Ok(if create {
            FileHome::create(path, "t", ROWS as u64, s)?
        } else {
            FileHome::open(path, "t", ROWS as u64, s, false)?
        }
        .into())
    };
    Table::new(m, shape, home, Some(cache(stride))).unwrap()
}

fn all_rows(t: &Table) -> Vec<f32> {
    let mut v = vec![0f32; t.rows() * t.featuresize()];
    t.read_rows(0, &mut v).unwrap();
    v
}

#[test]
fn file_tables_match_direct_tables_bit_for_bit() {
    let m = Arc::new(two_tier(64 << 20, 64 << 20, "lru"));
    let dir = scratch("file-table");
    for (width, dtype) in [(16, DType::F32), (7, DType::Bf16), (1100, DType::F32)] {
        let path = dir.join(format!("t{width}.rows"));
        let direct = Table::direct(&m, 0, ROWS, width, dtype).unwrap();
        let mut t = file_table(&m, &path, width, dtype, true);
        let mut rng = Rng::new(width as u64);
        let init: Vec<f32> = (0..ROWS * width).map(|_| rng.f64() as f32 - 0.5).collect();
        direct.write_rows(0, &init).unwrap();
        t.write_rows(0, &init).unwrap();
        for s in 0..8 {
            let mut offsets = vec![0i64];
            let mut values = Vec::new();
            for _ in 0..BAGS {
                for _ in 0..rng.below(6) {
                    values.push(rng.below(ROWS as u64) as i64);
                }
                offsets.push(values.len() as i64);
            }
            let bags = Bags::new(0, &values, &offsets, None).unwrap();
            assert_eq!(
                look(&direct, bags, width, BAGS),
                look(&t, bags, width, BAGS),
                "width {width} step {s}"
            );
            let grad: Vec<f32> = (0..BAGS * width).map(|_| rng.f64() as f32 - 0.5).collect();
            let g = GradIn {
                data: &grad,
                row_stride: width,
                cols: &[0],
            };
            let opt = Optimizer::Sgd(Sgd {
                lr: 0.1,
                weight_decay: 0.0,
            });
            update(&[&direct], &[bags], Mode::Sum, g, opt, false).unwrap();
            update(&[&t], &[bags], Mode::Sum, g, opt, false).unwrap();
            t.cache().unwrap().check().unwrap();
            match s {
                2 => {
                    t.flush(true).unwrap();
                }
                4 => {
                    drop(t); // writes the dirty rows back
                    t = file_table(&m, &path, width, dtype, false);
                }
                5 => t.sync().unwrap(),
                _ => {}
            }
        }
        assert!(
            all_rows(&direct) == all_rows(&t),
            "width {width}: rows differ"
        );
        drop(t);
        let t = file_table(&m, &path, width, dtype, false);
        assert!(
            all_rows(&direct) == all_rows(&t),
            "width {width}: rows differ after reopening"
        );
        let stride = dtype.row_bytes(width).next_multiple_of(4);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            (ROWS * stride) as u64
        );
        assert!(!tiermem_embed::home::journal_path(&path).exists());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A journal as a write-back killed after writing it leaves: rows, bytes, checksum.
fn plant_journal(path: &Path, rows: &[u64], src: &[u8], stride: usize) {
    let mut b = b"TMJOURN1".to_vec();
    b.extend_from_slice(&(stride as u64).to_le_bytes());
    b.extend_from_slice(&(rows.len() as u64).to_le_bytes());
    for r in rows {
        b.extend_from_slice(&r.to_le_bytes());
    }
    b.extend_from_slice(src);
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    std::fs::write(tiermem_embed::home::journal_path(path), b).unwrap();
}

#[test]
fn a_whole_journal_is_replayed_and_a_torn_one_dropped() {
    let dir = scratch("file-journal");
    let path = dir.join("j.rows");
    let stride = 8;
    drop(FileHome::create(&path, "j", 4, stride).unwrap());
    let new: Vec<u8> = (1..=16).collect();
    plant_journal(&path, &[1, 3], &new, stride);
    // Read-only: overlaid, the file untouched.
    let ro = FileHome::open(&path, "j", 4, stride, true).unwrap();
    let mut seen = Vec::new();
    use tiermem_embed::home::RowHome;
    ro.read_rows(&[0, 1, 3], |r, b| seen.push((r, b.to_vec())))
        .unwrap();
    assert_eq!(seen[1], (1, new[..8].to_vec()));
    assert_eq!(seen[2], (3, new[8..].to_vec()));
    drop(ro);
    assert_eq!(std::fs::read(&path).unwrap(), vec![0u8; 32]);
    // Writable: replayed and removed.
    drop(FileHome::open(&path, "j", 4, stride, false).unwrap());
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!((&bytes[8..16], &bytes[24..32]), (&new[..8], &new[8..]));
    assert!(!tiermem_embed::home::journal_path(&path).exists());
    // Torn (cut short): dropped, no row changed.
    plant_journal(&path, &[0], &[9; 8], stride);
    let jp = tiermem_embed::home::journal_path(&path);
    let j = std::fs::read(&jp).unwrap();
    std::fs::write(&jp, &j[..j.len() - 3]).unwrap();
    drop(FileHome::open(&path, "j", 4, stride, false).unwrap());
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    assert!(!jp.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_users_file_is_read_only_and_shapes_must_match() {
    let m = Arc::new(two_tier(16 << 20, 16 << 20, "lru"));
    let dir = scratch("file-user");
    let path = dir.join("user.bin");
    let rows: Vec<u8> = (0..ROWS * 16)
        .flat_map(|i| (i as f32).to_le_bytes())
        .collect();
    std::fs::write(&path, &rows).unwrap();
    let e = FileHome::open(&path, "u", ROWS as u64, 64, false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("not made by tiermem") && e.contains("read-only"),
        "{e}"
    );
    let e = FileHome::open(&path, "u", ROWS as u64 + 1, 64, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains(&format!("holds {} bytes", ROWS * 64)), "{e}");
    let e = FileHome::create(&path, "u", ROWS as u64, 64)
        .unwrap_err()
        .to_string();
    assert!(e.contains("never written over"), "{e}");
    let shape = Shape {
        rows: ROWS,
        width: 16,
        dtype: DType::F32,
    };
    let home = |s: usize| Ok(FileHome::open(&path, "u", ROWS as u64, s, true)?.into());
    let e = Table::new(&m, shape, home, None).err().unwrap().to_string();
    assert!(e.contains("read through a cache"), "{e}");
    let home = |s: usize| Ok(FileHome::open(&path, "u", ROWS as u64, s, true)?.into());
    let t = Table::new(&m, shape, home, Some(cache(64))).unwrap();
    let mut v = vec![0f32; ROWS * 16];
    t.read_rows(0, &mut v).unwrap();
    assert!(v.iter().enumerate().all(|(i, &x)| x == i as f32));
    let e = t.write_rows(0, &[1.0; 16]).unwrap_err().to_string();
    assert!(e.contains("read-only"), "{e}");
    drop(t);
    assert_eq!(
        std::fs::read(&path).unwrap(),
        rows,
        "the user's file changed"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
