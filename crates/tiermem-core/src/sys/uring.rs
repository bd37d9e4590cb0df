//! Batched reads through io_uring: a batch of (offset, buffer) requests on one file, up to
//! `depth` in flight, completed in any order. Where the kernel refuses io_uring (old
//! kernels, seccomp, `kernel.io_uring_disabled`), [`Uring::new`] fails and callers fall
//! back to threads.

use std::io;
use std::os::fd::RawFd;
use std::sync::Mutex;

use io_uring::{opcode, types, IoUring};

/// A ring for one file's batched reads; batches on one ring run one at a time.
pub struct Uring {
    ring: Mutex<IoUring>,
    depth: u32,
}

impl std::fmt::Debug for Uring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uring").field("depth", &self.depth).finish()
    }
}

impl Uring {
    /// A ring keeping up to `depth` reads in flight, or the kernel's refusal.
    pub fn new(depth: u32) -> io::Result<Self> {
        let depth = depth.clamp(1, 4096);
        Ok(Uring {
            ring: Mutex::new(IoUring::new(depth.next_power_of_two())?),
            depth,
        })
    }

    /// Reads kept in flight.
    #[must_use]
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Read every request `(offset, buffer)` from `fd` in full; one result per request, in
    /// order (a read that ends early is `UnexpectedEof`). Returns only once no read is in
    /// flight, whatever happened, so the buffers are the caller's again.
    pub fn read_all(&self, fd: RawFd, reqs: &mut [(u64, &mut [u8])]) -> Vec<io::Result<()>> {
        let mut ring = self
            .ring
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = reqs.len();
        let mut results: Vec<Option<io::Result<()>>> = (0..n).map(|_| None).collect();
        let (mut next, mut inflight) = (0usize, 0usize);
        while next < n || inflight > 0 {
            {
                let mut sq = ring.submission();
                while next < n && inflight < self.depth as usize && !sq.is_full() {
                    let (offset, buf) = &mut reqs[next];
                    let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
                    let entry = opcode::Read::new(types::Fd(fd), buf.as_mut_ptr(), len)
                        .offset(*offset)
                        .build()
                        .user_data(next as u64);
                    // SAFETY: the buffer is `reqs[next]`'s, borrowed mutably by this call,
                    // which does not return while the read is in flight (the loop waits for
                    // every completion); `fd` is the caller's open file.
                    if unsafe { sq.push(&entry) }.is_err() {
                        break;
                    }
                    next += 1;
                    inflight += 1;
                }
            }
            if let Err(e) = ring.submit_and_wait(1) {
                match e.raw_os_error() {
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY) => continue,
                    _ if inflight == 0 => {
                        // Nothing in flight: fail what was not submitted and return.
                        for r in &mut results {
                            if r.is_none() {
                                *r = Some(Err(io::Error::new(e.kind(), e.to_string())));
                            }
                        }
                        break;
                    }
                    // Reads in flight write into the caller's buffers: returning now could
                    // let them land in freed memory. There is no safe way on.
                    _ => {
                        eprintln!("tiermem: io_uring failed with reads in flight: {e}");
                        std::process::abort();
                    }
                }
            }
            for cqe in ring.completion() {
                let k = cqe.user_data() as usize;
                let res = cqe.result();
                inflight -= 1;
                results[k] = Some(if res < 0 {
                    Err(io::Error::from_raw_os_error(-res))
                } else if res as usize != reqs[k].1.len() {
                    Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "read {res} of {} bytes (past the end of the file)",
                            reqs[k].1.len()
                        ),
                    ))
                } else {
                    Ok(())
                });
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(io::Error::other("read not submitted"))))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn reads_land_in_their_buffers_and_eof_is_an_error() {
        let Ok(u) = Uring::new(4) else {
            eprintln!("io_uring refused by this kernel: nothing to test");
            return;
        };
        let path = std::env::temp_dir().join(format!("tiermem-uring-{}", std::process::id()));
        let mut f = std::fs::File::create(&path).unwrap();
        let data: Vec<u8> = (0..64 * 1024).map(|i| (i * 7 % 251) as u8).collect();
        f.write_all(&data).unwrap();
        drop(f);
        let f = std::fs::File::open(&path).unwrap();
        let mut bufs: Vec<Vec<u8>> = (0..10).map(|_| vec![0u8; 4096]).collect();
        let offsets = [
            0u64, 8192, 4096, 61440, 12288, 0, 20480, 40960, 32768, 65536,
        ];
        let mut reqs: Vec<(u64, &mut [u8])> = offsets
            .iter()
            .zip(bufs.iter_mut())
            .map(|(&o, b)| (o, b.as_mut_slice()))
            .collect();
        let res = u.read_all(f.as_raw_fd(), &mut reqs);
        for (k, r) in res.iter().enumerate().take(9) {
            assert!(r.is_ok(), "request {k}: {r:?}");
            let o = offsets[k] as usize;
            assert_eq!(bufs[k], data[o..o + 4096], "request {k}");
        }
        assert_eq!(
            res[9].as_ref().unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        std::fs::remove_file(path).ok();
    }
}
