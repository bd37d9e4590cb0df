//! How an allocation's address range is made of objects (OpenMP's `partition` trait): one
//! object for the whole range (`nearest`), one per node in contiguous blocks (`blocked`),
//! or one per node holding every k-th chunk of the range (`interleaved`). Each piece of the
//! range maps a span of one part's pages.

use tiermem_core::traits::Partition;

/// Most pieces an interleaved range is cut into (each is a map: the kernel bounds a
/// process's maps, `vm.max_map_count`, 65530 by default).
pub const MAX_PIECES: usize = 4096;

/// One span of the address range: `len` bytes at `range_off` map the part's bytes at
/// `part_off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Offset in the allocation's range.
    pub range_off: usize,
    /// Offset in the part's object.
    pub part_off: usize,
    /// Bytes.
    pub len: usize,
}

/// The pieces of each part of a `len`-byte range (a whole number of `page`s) over `k`
/// parts: `(bytes of each part, its pieces)`. Parts that would hold nothing are left out,
/// so fewer than `k` may come back.
#[must_use]
pub fn layout(partition: Partition, len: usize, k: usize, page: usize) -> Vec<(usize, Vec<Piece>)> {
    let k = k.max(1);
    let chunk = match partition {
        Partition::Nearest => len,
        Partition::Blocked => len.div_ceil(k).next_multiple_of(page),
        Partition::Interleaved => len.div_ceil(MAX_PIECES).next_multiple_of(page).max(page),
    };
    let parts = if partition == Partition::Nearest {
        1
    } else {
        k
    };
    let mut out: Vec<(usize, Vec<Piece>)> = vec![(0, Vec::new()); parts];
    let mut at = 0;
    let mut j = 0;
    while at < len {
        let n = chunk.min(len - at);
        let p = &mut out[j % parts];
        p.1.push(Piece {
            range_off: at,
            part_off: p.0,
            len: n,
        });
        p.0 += n;
        at += n;
        j += 1;
    }
    out.retain(|p| p.0 > 0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;

    fn covers(parts: &[(usize, Vec<Piece>)], len: usize) {
        let mut all: Vec<Piece> = parts.iter().flat_map(|p| p.1.clone()).collect();
        all.sort_by_key(|p| p.range_off);
        let mut at = 0;
        for p in &all {
            assert_eq!(p.range_off, at);
            assert_eq!(p.len % PAGE, 0);
            at += p.len;
        }
        assert_eq!(at, len);
        for (bytes, pieces) in parts {
            assert_eq!(*bytes, pieces.iter().map(|p| p.len).sum::<usize>());
            let mut off = 0;
            for p in pieces {
                assert_eq!(p.part_off, off);
                off += p.len;
            }
        }
    }

    #[test]
    fn layouts_cover_the_range_once() {
        for len in [PAGE, 3 * PAGE, 10 * PAGE, 5000 * PAGE] {
            for k in 1..5 {
                for part in [
                    Partition::Nearest,
                    Partition::Blocked,
                    Partition::Interleaved,
                ] {
                    let l = layout(part, len, k, PAGE);
                    covers(&l, len);
                    assert!(l.iter().map(|p| p.1.len()).sum::<usize>() <= MAX_PIECES.max(k));
                }
            }
        }
        let b = layout(Partition::Blocked, 10 * PAGE, 3, PAGE);
        assert_eq!(
            b.iter().map(|p| p.0 / PAGE).collect::<Vec<_>>(),
            vec![4, 4, 2]
        );
        let i = layout(Partition::Interleaved, 5 * PAGE, 2, PAGE);
        assert_eq!(
            i[0].1
                .iter()
                .map(|p| p.range_off / PAGE)
                .collect::<Vec<_>>(),
            vec![0, 2, 4]
        );
        assert_eq!(layout(Partition::Blocked, PAGE, 4, PAGE).len(), 1);
    }
}
