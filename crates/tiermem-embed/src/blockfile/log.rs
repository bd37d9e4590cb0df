//! The row log: rows written to a table file are appended after its data blocks instead of
//! read, changed and written in place, so a dirty row costs a share of one sequential
//! write, not a random read and a random write of its block. A row's newest value is at
//! its place in the log while it is there ([`Log::place`]), at home otherwise; a read of it is
//! still one random read of one block.
//!
//! ```text
//! after the data blocks, chunks:   [manifest blocks][groups of data blocks]
//! manifest payloads, concatenated: magic "TMROWLG1", seq u64, rows u32, manifest blocks
//!                                  u32, groups u32, 0u32, then one u32 row id per row
//! groups:                          the table's geometry: rows_per_block rows per block, or
//!                                  one row over blocks_per_row blocks; row k of the chunk
//!                                  in group k / rows_per_block, slot k % rows_per_block
//! ```
//!
//! Every block carries the table's trailer (checksum and its own index), so a log block is
//! verified like a data block when read. A chunk is written by one request and applied to
//! the index only once that returns; opening the file replays the chunks in order and stops
//! at the first one that does not verify whole (a kill tore it): its rows keep their older
//! values and the torn tail is cut off. Compaction ([`super::BlockFile::compact`]) writes
//! the rows whose newest value is in the log to their homes, syncs, and cuts the log off; a
//! kill before the cut replays the same values again.

use std::sync::atomic::{AtomicU64, Ordering};

use super::format::{Header, PAYLOAD};

/// A manifest's first eight bytes.
pub const MAGIC: [u8; 8] = *b"TMROWLG1";
/// Bytes of a manifest before its row ids.
const HEAD: usize = 32;
/// A log position no row has (a chunk's last group's unused slots), and a row's entry
/// while it is at home. Positions stay below it: a log about to reach it is compacted
/// first ([`Log::room_for`]).
const UNUSED: u32 = u32::MAX;
/// Groups of data blocks per chunk (about 1 MiB of rows per write request).
pub const CHUNK_GROUPS: usize = 256;

/// The log's index: where each logged row's newest value is.
#[derive(Debug, Default)]
pub struct Log {
    /// Row → its newest position in the log ([`UNUSED`]: the row is at home); empty while
    /// the log is (4 bytes a row of the table once a row is logged, as a cache's pointer
    /// table: a lookup is an index, not a hash).
    at: Vec<u32>,
    /// Log position → row (a position whose row was logged again since is stale).
    pub rows: Vec<u32>,
    /// First block (file block index, past the data blocks) of each group of the log.
    pub groups: Vec<u64>,
    /// The block after the log's last chunk.
    pub end: u64,
    /// Sequence number of the last chunk (chunks replay only in increasing order).
    pub seq: u64,
}

impl Log {
    /// An empty log of a file whose data blocks end at `end`.
    #[must_use]
    pub fn empty(end: u64) -> Self {
        Log {
            end,
            ..Log::default()
        }
    }

    /// Row `row`'s newest position in the log, if it is there.
    #[inline]
    #[must_use]
    pub fn position(&self, row: u32) -> Option<u32> {
        self.at.get(row as usize).copied().filter(|&p| p != UNUSED)
    }

    /// Whether row `row`'s newest value is in the log.
    #[inline]
    #[must_use]
    pub fn holds(&self, row: u32) -> bool {
        self.position(row).is_some()
    }

    /// Whether a chunk of `rows` rows (`rpb` to a group) still has positions below
    /// [`UNUSED`].
    #[must_use]
    pub fn room_for(&self, rpb: usize, rows: usize) -> bool {
        (self.groups.len() * rpb).saturating_add(rows) < UNUSED as usize
    }

    /// Whether the log holds no chunk.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The block and byte offset in it of row `row`'s newest value, if it is in the log.
    #[inline]
    #[must_use]
    pub fn place(&self, h: &Header, row: u64) -> Option<(u64, usize)> {
        let p = self.position(row as u32)? as usize;
        let rpb = h.rows_per_block as usize;
        Some((self.groups[p / rpb], (p % rpb) * h.stride as usize))
    }

    /// The rows whose newest value is in the group starting at block `b` (a log block), by
    /// slot: `None` for a stale or unused slot.
    pub fn rows_in_block(&self, h: &Header, b: u64) -> impl Iterator<Item = Option<u32>> + '_ {
        let rpb = h.rows_per_block as usize;
        let g = self.groups.binary_search(&b).ok();
        (0..rpb).map(move |k| {
            let p = g? * rpb + k;
            let r = *self.rows.get(p)?;
            (self.position(r) == Some(p as u32)).then_some(r)
        })
    }

    /// Record a chunk written at the log's end: its groups' first blocks and its rows (in
    /// chunk order, `rpb` to a group), which now have their newest values there.
    pub fn push_chunk(
        &mut self,
        table_rows: u64,
        rpb: usize,
        groups: impl IntoIterator<Item = u64>,
        rows: &[u32],
        end: u64,
    ) {
        if self.at.is_empty() {
            self.at = vec![UNUSED; table_rows as usize];
        }
        // A chunk starts a group: the last group's unused slots are left stale.
        let first = self.groups.len() * rpb;
        self.rows.resize(first, UNUSED);
        self.groups.extend(groups);
        for (k, &r) in rows.iter().enumerate() {
            self.at[r as usize] = (first + k) as u32;
        }
        self.rows.extend_from_slice(rows);
        self.end = end;
        self.seq += 1;
    }

    /// Positions of the rows whose newest value is in the log, in log order.
    #[must_use]
    pub fn live(&self) -> Vec<(u32, u32)> {
        self.rows
            .iter()
            .enumerate()
            .filter(|&(p, &r)| self.position(r) == Some(p as u32))
            .map(|(p, &r)| (p as u32, r))
            .collect()
    }
}

/// Rows per chunk for a table of geometry `h` (groups are filled whole but the last).
#[must_use]
pub fn chunk_rows(h: &Header) -> usize {
    let bpr = h.blocks_per_row as usize;
    (CHUNK_GROUPS / bpr).max(1) * h.rows_per_block as usize
}

/// Manifest blocks a chunk of `rows` rows needs.
#[must_use]
pub fn manifest_blocks(rows: usize) -> usize {
    (HEAD + 4 * rows).div_ceil(PAYLOAD)
}

/// A chunk's manifest: the chunk's sequence number and rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Sequence number.
    pub seq: u64,
    /// Manifest blocks.
    pub blocks: u32,
    /// Groups of data blocks.
    pub groups: u32,
    /// Row ids, in chunk order.
    pub rows: Vec<u32>,
}

impl Manifest {
    /// Write the manifest into the payloads of `out`'s first [`manifest_blocks`] blocks.
    pub fn encode(&self, out: &mut [u8]) {
        let mut bytes = Vec::with_capacity(HEAD + 4 * self.rows.len());
        bytes.extend_from_slice(&MAGIC);
        bytes.extend_from_slice(&self.seq.to_le_bytes());
        bytes.extend_from_slice(&(self.rows.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&self.blocks.to_le_bytes());
        bytes.extend_from_slice(&self.groups.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        for r in &self.rows {
            bytes.extend_from_slice(&r.to_le_bytes());
        }
        for (piece, blk) in bytes
            .chunks(PAYLOAD)
            .zip(out.chunks_mut(super::format::BLOCK))
        {
            blk[..piece.len()].copy_from_slice(piece);
        }
    }

    /// The head of a manifest from its first block's payload: `(seq, rows, manifest
    /// blocks, groups)`, or `None` if it is not a manifest.
    #[must_use]
    pub fn head(first: &[u8]) -> Option<(u64, u32, u32, u32)> {
        if first.len() < HEAD || first[..8] != MAGIC {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes(first[o..o + 4].try_into().expect("4 bytes"));
        let seq = u64::from_le_bytes(first[8..16].try_into().expect("8 bytes"));
        Some((seq, u32_at(16), u32_at(20), u32_at(24)))
    }

    /// The manifest in the first `blocks` blocks of `chunk` (already verified), with the
    /// head [`Manifest::head`] read.
    #[must_use]
    pub fn decode(chunk: &[u8], (seq, rows, blocks, groups): (u64, u32, u32, u32)) -> Self {
        let mut bytes = Vec::with_capacity(blocks as usize * PAYLOAD);
        for blk in chunk.chunks(super::format::BLOCK).take(blocks as usize) {
            bytes.extend_from_slice(&blk[..PAYLOAD]);
        }
        let ids = bytes[HEAD..HEAD + 4 * rows as usize]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        Manifest {
            seq,
            blocks,
            groups,
            rows: ids,
        }
    }
}

/// Counters of a table file's log.
#[derive(Debug, Default)]
pub struct LogCounters {
    /// Chunks appended (one write request each).
    pub chunks: AtomicU64,
    /// Rows appended.
    pub rows: AtomicU64,
    /// Compactions run.
    pub compactions: AtomicU64,
    /// Rows compaction wrote to their homes.
    pub compacted_rows: AtomicU64,
    /// Write requests compaction issued (runs of home blocks).
    pub compaction_writes: AtomicU64,
}

/// A copy of [`LogCounters`].
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct LogFigures {
    /// Chunks appended (one write request each).
    pub chunks: u64,
    /// Rows appended.
    pub rows: u64,
    /// Compactions run.
    pub compactions: u64,
    /// Rows compaction wrote to their homes.
    pub compacted_rows: u64,
    /// Write requests compaction issued.
    pub compaction_writes: u64,
    /// Blocks the log holds now.
    pub blocks: u64,
}

impl LogCounters {
    /// The counters now, with the log's size.
    #[must_use]
    pub fn figures(&self, blocks: u64) -> LogFigures {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LogFigures {
            chunks: g(&self.chunks),
            rows: g(&self.rows),
            compactions: g(&self.compactions),
            compacted_rows: g(&self.compacted_rows),
            compaction_writes: g(&self.compaction_writes),
            blocks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blockfile::format::BLOCK;
    use crate::DType;

    #[test]
    fn a_manifest_round_trips_over_several_blocks() {
        let rows: Vec<u32> = (0..3000).map(|i| i * 7 + 1).collect();
        let blocks = manifest_blocks(rows.len());
        assert_eq!(blocks, 3);
        let m = Manifest {
            seq: 9,
            blocks: blocks as u32,
            groups: 48,
            rows,
        };
        let mut buf = vec![0u8; blocks * BLOCK];
        m.encode(&mut buf);
        let head = Manifest::head(&buf[..PAYLOAD]).unwrap();
        assert_eq!(head, (9, 3000, 3, 48));
        assert_eq!(Manifest::decode(&buf, head), m);
        assert!(Manifest::head(&[0u8; 64]).is_none());
    }

    #[test]
    fn the_index_finds_the_newest_place_and_skips_stale_slots() {
        let h = Header::new(100, 256, DType::F32); // 3 rows per block
        let mut log = Log::empty(h.data_blocks);
        log.push_chunk(100, 3, [40, 41], &[5, 6, 7, 8], 42);
        log.push_chunk(100, 3, [43], &[6], 44);
        assert_eq!(log.place(&h, 5), Some((40, 0)));
        assert_eq!(log.place(&h, 8), Some((41, 0)));
        assert_eq!(log.place(&h, 6), Some((43, 0)));
        assert_eq!(log.place(&h, 9), None);
        let in40: Vec<_> = log.rows_in_block(&h, 40).collect();
        assert_eq!(in40, [Some(5), None, Some(7)]);
        assert_eq!(
            log.rows_in_block(&h, 41).collect::<Vec<_>>(),
            [Some(8), None, None]
        );
        assert_eq!(log.live(), [(0, 5), (2, 7), (3, 8), (6, 6)]);
        assert_eq!(
            log.rows_in_block(&h, 43).collect::<Vec<_>>(),
            [Some(6), None, None]
        );
        assert_eq!((log.end, log.seq), (44, 2));
        assert_eq!(chunk_rows(&h), CHUNK_GROUPS * 3);
        assert_eq!(
            chunk_rows(&Header::new(10, 3000, DType::F32)),
            CHUNK_GROUPS / 3
        );
        assert!(log.room_for(3, 1000));
        assert!(!log.room_for(3, UNUSED as usize - 8));
    }
}
