//! The traffic a kernel puts on the device an operand lives on, as an emulated device
//! charges it ([`tiermem_core::manager::Manager::charge_steps`]): bytes read and written at cache-line
//! granularity, and the read misses whose latency the core cannot hide.
//!
//! The model is a core with a stride prefetcher: a line is fetched once while the stream
//! stays on it; a fetch at the next line, or at the same line distance as the fetch before,
//! is predicted and costs only bandwidth unless the stride crosses a [`PAGE`] (prefetchers
//! stop at page boundaries); any other fetch is a miss, of which a core keeps
//! [`MLP`] in flight, so `misses / (MLP * threads)` latencies are exposed (the steps charged).
//! Regular loops count in closed form ([`Traffic::sequential`], [`Traffic::strided`]);
//! loops through data-dependent indices feed their addresses to a [`Stream`].

/// Bytes per cache line.
pub const LINE: u64 = 64;
/// Read misses a core keeps in flight (its line-fill buffers).
pub const MLP: u64 = 10;
/// Prefetchers do not follow a stride across a page of this many bytes.
pub const PAGE: u64 = 4096;

/// One operand's traffic in one run of a kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Bytes read (whole lines).
    pub read_bytes: u64,
    /// Bytes written (whole lines).
    pub write_bytes: u64,
    /// Read misses the prefetcher did not predict.
    pub misses: u64,
}

impl Traffic {
    /// `bytes` streamed in order, read and/or written.
    #[must_use]
    pub fn sequential(bytes: u64, read: bool, write: bool) -> Self {
        let b = bytes.div_ceil(LINE) * LINE;
        Traffic {
            read_bytes: if read { b } else { 0 },
            write_bytes: if write { b } else { 0 },
            misses: 0,
        }
    }

    /// `count` accesses of `elem` bytes at a constant `stride` (bytes): a line per access
    /// once the stride reaches a line, predicted by the prefetcher unless the stride
    /// reaches a page.
    #[must_use]
    pub fn strided(count: u64, stride: u64, elem: u64, read: bool, write: bool) -> Self {
        if stride <= LINE {
            return Self::sequential(count * stride.max(elem), read, write);
        }
        let b = count * LINE * elem.div_ceil(LINE);
        Traffic {
            read_bytes: if read { b } else { 0 },
            write_bytes: if write { b } else { 0 },
            misses: if read && stride >= PAGE { count } else { 0 },
        }
    }

    /// This traffic `n` times over.
    #[must_use]
    pub fn times(self, n: u64) -> Self {
        Traffic {
            read_bytes: self.read_bytes * n,
            write_bytes: self.write_bytes * n,
            misses: self.misses * n,
        }
    }

    /// The sum of two.
    #[must_use]
    pub fn plus(self, o: Self) -> Self {
        Traffic {
            read_bytes: self.read_bytes + o.read_bytes,
            write_bytes: self.write_bytes + o.write_bytes,
            misses: self.misses + o.misses,
        }
    }

    /// Exposed miss latencies when `threads` cores each keep [`MLP`] misses in flight.
    #[must_use]
    pub fn steps(&self, threads: usize) -> u64 {
        self.misses.div_ceil(MLP * threads.max(1) as u64)
    }
}

/// Lines a core's cache holds for a [`Stream`] (256 KiB, a core's L2).
pub const CACHE_LINES: usize = 4096;

/// One thread's stream of data-dependent accesses through the model: a direct-mapped
/// cache of [`CACHE_LINES`] lines, then the stride prefetcher.
#[derive(Debug, Clone)]
pub struct Stream {
    tags: Vec<u64>,
    last: Option<u64>,
    delta: i64,
    /// What the stream has cost so far.
    pub traffic: Traffic,
}

impl Default for Stream {
    fn default() -> Self {
        Stream {
            tags: vec![u64::MAX; CACHE_LINES],
            last: None,
            delta: 0,
            traffic: Traffic::default(),
        }
    }
}

impl Stream {
    /// An access at byte `addr`; `write`: the line is also written back.
    #[inline]
    pub fn touch(&mut self, addr: u64, write: bool) {
        let line = addr / LINE;
        let slot = ((line ^ (line >> 12)) as usize) % CACHE_LINES;
        if self.tags[slot] == line {
            return;
        }
        self.tags[slot] = line;
        let d = self.last.map_or(0, |l| line.wrapping_sub(l) as i64);
        self.traffic.read_bytes += LINE;
        if write {
            self.traffic.write_bytes += LINE;
        }
        let predicted = d == 1 || (d == self.delta && d.unsigned_abs() * LINE < PAGE);
        if self.last.is_none() || !predicted {
            self.traffic.misses += 1;
        }
        self.delta = d;
        self.last = Some(line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_strided_and_random_streams() {
        let mut s = Stream::default();
        for i in 0..1024u64 {
            s.touch(i * 8, false);
        }
        assert_eq!(
            s.traffic,
            Traffic::sequential(8192, true, false).plus(Traffic {
                misses: 1,
                ..Traffic::default()
            })
        );
        let mut s = Stream::default();
        for i in 0..100u64 {
            s.touch(i * 4096, true);
        }
        assert_eq!(s.traffic.misses, 100); // a stride of a page defeats the prefetcher
        let mut s = Stream::default();
        for i in 0..100u64 {
            s.touch(i * 1024, true);
        }
        assert_eq!(s.traffic.misses, 2); // the first, and the first stride before it is learnt
        assert_eq!(s.traffic.write_bytes, 6400);
        assert_eq!(Traffic::strided(100, 4096, 8, true, false).read_bytes, 6400);
        let mut s = Stream::default();
        let mut x = 1u64;
        for _ in 0..1000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            s.touch((x >> 20) % (1 << 30), false);
        }
        assert!(s.traffic.misses > 990, "{:?}", s.traffic);
        let mut s = Stream::default(); // a band re-read row after row hits the cache
        for r in 0..1000u64 {
            for c in r..r + 64 {
                s.touch(c * 8, false);
            }
        }
        assert_eq!(s.traffic.read_bytes, (1063u64 * 8).div_ceil(LINE) * LINE);
        assert_eq!(
            Traffic {
                misses: 41,
                ..Traffic::default()
            }
            .steps(2),
            3
        );
    }
}
