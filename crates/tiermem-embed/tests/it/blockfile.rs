//! The block table file: rows written and read back in any order (narrow, bf16, wide rows
//! spanning blocks), re-attached after the owner goes, locked against a second owner, and
//! every kind of damage an error naming the table, the block and the file.

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use tiermem_core::Error;
use tiermem_embed::blockfile::format::{BLOCK, PAYLOAD};
use tiermem_embed::blockfile::BlockFile;
use tiermem_embed::workload::Rng;
use tiermem_embed::DType;

use super::scratch;

fn bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.below(256) as u8).collect()
}

fn patch(path: &Path, offset: u64, f: impl FnOnce(&mut [u8])) {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = vec![0u8; BLOCK];
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.read_exact(&mut b).unwrap();
    f(&mut b);
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.write_all(&b).unwrap();
    file.sync_all().unwrap();
}

fn corrupt(e: Error) -> String {
    match e {
        Error::Corrupt { path, what } => format!("{path}: {what}"),
        other => panic!("expected a Corrupt error, got {other}"),
    }
}

#[test]
fn rows_round_trip_in_any_order_and_survive_reopening() {
    let dir = scratch("blockfile-rt");
    for (rows, width, dtype) in [
        (1000u64, 16u32, DType::F32),
        (777, 64, DType::Bf16),
        (20, 3000, DType::F32),
    ] {
        let path: PathBuf = dir.join(format!("t{width}.tbl"));
        let mut rng = Rng::new(u64::from(width));
        let stride = {
            let f = BlockFile::create(&path, "t", rows, width, dtype, false, 8).unwrap();
            let stride = f.stride();
            assert!(f.header().blocks_per_row > 1 || stride <= PAYLOAD);
            // Fresh rows read as zeros.
            let mut z = vec![1u8; 3 * stride];
            f.read_rows(&[0, rows - 1, rows / 2], &mut z).unwrap();
            assert!(z.iter().all(|&b| b == 0));
            // Write every row in a scrambled order, in batches; a row given twice takes its
            // last value.
            let mut shadow = vec![0u8; rows as usize * stride];
            let mut order: Vec<u64> = (0..rows).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
            for chunk in order.chunks(97) {
                let mut batch: Vec<u64> = chunk.to_vec();
                batch.push(chunk[0]);
                let src = bytes(&mut rng, batch.len() * stride);
                f.write_rows(&batch, &src).unwrap();
                for (k, &r) in batch.iter().enumerate() {
                    let r = r as usize;
                    shadow[r * stride..(r + 1) * stride]
                        .copy_from_slice(&src[k * stride..(k + 1) * stride]);
                }
            }
            let want: Vec<u64> = (0..300).map(|_| rng.below(rows)).collect();
            let mut out = vec![0u8; want.len() * stride];
            f.read_rows(&want, &mut out).unwrap();
            for (k, &r) in want.iter().enumerate() {
                let r = r as usize;
                assert_eq!(
                    &out[k * stride..(k + 1) * stride],
                    &shadow[r * stride..(r + 1) * stride],
                    "row {r}"
                );
            }
            f.sync().unwrap();
            std::fs::write(dir.join(format!("t{width}.shadow")), &shadow).unwrap();
            stride
        };
        // Re-attached by a new owner: the same geometry and every row as last written.
        let f = BlockFile::open(&path, "t", 4, None, false).unwrap();
        assert_eq!(
            (f.rows(), f.stride(), f.header().width),
            (rows, stride, width)
        );
        let shadow = std::fs::read(dir.join(format!("t{width}.shadow"))).unwrap();
        let all: Vec<u64> = (0..rows).collect();
        let mut out = vec![0u8; rows as usize * stride];
        f.read_rows(&all, &mut out).unwrap();
        assert!(out == shadow, "width {width}: rows differ after reopening");
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_second_owner_an_existing_file_and_bad_rows_are_refused() {
    let dir = scratch("blockfile-own");
    let path = dir.join("t.tbl");
    let f = BlockFile::create(&path, "emb0", 100, 8, DType::F32, false, 2).unwrap();
    let e = BlockFile::open(&path, "emb0", 2, None, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("locked") && e.contains("emb0"), "{e}");
    let e = BlockFile::create(&path, "emb0", 100, 8, DType::F32, true, 2)
        .unwrap_err()
        .to_string();
    assert!(e.contains("locked"), "{e}");
    let mut out = vec![0u8; 32];
    let e = f.read_rows(&[100], &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            Error::IndexOutOfRange {
                value: 100,
                rows: 100,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        f.read_rows(&[1], &mut out[..8]).is_err(),
        "a short output buffer"
    );
    drop(f);
    // The file outlives its owner; creating it again needs overwrite.
    assert!(path.exists());
    let e = BlockFile::create(&path, "emb0", 100, 8, DType::F32, false, 2)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("existing file") && e.contains("re-attach"),
        "{e}"
    );
    BlockFile::create(&path, "emb0", 50, 8, DType::F32, true, 2).unwrap();
    let e = BlockFile::open(&dir.join("missing.tbl"), "emb0", 2, None, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no such file"), "{e}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn damage_is_named_and_never_read_as_rows() {
    let dir = scratch("blockfile-damage");
    let path = dir.join("t.tbl");
    let (rows, width) = (2000u64, 16u32);
    let stride = {
        let f = BlockFile::create(&path, "emb3", rows, width, DType::F32, false, 4).unwrap();
        let all: Vec<u64> = (0..rows).collect();
        let src: Vec<u8> = (0..rows as usize * f.stride()).map(|i| i as u8).collect();
        f.write_rows(&all, &src).unwrap();
        f.stride()
    };
    let h = *BlockFile::open(&path, "emb3", 4, None, false)
        .unwrap()
        .header();
    let rpb = u64::from(h.rows_per_block);
    // A flipped bit in data block 5: its rows are refused, naming table, block and file;
    // rows elsewhere still read.
    patch(&path, h.data_offset(5) + 100, |b| b[0] ^= 0x40);
    {
        let f = BlockFile::open(&path, "emb3", 4, None, false).unwrap();
        let mut out = vec![0u8; stride];
        let msg = corrupt(f.read_rows(&[5 * rpb + 1], &mut out).unwrap_err());
        assert!(
            msg.contains("emb3")
                && msg.contains("block 5")
                && msg.contains("checksum")
                && msg.contains("t.tbl"),
            "{msg}"
        );
        f.read_rows(&[0], &mut out).unwrap();
        assert!(
            f.write_rows(&[5 * rpb], &vec![0u8; stride]).is_err(),
            "read-modify-write of a damaged block"
        );
    }
    // Block 3's bytes written where block 7 belongs: a misplaced write.
    let mut b3 = vec![0u8; BLOCK];
    {
        let mut file = std::fs::File::open(&path).unwrap();
        file.seek(SeekFrom::Start(h.data_offset(3))).unwrap();
        file.read_exact(&mut b3).unwrap();
    }
    patch(&path, h.data_offset(7), |b| b.copy_from_slice(&b3));
    {
        let f = BlockFile::open(&path, "emb3", 4, None, false).unwrap();
        let mut out = vec![0u8; stride];
        let msg = corrupt(f.read_rows(&[7 * rpb], &mut out).unwrap_err());
        assert!(
            msg.contains("block 7 holds the trailer of block 3"),
            "{msg}"
        );
    }
    // A damaged layout or header, a truncated or foreign file: refused when opened.
    patch(&path, BLOCK as u64, |b| b[9] ^= 1);
    let msg = corrupt(BlockFile::open(&path, "emb3", 4, None, false).unwrap_err());
    assert!(msg.contains("layout checksum"), "{msg}");
    patch(&path, BLOCK as u64, |b| b[9] ^= 1);
    patch(&path, 0, |b| b[12] ^= 1);
    let msg = corrupt(BlockFile::open(&path, "emb3", 4, None, false).unwrap_err());
    assert!(msg.contains("header checksum"), "{msg}");
    patch(&path, 0, |b| b[12] ^= 1);
    let len = std::fs::metadata(&path).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - BLOCK as u64)
        .unwrap();
    let msg = corrupt(BlockFile::open(&path, "emb3", 4, None, false).unwrap_err());
    assert!(msg.contains("truncated"), "{msg}");
    std::fs::write(&path, vec![0x5au8; 3 * BLOCK]).unwrap();
    let msg = corrupt(BlockFile::open(&path, "emb3", 4, None, false).unwrap_err());
    assert!(msg.contains("not a tiermem block file"), "{msg}");
    std::fs::write(&path, b"short").unwrap();
    let msg = corrupt(BlockFile::open(&path, "emb3", 4, None, false).unwrap_err());
    assert!(msg.contains("shorter than a header block"), "{msg}");
    std::fs::remove_dir_all(dir).ok();
}

/// Rows and their bytes, in the order they were handed over.
type Handed = Vec<(u64, Vec<u8>)>;

/// `(row, bytes)` as `read_blocks_of` hands them over, and its result.
fn handed(f: &BlockFile, rows: &[u64]) -> (Handed, Result<u64, String>) {
    let mut seen = Vec::new();
    let res = f
        .read_blocks_of(rows, |r, b| seen.push((r, b.to_vec())))
        .map_err(|e| e.to_string());
    (seen, res)
}

#[test]
fn both_engines_read_and_write_alike_and_stop_at_the_first_bad_run() {
    let dir = scratch("blockfile-engines");
    let path = dir.join("t.tbl");
    let (rows, width) = (20_000u64, 16u32);
    {
        let f = BlockFile::create(&path, "emb4", rows, width, DType::F32, false, 4).unwrap();
        let all: Vec<u64> = (0..rows).collect();
        let src: Vec<u8> = (0..rows as usize * f.stride())
            .map(|i| (i * 7) as u8)
            .collect();
        f.write_rows(&all, &src).unwrap();
    }
    let h = *BlockFile::open(&path, "emb4", 4, None, false)
        .unwrap()
        .header();
    let rpb = u64::from(h.rows_per_block);
    // One row from every other block: each block its own request, more than the depth.
    let asked: Vec<u64> = (0..60).map(|b| 2 * b * rpb + 1).collect();
    let every_row_of = |blocks: std::ops::Range<u64>| -> Vec<u64> {
        blocks
            .flat_map(|b| 2 * b * rpb..(2 * b + 1) * rpb)
            .collect()
    };
    let mut f = BlockFile::open(&path, "emb4", 4, None, false).unwrap();
    let (uring, res) = handed(&f, &asked);
    assert_eq!(res.unwrap(), 60);
    assert_eq!(
        uring.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
        every_row_of(0..60)
    );
    // A fault after 3 requests: the rows of the first 3 blocks were handed over, then the
    // error names the table, the block and the file.
    f.inject_faults(Some(3), None);
    let (part, res) = handed(&f, &asked);
    let msg = res.unwrap_err();
    assert!(
        msg.contains("emb4") && msg.contains("read block 6") && msg.contains("t.tbl"),
        "{msg}"
    );
    assert_eq!(
        part.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
        every_row_of(0..3)
    );
    f.inject_faults(None, None);
    // Writes through either engine: a row given twice takes its last value. Through io_uring
    // a write fault after 2 requests leaves the rows of the first 2 blocks written and names
    // the third (the pool's threads take requests in no fixed order).
    let stride = f.stride();
    let first: Vec<u8> = (0..rows as usize * stride).map(|i| (i * 7) as u8).collect();
    let mut shadow = first.clone();
    let all: Vec<u64> = (0..rows).collect();
    for (engine, fill) in [("io_uring", 0x11u8), ("threads", 0x22)] {
        if engine == "threads" {
            f.use_threads();
        }
        let mut batch = asked.clone();
        batch.push(asked[5]);
        let mut src = vec![fill; batch.len() * stride];
        src[60 * stride..].fill(fill + 1);
        f.write_rows(&batch, &src).unwrap();
        for (k, &r) in batch.iter().enumerate() {
            shadow[r as usize * stride..][..stride].copy_from_slice(&src[k * stride..][..stride]);
        }
        if engine == "io_uring" {
            f.inject_faults(None, Some(2));
            let msg = f
                .write_rows(&asked[..10], &vec![fill + 2; 10 * stride])
                .unwrap_err()
                .to_string();
            f.inject_faults(None, None);
            assert!(
                msg.contains("write block 4") && msg.contains("emb4"),
                "{engine}: {msg}"
            );
            for &r in &asked[..2] {
                shadow[r as usize * stride..][..stride].fill(fill + 2);
            }
        }
        let mut out = vec![0u8; rows as usize * stride];
        f.read_rows(&all, &mut out).unwrap();
        assert!(out == shadow, "{engine}: rows differ from what was written");
    }
    // The thread pool hands over what io_uring did, the rows written back as they were.
    f.write_rows(&all, &first).unwrap();
    let (threads, res) = handed(&f, &asked);
    assert_eq!(res.unwrap(), 60);
    assert!(
        threads == uring,
        "the thread pool hands over other rows or bytes"
    );
    drop(f);
    // A damaged block in the middle: the rows before it, then the error, with either engine.
    patch(&path, h.data_offset(20) + 10, |b| b[0] ^= 1);
    for threads in [false, true] {
        let mut f = BlockFile::open(&path, "emb4", 4, None, false).unwrap();
        if threads {
            f.use_threads();
        }
        let (part, res) = handed(&f, &asked);
        let msg = res.unwrap_err();
        assert!(
            msg.contains("block 20") && msg.contains("checksum"),
            "{msg}"
        );
        assert!(part[..] == uring[..10 * rpb as usize], "threads {threads}");
    }
    std::fs::remove_dir_all(dir).ok();
}
