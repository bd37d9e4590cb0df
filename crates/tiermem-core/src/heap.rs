//! The heap allocator of one device: address-ordered blocks covering the whole device,
//! best-fit allocation, coalescing frees, and `evict_from` (thesis Fig. 4.3), which walks
//! forward from a block handing each occupied block to a callback until a contiguous free
//! span of the requested size exists.
//!
//! Invariants (checked by [`Heap::check`] and the property tests): blocks tile
//! `[0, capacity)` without gaps or overlap; no two free blocks are adjacent; the size index
//! holds exactly the free blocks; `used` is the sum of occupied block sizes.

use std::collections::{BTreeMap, BTreeSet};

/// One block of the heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Length in bytes.
    pub size: u64,
    /// The region occupying the block, or `None` when free.
    pub owner: Option<u64>,
}

/// What an `evict_from` callback did with an occupied block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// The data was moved elsewhere; the heap may reuse the block.
    Evicted,
    /// The block must stay (pinned, or the callback chose to keep it).
    Kept,
}

/// An address-ordered best-fit heap.
#[derive(Debug, Clone)]
pub struct Heap {
    capacity: u64,
    align: u64,
    blocks: BTreeMap<u64, Block>,
    free_by_size: BTreeSet<(u64, u64)>,
    used: u64,
    peak: u64,
}

impl Heap {
    /// A heap of `capacity` bytes handing out `align`-aligned blocks (both powers of two
    /// apart; `capacity` a multiple of `align`).
    #[must_use]
    pub fn new(capacity: u64, align: u64) -> Self {
        assert!(align.is_power_of_two() && capacity.is_multiple_of(align) && capacity > 0);
        let mut h = Heap {
            capacity,
            align,
            blocks: BTreeMap::new(),
            free_by_size: BTreeSet::new(),
            used: 0,
            peak: 0,
        };
        h.insert_free(0, capacity);
        h
    }

    /// Capacity in bytes.
    #[must_use]
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes in occupied blocks.
    #[must_use]
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Highest `used` since creation or the last [`Heap::reset_peak`].
    #[must_use]
    pub fn peak(&self) -> u64 {
        self.peak
    }

    /// Start measuring the peak from the current use.
    pub fn reset_peak(&mut self) {
        self.peak = self.used;
    }

    /// Bytes in free blocks.
    #[must_use]
    pub fn free_bytes(&self) -> u64 {
        self.capacity - self.used
    }

    /// Size of the largest free block.
    #[must_use]
    pub fn largest_free(&self) -> u64 {
        self.free_by_size.iter().next_back().map_or(0, |&(s, _)| s)
    }

    /// `size` rounded up to the heap's alignment (`None` on overflow or zero).
    #[must_use]
    pub fn round(&self, size: u64) -> Option<u64> {
        if size == 0 {
            return None;
        }
        size.checked_next_multiple_of(self.align)
    }

    /// Allocate `size` bytes for `owner` in the smallest free block that fits. Returns the
    /// offset, or `None` when no free block is large enough.
    pub fn alloc(&mut self, size: u64, owner: u64) -> Option<u64> {
        let size = self.round(size)?;
        let &(bsize, off) = self.free_by_size.range((size, 0)..).next()?;
        self.take(off, bsize, size, owner);
        Some(off)
    }

    /// Allocate `size` bytes for `owner` at exactly `off` (a plan's heap offset): succeeds
    /// when `off` is aligned and `[off, off + size)` lies inside one free block, which is
    /// split around it. Returns `off`, or `None` when that span is not free.
    pub fn alloc_at(&mut self, off: u64, size: u64, owner: u64) -> Option<u64> {
        let size = self.round(size)?;
        if !off.is_multiple_of(self.align) {
            return None;
        }
        let (boff, b) = self.block_at(off)?;
        let end = off.checked_add(size)?;
        if b.owner.is_some() || end > boff + b.size {
            return None;
        }
        self.remove_free(boff, b.size);
        if off > boff {
            self.insert_free(boff, off - boff);
        }
        self.insert_free(off, boff + b.size - off);
        self.take(off, boff + b.size - off, size, owner);
        Some(off)
    }

    fn take(&mut self, off: u64, bsize: u64, size: u64, owner: u64) {
        self.remove_free(off, bsize);
        self.blocks.insert(
            off,
            Block {
                size,
                owner: Some(owner),
            },
        );
        if bsize > size {
            self.insert_free(off + size, bsize - size);
        }
        self.used += size;
        self.peak = self.peak.max(self.used);
    }

    /// Free the block at `off`, merging it with free neighbours. Returns its size, or `None`
    /// if no occupied block starts there.
    pub fn free(&mut self, off: u64) -> Option<u64> {
        let b = *self.blocks.get(&off)?;
        b.owner?;
        self.used -= b.size;
        self.blocks.remove(&off);
        let (mut start, mut end) = (off, off + b.size);
        if let Some((&poff, &p)) = self.blocks.range(..off).next_back() {
            if p.owner.is_none() && poff + p.size == off {
                self.remove_free(poff, p.size);
                start = poff;
            }
        }
        if let Some(&n) = self.blocks.get(&end) {
            if n.owner.is_none() {
                self.remove_free(end, n.size);
                end += n.size;
            }
        }
        self.insert_free(start, end - start);
        Some(b.size)
    }

    /// The block containing byte `off`.
    #[must_use]
    pub fn block_at(&self, off: u64) -> Option<(u64, Block)> {
        let (&o, &b) = self.blocks.range(..=off).next_back()?;
        (off < o + b.size).then_some((o, b))
    }

    /// Every block in address order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, Block)> + '_ {
        self.blocks.iter().map(|(&o, &b)| (o, b))
    }

    /// Walk forward from the block containing `start` (wrapping once around the heap),
    /// handing each occupied block to `cb` until a contiguous free span of `size` bytes
    /// exists; blocks the callback evicts are freed and coalesced with their neighbours, so a
    /// contiguous free span is always a single block. Returns the offset of a free block of
    /// at least `size` bytes, or `Ok(None)` if the walk came back to its start without one
    /// (everything in the way was kept).
    pub fn evict_from<E>(
        &mut self,
        start: u64,
        size: u64,
        mut cb: impl FnMut(u64, u64) -> Result<Disposition, E>,
    ) -> Result<Option<u64>, E> {
        let Some(size) = self.round(size) else {
            return Ok(None);
        };
        if size > self.capacity {
            return Ok(None);
        }
        let (first, _) = self
            .block_at(start.min(self.capacity - 1))
            .expect("blocks tile the heap");
        let mut cursor = first;
        let mut wrapped = false;
        loop {
            let (off, b) = self.block_at(cursor).expect("blocks tile the heap");
            let next = match b.owner {
                Some(owner) if cb(off, owner)? == Disposition::Kept => off + b.size,
                owner => {
                    if owner.is_some() {
                        self.free(off);
                    }
                    // Free now, merged with any free neighbours.
                    let (foff, fb) = self.block_at(cursor).expect("blocks tile the heap");
                    if fb.size >= size {
                        return Ok(Some(foff));
                    }
                    foff + fb.size
                }
            };
            cursor = next;
            if cursor >= self.capacity {
                if wrapped {
                    return Ok(None);
                }
                wrapped = true;
                cursor = 0;
            }
            if wrapped && cursor >= first {
                return Ok(None);
            }
        }
    }

    /// Check every invariant; returns a description of the first violation.
    pub fn check(&self) -> Result<(), String> {
        let mut expect = 0;
        let mut prev_free = false;
        let mut used = 0;
        let mut free_count = 0;
        for (&off, b) in &self.blocks {
            if off != expect {
                return Err(format!("gap or overlap at {off} (expected {expect})"));
            }
            if b.size == 0 || off % self.align != 0 || b.size % self.align != 0 {
                return Err(format!("bad block {off}+{}", b.size));
            }
            match b.owner {
                None => {
                    if prev_free {
                        return Err(format!("adjacent free blocks at {off}"));
                    }
                    if !self.free_by_size.contains(&(b.size, off)) {
                        return Err(format!("free block {off} missing from the size index"));
                    }
                    free_count += 1;
                }
                Some(_) => used += b.size,
            }
            prev_free = b.owner.is_none();
            expect = off + b.size;
        }
        if expect != self.capacity {
            return Err(format!(
                "blocks end at {expect}, capacity {}",
                self.capacity
            ));
        }
        if free_count != self.free_by_size.len() {
            return Err("size index holds stale entries".into());
        }
        if used != self.used {
            return Err(format!("used {} but blocks add to {used}", self.used));
        }
        Ok(())
    }

    fn insert_free(&mut self, off: u64, size: u64) {
        self.blocks.insert(off, Block { size, owner: None });
        self.free_by_size.insert((size, off));
    }

    fn remove_free(&mut self, off: u64, size: u64) {
        self.free_by_size.remove(&(size, off));
        self.blocks.remove(&off);
    }
}
