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
        f.compact().unwrap(); // the rows at home, where the damage below is
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
        // A write appends to the log; its compaction's read-modify-write of the damaged
        // block is refused, the row's newest value still in the log.
        f.write_rows(&[5 * rpb], &vec![3u8; stride]).unwrap();
        let msg = corrupt(f.compact().unwrap_err());
        assert!(msg.contains("block 5"), "{msg}");
        f.read_rows(&[5 * rpb], &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 3));
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
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(h.file_bytes() - BLOCK as u64)
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
        f.compact().unwrap(); // the rows at home, whose blocks are read below
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
    // Writes through either engine (appended to the log, compacted home by read-modify-write
    // through the engine): a row given twice takes its last value. Through io_uring a write
    // fault after 2 requests stops the compaction at the third block and names it (the
    // pool's threads take requests in no fixed order); the log still holds every row's
    // newest value, and the next compaction writes them home.
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
        f.compact().unwrap();
        for (k, &r) in batch.iter().enumerate() {
            shadow[r as usize * stride..][..stride].copy_from_slice(&src[k * stride..][..stride]);
        }
        if engine == "io_uring" {
            f.write_rows(&asked[..10], &vec![fill + 2; 10 * stride])
                .unwrap();
            f.inject_faults(None, Some(2));
            let msg = f.compact().unwrap_err().to_string();
            f.inject_faults(None, None);
            assert!(
                msg.contains("write block 4") && msg.contains("emb4"),
                "{engine}: {msg}"
            );
            for &r in &asked[..10] {
                shadow[r as usize * stride..][..stride].fill(fill + 2);
            }
        }
        let mut out = vec![0u8; rows as usize * stride];
        f.read_rows(&all, &mut out).unwrap();
        assert!(out == shadow, "{engine}: rows differ from what was written");
        f.compact().unwrap();
        f.read_rows(&all, &mut out).unwrap();
        assert!(out == shadow, "{engine}: rows differ after compaction");
    }
    // The thread pool hands over what io_uring did, the rows written back as they were.
    f.write_rows(&all, &first).unwrap();
    f.compact().unwrap();
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

/// A model of a table file's rows: random batches (repeats within a batch, the last value
/// wins) written to the log, compacted now and then, the file reopened now and then; every
/// read, and every row `read_blocks_of` hands over, is the row's newest value, for rows
/// narrower than a block, a block's payload wide and wider.
#[test]
fn the_log_holds_the_newest_values_across_compaction_and_reopening() {
    let dir = scratch("blockfile-log");
    for (width, seed) in [(16u32, 1u64), (1022, 2), (3000, 3)] {
        let path = dir.join(format!("t{width}.tbl"));
        let rows = 700u64;
        let f = BlockFile::create(&path, "emb5", rows, width, DType::F32, false, 4).unwrap();
        let stride = f.stride();
        let mut shadow = vec![0u8; rows as usize * stride];
        let mut f = Some(f);
        let mut rng = Rng::new(seed);
        for round in 0..40u32 {
            let file = f.as_ref().unwrap();
            let n = 1 + rng.below(300) as usize;
            let batch: Vec<u64> = (0..n).map(|_| rng.below(rows)).collect();
            let src: Vec<u8> = (0..n * stride)
                .map(|i| (i as u32 ^ round.wrapping_mul(2_654_435_761)) as u8)
                .collect();
            file.write_rows(&batch, &src).unwrap();
            for (k, &r) in batch.iter().enumerate() {
                shadow[r as usize * stride..][..stride]
                    .copy_from_slice(&src[k * stride..][..stride]);
            }
            match rng.below(6) {
                0 => {
                    file.compact().unwrap();
                    assert_eq!(file.log_figures().blocks, 0);
                }
                1 => {
                    drop(f.take());
                    f = Some(BlockFile::open(&path, "emb5", 4, None, false).unwrap());
                }
                _ => {}
            }
            let file = f.as_ref().unwrap();
            let all: Vec<u64> = (0..rows).collect();
            let mut out = vec![0u8; rows as usize * stride];
            file.read_rows(&all, &mut out).unwrap();
            assert!(out == shadow, "width {width}, round {round}: rows differ");
            let asked: Vec<u64> = (0..20).map(|_| rng.below(rows)).collect();
            let (got, res) = handed(file, &asked);
            res.unwrap();
            let mut once: Vec<u64> = got.iter().map(|(r, _)| *r).collect();
            once.sort_unstable();
            let n_got = once.len();
            once.dedup();
            assert_eq!(once.len(), n_got, "width {width}: a row handed over twice");
            for r in &asked {
                assert!(
                    once.binary_search(r).is_ok(),
                    "row {r} asked for, not handed over"
                );
            }
            for (r, b) in &got {
                assert!(
                    b[..] == shadow[*r as usize * stride..][..stride],
                    "width {width}, round {round}: row {r} handed over with older bytes"
                );
            }
        }
    }
    std::fs::remove_dir_all(dir).ok();
}

/// A kill tears the log's last chunk: reopening drops it whole (its rows keep their older
/// values), cuts the file there and appends after it; a log whose verified chunk names a
/// row the table does not have is refused as damaged.
#[test]
fn a_torn_log_chunk_is_dropped_whole_and_cut_off() {
    let dir = scratch("blockfile-torn-log");
    let path = dir.join("t.tbl");
    // Rows of a block's payload: a chunk is 256 of them, one request.
    let (rows, width) = (5000u64, 1022u32);
    let f = BlockFile::create(&path, "emb6", rows, width, DType::F32, false, 4).unwrap();
    let stride = f.stride();
    let h = *f.header();
    let first: Vec<u64> = (0..100).collect();
    f.write_rows(&first, &vec![1u8; 100 * stride]).unwrap();
    let end_first = std::fs::metadata(&path).unwrap().len();
    let second: Vec<u64> = (50..3000).collect();
    let w = f.write_rows(&second, &vec![2u8; 2950 * stride]).unwrap();
    assert_eq!(w.requests, 12, "{w:?}");
    let figs = f.log_figures();
    assert_eq!((figs.chunks, figs.rows), (13, 3050));
    drop(f);
    // The last chunk (rows 2866-2999) torn: a block in its middle never written.
    let len = std::fs::metadata(&path).unwrap().len();
    patch(&path, len - 10 * BLOCK as u64, |b| b.fill(0));
    let f = BlockFile::open(&path, "emb6", 4, None, false).unwrap();
    let mut out = vec![0u8; stride];
    let value = |f: &BlockFile, r: u64, out: &mut Vec<u8>| {
        f.read_rows(&[r], out).unwrap();
        out[0]
    };
    assert_eq!(value(&f, 10, &mut out), 1);
    assert_eq!(value(&f, 60, &mut out), 2, "a row of a whole chunk");
    assert_eq!(
        value(&f, 2865, &mut out),
        2,
        "a row of the chunk before the torn one"
    );
    assert_eq!(
        value(&f, 2999, &mut out),
        0,
        "a row of the torn chunk keeps its older value"
    );
    assert_eq!(
        f.log_figures().rows,
        0,
        "replayed chunks are not counted as appended"
    );
    let cut = std::fs::metadata(&path).unwrap().len();
    assert!(cut < len && cut > end_first, "{cut} of {len}");
    f.write_rows(&[2999], &vec![9u8; stride]).unwrap();
    drop(f);
    let f = BlockFile::open(&path, "emb6", 4, None, false).unwrap();
    assert_eq!(value(&f, 2999, &mut out), 9);
    drop(f);
    // A flipped bit in a chunk that later chunks follow is damage, not a tear: refused by
    // name, nothing cut off.
    let mid = h.data_offset(h.data_blocks + 101 + 5) + 40;
    patch(&path, mid, |b| b[0] ^= 0x20);
    let len = std::fs::metadata(&path).unwrap().len();
    let msg = corrupt(BlockFile::open(&path, "emb6", 4, None, false).unwrap_err());
    assert!(
        msg.contains("damaged, not torn") && msg.contains("emb6"),
        "{msg}"
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
    patch(&path, mid, |b| b[0] ^= 0x20);
    // A chunk that verifies but names row 5000 of 5000: damage, named.
    let at = h.data_blocks; // the first chunk's manifest, sealed again after the change
    patch(&path, h.data_offset(at), |b| {
        b[32..36].copy_from_slice(&5000u32.to_le_bytes());
        tiermem_embed::blockfile::format::seal(b, at);
    });
    let msg = corrupt(BlockFile::open(&path, "emb6", 4, None, false).unwrap_err());
    assert!(msg.contains("row log") && msg.contains("row 5000"), "{msg}");
    std::fs::remove_dir_all(dir).ok();
}
