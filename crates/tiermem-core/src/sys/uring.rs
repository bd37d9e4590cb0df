//! Batched reads through io_uring: a batch of `(offset, length)` requests on one file, up to
//! `depth` in flight, each handed to the caller in request order as soon as it and those
//! before it are in, while later reads stay in flight; and read-modify-write batches, each
//! request written back from where it was read once the caller has changed it. Reads land in
//! buffers the ring owns and reuses (twice the depth of them, kept between batches up to
//! 1 MiB), so a batch of any size touches a few pages the kernel has pinned before, not one
//! fresh page per block. Where the kernel refuses io_uring (old kernels, seccomp,
//! `kernel.io_uring_disabled`), [`Uring::new`] fails and callers fall back to threads.

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

/// The most bytes of buffers a ring keeps between batches.
const KEEP_BYTES: usize = 1 << 20;

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

    /// Read every request `(offset, length)` of `fd` in full (on a file opened for direct
    /// I/O, offsets and lengths multiples of 4 KiB) and call `done(k, bytes)` for each in request
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
        let written = self.modify_each(fd, reqs, |k, bytes| {
            done(k, bytes.map(|b| &*b));
            false
        });
        debug_assert!(written.is_ok(), "nothing is written");
    }

    /// Read-modify-write: read every request `(offset, length)` as [`Uring::read_each`]
    /// does, hand each to `modify(k, bytes)` in request order, and write the bytes back
    /// where they were read when `modify` returns true, while later reads and writes stay
    /// in flight (`depth` in all). A batch of any size holds only the ring's buffers. The
    /// first write that failed is returned, with its request; `modify` is called for every
    /// request whatever the writes do. `fd` must be open for writing.
    pub fn modify_each(
        &self,
        fd: RawFd,
        reqs: &[(u64, usize)],
        mut modify: impl FnMut(usize, io::Result<&mut [u8]>) -> bool,
    ) -> Result<(), (usize, io::Error)> {
        let mut guard = self
            .ring
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let r = &mut *guard;
        if reqs.is_empty() {
            return Ok(());
        }
        let longest = reqs.iter().map(|&(_, len)| len).max().unwrap_or(0);
        if r.slot_len < longest || r.slots.len() < 2 * self.depth as usize {
            r.slot_len = r.slot_len.max(longest.next_multiple_of(ALIGN));
            r.slots = (0..2 * self.depth)
                .map(|_| AlignedBuf::new(r.slot_len))
                .collect();
        }
        let n = reqs.len();
        let mut b = Batch {
            fd,
            reqs,
            depth: self.depth as usize,
            next: 0,
            inflight: 0,
            delivered: 0,
            results: (0..n).map(|_| None).collect(),
            slot_of: vec![0; n],
            free: (0..r.slots.len()).rev().collect(),
            writes: Vec::new(),
            write_error: None,
            panicked: None,
        };
        while b.next < n || b.inflight > 0 || !b.writes.is_empty() {
            b.fill(r);
            if let Err(e) = r.ring.submit_and_wait(1) {
                match e.raw_os_error() {
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY) => continue,
                    _ if b.inflight == 0 => {
                        // Nothing in flight: fail what was not submitted and stop.
                        let failed = || io::Error::new(e.kind(), e.to_string());
                        for res in &mut b.results[b.next..] {
                            *res = Some(Err(failed()));
                        }
                        if let Some(&k) = b.writes.iter().min() {
                            b.failed_write(k, failed());
                        }
                        b.writes.clear();
                        break;
                    }
                    // Transfers in flight use the ring's buffers, which a panic or a
                    // poisoned lock could hand to another batch. There is no safe way on.
                    _ => {
                        eprintln!("tiermem: io_uring failed with transfers in flight: {e}");
                        std::process::abort();
                    }
                }
            }
            for cqe in r.ring.completion() {
                b.complete(cqe.user_data(), cqe.result());
            }
            // Keep the device busy while the completed reads are handed over: a failed
            // submission here is retried (and handled) by the wait above.
            b.fill(r);
            let _ = r.ring.submit();
            b.deliver(r, &mut modify);
        }
        b.deliver(r, &mut modify);
        if r.slots.len() * r.slot_len > KEEP_BYTES {
            // Long requests' buffers go with their batch; a ring per table keeps a few pages.
            r.slots = Vec::new();
            r.slot_len = 0;
        }
        drop(guard);
        if let Some(p) = b.panicked {
            std::panic::resume_unwind(p);
        }
        b.write_error.map_or(Ok(()), Err)
    }
}

/// A completion's `user_data`: the request's index, doubled, plus one for a write.
const WRITE: u64 = 1;

/// Where one `modify_each` call stands.
struct Batch<'a> {
    fd: RawFd,
    reqs: &'a [(u64, usize)],
    depth: usize,
    /// The first request not yet read.
    next: usize,
    /// Reads and writes queued or in flight.
    inflight: usize,
    /// The first request not yet handed over.
    delivered: usize,
    /// Each request's read, once it completed, until it is handed over.
    results: Vec<Option<io::Result<()>>>,
    /// Each request's buffer, from its read's submission until its write completes.
    slot_of: Vec<usize>,
    free: Vec<usize>,
    /// Requests handed over and to be written back, not yet queued.
    writes: Vec<usize>,
    /// The first write that failed.
    write_error: Option<(usize, io::Error)>,
    /// The caller's panic, if it panicked.
    panicked: Option<Panic>,
}

impl Batch<'_> {
    /// Queue writes, then reads from `next` (each into a free buffer), while fewer than
    /// `depth` are in flight and the queue has room.
    fn fill(&mut self, r: &mut Ring) {
        let mut sq = r.ring.submission();
        while self.inflight < self.depth && !sq.is_full() {
            let (k, write) = match self.writes.last() {
                Some(&k) => (k, true),
                None if self.next < self.reqs.len() => match self.free.last() {
                    Some(&slot) => {
                        self.slot_of[self.next] = slot;
                        (self.next, false)
                    }
                    None => break,
                },
                None => break,
            };
            let (offset, len) = self.reqs[k];
            let buf = r.slots[self.slot_of[k]].as_mut_slice().as_mut_ptr();
            let len = u32::try_from(len).unwrap_or(u32::MAX);
            let (fd, tag) = (types::Fd(self.fd), 2 * k as u64);
            let entry = if write {
                opcode::Write::new(fd, buf, len)
                    .offset(offset)
                    .build()
                    .user_data(tag | WRITE)
            } else {
                opcode::Read::new(fd, buf, len)
                    .offset(offset)
                    .build()
                    .user_data(tag)
            };
            // SAFETY: the buffer is request k's alone (a free one for a read; its own read's
            // for a write, handed over and not touched since) and holds at least `len`
            // bytes; the ring owns it and outlives the transfer, which `modify_each` waits
            // for before returning; `fd` is the caller's open file.
            if unsafe { sq.push(&entry) }.is_err() {
                break;
            }
            if write {
                self.writes.pop();
            } else {
                self.free.pop();
                self.next += 1;
            }
            self.inflight += 1;
        }
    }

    /// Record one completion.
    fn complete(&mut self, tag: u64, res: i32) {
        self.inflight -= 1;
        let k = (tag / 2) as usize;
        let write = tag & WRITE != 0;
        let outcome = outcome(res, self.reqs[k].1, write);
        if !write {
            self.results[k] = Some(outcome);
            return;
        }
        self.free.push(self.slot_of[k]);
        if let Err(e) = outcome {
            self.failed_write(k, e);
        }
    }

    /// Keep the failed write of the earliest request.
    fn failed_write(&mut self, k: usize, e: io::Error) {
        if self.write_error.as_ref().is_none_or(|(j, _)| k < *j) {
            self.write_error = Some((k, e));
        }
    }

    /// Hand `modify` each read from `delivered` on while it is there, in order; queue the
    /// write it asks for or free its buffer. After a panic of `modify`, reads are only
    /// dropped and nothing more is written.
    fn deliver(
        &mut self,
        r: &mut Ring,
        modify: &mut impl FnMut(usize, io::Result<&mut [u8]>) -> bool,
    ) {
        while self.delivered < self.results.len() {
            let k = self.delivered;
            let Some(res) = self.results[k].take() else {
                break;
            };
            // A request that failed to submit holds no buffer.
            let submitted = k < self.next;
            let mut write = false;
            if self.panicked.is_none() {
                let ok = res.is_ok();
                let bytes =
                    res.map(|()| &mut r.slots[self.slot_of[k]].as_mut_slice()[..self.reqs[k].1]);
                let call = std::panic::AssertUnwindSafe(|| modify(k, bytes));
                match std::panic::catch_unwind(call) {
                    Ok(w) => write = w && ok && submitted,
                    Err(p) => self.panicked = Some(p),
                }
            }
            if write {
                self.writes.push(k);
            } else if submitted {
                self.free.push(self.slot_of[k]);
            }
            self.delivered += 1;
        }
    }
}

/// A completion's result for a transfer of `len` bytes.
fn outcome(res: i32, len: usize, write: bool) -> io::Result<()> {
    if res < 0 {
        Err(io::Error::from_raw_os_error(-res))
    } else if res as usize != len {
        let (verb, why) = if write {
            ("wrote", "a short write")
        } else {
            ("read", "past the end of the file")
        };
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("{verb} {res} of {len} bytes ({why})"),
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
        let kept = |u: &Uring| u.ring.lock().unwrap().slots.len();
        assert_eq!(kept(&u), 8, "small buffers stay with the ring");
        // Buffers over 1 MiB in all (32 of 64 KiB) go with their batch.
        let big = Uring::new(16).unwrap();
        let mut n = 0;
        big.read_each(f.as_raw_fd(), &[(0, 65536)], |_, bytes| {
            assert_eq!(bytes.unwrap(), &data[..]);
            n += 1;
        });
        assert_eq!((n, kept(&big)), (1, 0));
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

    #[test]
    fn modified_requests_are_written_back_and_a_failed_write_is_named() {
        let Ok(u) = Uring::new(4) else {
            eprintln!("io_uring refused by this kernel: nothing to test");
            return;
        };
        let mut data: Vec<u8> = (0..64 * 1024).map(|i| (i % 241) as u8).collect();
        let (path, _) = file_of(&data, "modify");
        let rw = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        // Every block once, out of order; even requests changed and written, odd ones only
        // read; one run of two blocks.
        let mut reqs: Vec<(u64, usize)> = (0..14u64)
            .map(|i| ((i * 3 % 14 + 2) * 4096, 4096))
            .collect();
        reqs.push((0, 8192));
        let mut calls = 0;
        let res = u.modify_each(rw.as_raw_fd(), &reqs, |k, bytes| {
            calls += 1;
            let b = bytes.unwrap();
            b.iter_mut().for_each(|x| *x ^= 0x5a);
            k % 2 == 0
        });
        assert!(res.is_ok(), "{res:?}");
        assert_eq!(calls, reqs.len());
        for (k, &(o, len)) in reqs.iter().enumerate() {
            if k % 2 == 0 {
                data[o as usize..o as usize + len]
                    .iter_mut()
                    .for_each(|x| *x ^= 0x5a);
            }
        }
        assert!(
            std::fs::read(&path).unwrap() == data,
            "the file is not what was written"
        );
        // A file open only for reading: the first write asked for fails and is named.
        let (_, ro) = file_of(&data, "modify-ro");
        let err = u
            .modify_each(ro.as_raw_fd(), &reqs, |k, _| k >= 3)
            .unwrap_err();
        assert_eq!(err.0, 3, "{err:?}");
        std::fs::remove_file(path).ok();
    }
}
