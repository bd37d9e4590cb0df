//! Batched reads through io_uring: a batch of `(offset, length)` requests on one file, up to
//! `depth` in flight, each handed to the caller in request order as soon as it and those
//! before it are in, while later reads stay in flight. Reads land in buffers the ring owns
//! and reuses (twice the depth of them), so a batch of any size touches a few pages
//! the kernel has pinned before, not one fresh page per block. Where the kernel refuses
//! io_uring (old kernels, seccomp, `kernel.io_uring_disabled`), [`Uring::new`] fails and
//! callers fall back to threads.

use std::io;
use std::os::fd::RawFd;
use std::sync::Mutex;

use io_uring::{opcode, types, IoUring};

use super::direct_io::{AlignedBuf, ALIGN};

/// A ring for one file's batched reads; batches on one ring run one at a time.
pub struct Uring {
    ring: Mutex<Ring>,
    depth: u32,
}

/// The ring and the buffers its reads land in. The ring is declared (so dropped) first:
/// nothing is in flight outside a batch, and the buffers outlive the ring's file.
struct Ring {
    ring: IoUring,
    /// Twice `depth` buffers of `slot_len` bytes each, one per read in flight or completed
    /// and not yet handed over.
    slots: Vec<AlignedBuf>,
    slot_len: usize,
}

impl std::fmt::Debug for Uring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uring").field("depth", &self.depth).finish()
    }
}

/// A panic's payload, carried until the reads in flight are in.
type Panic = Box<dyn std::any::Any + Send>;

impl Uring {
    /// A ring keeping up to `depth` reads in flight, or the kernel's refusal.
    pub fn new(depth: u32) -> io::Result<Self> {
        let depth = depth.clamp(1, 4096);
        Ok(Uring {
            ring: Mutex::new(Ring {
                ring: IoUring::new(depth.next_power_of_two())?,
                slots: Vec::new(),
                slot_len: 0,
            }),
            depth,
        })
    }

    /// Reads kept in flight.
    #[must_use]
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Read every request `(offset, length)` of `fd` in full (`length` a multiple of 4 KiB,
    /// `fd` opened for direct I/O or not) and call `done(k, bytes)` for each in request
    /// order, as soon as it and every request before it have completed, while later reads
    /// stay in flight: the caller's work on one request overlaps the device's on the next.
    /// `bytes` is the data read, or why not (a read that ends early is `UnexpectedEof`); it
    /// is valid only during the call. `done` runs under the ring's lock (a leaf lock) and
    /// must take no lock. If `done` panics it is not called again; the reads in flight are
    /// waited for and the panic goes on from here.
    pub fn read_each(
        &self,
        fd: RawFd,
        reqs: &[(u64, usize)],
        mut done: impl FnMut(usize, io::Result<&[u8]>),
    ) {
        let mut guard = self
            .ring
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let r = &mut *guard;
        let longest = reqs.iter().map(|&(_, len)| len).max().unwrap_or(0);
        if r.slot_len < longest || r.slots.len() < 2 * self.depth as usize {
            r.slot_len = r.slot_len.max(longest.next_multiple_of(ALIGN));
            r.slots = (0..2 * self.depth)
                .map(|_| AlignedBuf::new(r.slot_len))
                .collect();
        }
        let n = reqs.len();
        let mut results: Vec<Option<io::Result<()>>> = (0..n).map(|_| None).collect();
        let mut slot_of = vec![0usize; n];
        let mut free: Vec<usize> = (0..r.slots.len()).rev().collect();
        let mut b = Batch {
            depth: self.depth as usize,
            next: 0,
            inflight: 0,
            delivered: 0,
            panicked: None,
        };
        while b.next < n || b.inflight > 0 {
            b.fill(r, fd, reqs, &mut slot_of, &mut free);
            if let Err(e) = r.ring.submit_and_wait(1) {
                match e.raw_os_error() {
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY) => continue,
                    _ if b.inflight == 0 => {
                        // Nothing in flight: fail what was not submitted and stop.
                        for res in &mut results[b.next..] {
                            *res = Some(Err(io::Error::new(e.kind(), e.to_string())));
                        }
                        break;
                    }
                    // Reads in flight write into the ring's buffers, which a panic or a
                    // poisoned lock could hand to another batch. There is no safe way on.
                    _ => {
                        eprintln!("tiermem: io_uring failed with reads in flight: {e}");
                        std::process::abort();
                    }
                }
            }
            for cqe in r.ring.completion() {
                let k = cqe.user_data() as usize;
                b.inflight -= 1;
                results[k] = Some(outcome(cqe.result(), reqs[k].1));
            }
            // Keep the device busy while the completed reads are handed over: a failed
            // submission here is retried (and handled) by the wait above.
            b.fill(r, fd, reqs, &mut slot_of, &mut free);
            let _ = r.ring.submit();
            b.deliver(r, reqs, &mut results, &slot_of, &mut free, &mut done);
        }
        b.deliver(r, reqs, &mut results, &slot_of, &mut free, &mut done);
        drop(guard);
        if let Some(p) = b.panicked {
            std::panic::resume_unwind(p);
        }
    }
}

/// Where one `read_each` call stands.
struct Batch {
    depth: usize,
    /// The first request not yet submitted.
    next: usize,
    inflight: usize,
    /// The first request not yet handed over.
    delivered: usize,
    /// `done`'s panic, if it panicked.
    panicked: Option<Panic>,
}

impl Batch {
    /// Queue requests from `next` while fewer than `depth` are in flight, a buffer is free
    /// and the queue has room.
    fn fill(
        &mut self,
        r: &mut Ring,
        fd: RawFd,
        reqs: &[(u64, usize)],
        slot_of: &mut [usize],
        free: &mut Vec<usize>,
    ) {
        let mut sq = r.ring.submission();
        while self.next < reqs.len() && self.inflight < self.depth && !sq.is_full() {
            let Some(&slot) = free.last() else { break };
            let (offset, len) = reqs[self.next];
            let buf = r.slots[slot].as_mut_slice().as_mut_ptr();
            let entry =
                opcode::Read::new(types::Fd(fd), buf, u32::try_from(len).unwrap_or(u32::MAX))
                    .offset(offset)
                    .build()
                    .user_data(self.next as u64);
            // SAFETY: the slot is free (no read in flight into it, not being handed over)
            // and holds at least `len` bytes; the ring owns it and outlives the read, which
            // `read_each` waits for before returning; `fd` is the caller's open file.
            if unsafe { sq.push(&entry) }.is_err() {
                break;
            }
            free.pop();
            slot_of[self.next] = slot;
            self.next += 1;
            self.inflight += 1;
        }
    }

    /// Hand `done` each result from `delivered` on while it is there, in order, and free
    /// its buffer. After a panic of `done`, results are only dropped.
    fn deliver(
        &mut self,
        r: &mut Ring,
        reqs: &[(u64, usize)],
        results: &mut [Option<io::Result<()>>],
        slot_of: &[usize],
        free: &mut Vec<usize>,
        done: &mut impl FnMut(usize, io::Result<&[u8]>),
    ) {
        while self.delivered < results.len() {
            let k = self.delivered;
            let Some(res) = results[k].take() else { break };
            // A request that failed to submit holds no buffer.
            let submitted = k < self.next;
            if self.panicked.is_none() {
                let bytes = res.map(|()| &r.slots[slot_of[k]].as_mut_slice()[..reqs[k].1]);
                let call = std::panic::AssertUnwindSafe(|| done(k, bytes));
                self.panicked = std::panic::catch_unwind(call).err();
            }
            if submitted {
                free.push(slot_of[k]);
            }
            self.delivered += 1;
        }
    }
}

/// A completion's result for a read of `len` bytes.
fn outcome(res: i32, len: usize) -> io::Result<()> {
    if res < 0 {
        Err(io::Error::from_raw_os_error(-res))
    } else if res as usize != len {
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("read {res} of {len} bytes (past the end of the file)"),
        ))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsRawFd;

    use super::*;

    fn file_of(data: &[u8], tag: &str) -> (std::path::PathBuf, std::fs::File) {
        let path = std::env::temp_dir().join(format!("tiermem-uring-{tag}-{}", std::process::id()));
        std::fs::File::create(&path)
            .unwrap()
            .write_all(data)
            .unwrap();
        let f = std::fs::File::open(&path).unwrap();
        (path, f)
    }

    #[test]
    fn reads_come_back_in_order_with_their_bytes_and_eof_is_an_error() {
        let Ok(u) = Uring::new(4) else {
            eprintln!("io_uring refused by this kernel: nothing to test");
            return;
        };
        let data: Vec<u8> = (0..64 * 1024).map(|i| (i * 7 % 251) as u8).collect();
        let (path, f) = file_of(&data, "order");
        // More requests than buffers (8), a two-block request among them, and one past the end.
        let mut reqs: Vec<(u64, usize)> = (0..40u64).map(|i| ((i * 5 % 16) * 4096, 4096)).collect();
        reqs[3] = (4096, 8192);
        reqs.push((65536, 4096));
        let mut seen = Vec::new();
        u.read_each(f.as_raw_fd(), &reqs, |k, bytes| {
            let (o, len) = (reqs[k].0 as usize, reqs[k].1);
            if k + 1 < reqs.len() {
                assert_eq!(bytes.unwrap(), &data[o..o + len], "request {k}");
            } else {
                assert_eq!(bytes.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
            }
            seen.push(k);
        });
        assert_eq!(seen, (0..reqs.len()).collect::<Vec<_>>());
        std::fs::remove_file(path).ok();
    }

    #[test]
    fn a_panic_in_done_waits_for_the_reads_and_leaves_the_ring_usable() {
        let Ok(u) = Uring::new(8) else {
            eprintln!("io_uring refused by this kernel: nothing to test");
            return;
        };
        let data: Vec<u8> = (0..64 * 1024).map(|i| (i % 253) as u8).collect();
        let (path, f) = file_of(&data, "panic");
        let reqs: Vec<(u64, usize)> = (0..64u64).map(|i| ((i % 16) * 4096, 4096)).collect();
        let mut calls = 0;
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            u.read_each(f.as_raw_fd(), &reqs, |k, _| {
                calls += 1;
                assert!(k < 5, "the caller's work failed at request {k}");
            });
        }));
        assert!(caught.is_err(), "the panic goes on to the caller");
        assert_eq!(calls, 6, "done is not called after it panicked");
        let mut n = 0;
        u.read_each(f.as_raw_fd(), &reqs, |k, bytes| {
            let o = reqs[k].0 as usize;
            assert_eq!(bytes.unwrap(), &data[o..o + 4096]);
            n += 1;
        });
        assert_eq!(n, reqs.len());
        std::fs::remove_file(path).ok();
    }
}
