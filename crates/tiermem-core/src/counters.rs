//! Per-device traffic and event counters, the software equivalent of the thesis's
//! memory-controller counters, plus an optional time-series recorder.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

/// Live counters of one device. All fields count since creation or the last reset.
#[derive(Debug, Default)]
pub struct DeviceCounters {
    /// Bytes read from the device by the copy engine and by tiermem kernels.
    pub bytes_read: AtomicU64,
    /// Bytes written to the device by the copy engine and by tiermem kernels.
    pub bytes_written: AtomicU64,
    /// Copies that brought an object's data into the device.
    pub moves_in: AtomicU64,
    /// Copies that took an object's data out of the device.
    pub moves_out: AtomicU64,
    /// Objects evicted from the device.
    pub evictions: AtomicU64,
    /// Evictions that wrote dirty data back to a slower device.
    pub dirty_writebacks: AtomicU64,
    /// Evictions that copied nothing because a current slower sibling existed.
    pub writebacks_elided: AtomicU64,
    /// Allocations the device could not satisfy.
    pub alloc_failures: AtomicU64,
    /// Nanoseconds an emulated device charged tiermem kernels past their run at DRAM speed:
    /// the extra time their traffic costs on it, as its model prices it (zero on a real
    /// device).
    pub kernel_stall_ns: AtomicU64,
}

/// A point-in-time copy of one device's counters (laid out as C lays it out: the C API
/// hands it over as `tm_counters`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct CounterSnapshot {
    /// Bytes read from the device by copies and by tiermem kernels and charged loops.
    pub bytes_read: u64,
    /// Bytes written to the device by copies and by tiermem kernels and charged loops.
    pub bytes_written: u64,
    /// Copies that brought an object's data into the device.
    pub moves_in: u64,
    /// Copies that took an object's data out of the device.
    pub moves_out: u64,
    /// Objects evicted from the device.
    pub evictions: u64,
    /// Evictions that wrote dirty data back to a slower device.
    pub dirty_writebacks: u64,
    /// Evictions that copied nothing because a current slower copy existed.
    pub writebacks_elided: u64,
    /// Allocations the device could not satisfy.
    pub alloc_failures: u64,
    /// Nanoseconds an emulated device charged kernels and loops past their run at DRAM speed.
    pub kernel_stall_ns: u64,
}

macro_rules! counter_fields {
    ($m:ident) => {
        $m!(
            bytes_read,
            bytes_written,
            moves_in,
            moves_out,
            evictions,
            dirty_writebacks,
            writebacks_elided,
            alloc_failures,
            kernel_stall_ns
        )
    };
}

impl DeviceCounters {
    /// Read every counter.
    #[must_use]
    pub fn snapshot(&self) -> CounterSnapshot {
        macro_rules! snap {
            ($($f:ident),*) => { CounterSnapshot { $($f: self.$f.load(Relaxed)),* } };
        }
        counter_fields!(snap)
    }

    /// Set every counter to zero.
    pub fn reset(&self) {
        macro_rules! zero {
            ($($f:ident),*) => { $(self.$f.store(0, Relaxed);)* };
        }
        counter_fields!(zero);
    }

    /// Count a read of `n` bytes.
    pub fn read(&self, n: u64) {
        self.bytes_read.fetch_add(n, Relaxed);
    }

    /// Count a write of `n` bytes.
    pub fn wrote(&self, n: u64) {
        self.bytes_written.fetch_add(n, Relaxed);
    }

    /// Count a stall an emulated device imposed on a kernel.
    pub fn stalled(&self, d: Duration) {
        self.kernel_stall_ns
            .fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Relaxed);
    }

    /// Add one to a counter.
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Relaxed);
    }
}

/// Counters of every device, by device name, as plain data (serialises to JSON).
pub type Snapshot = BTreeMap<String, CounterSnapshot>;

/// One sample of the time-series recorder.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds since recording started.
    pub t: f64,
    /// Bytes read per device during the interval.
    pub read: BTreeMap<String, u64>,
    /// Bytes written per device during the interval.
    pub written: BTreeMap<String, u64>,
}

/// Samples bytes read and written per device every interval on a background thread
/// (for traces like the thesis's Fig. 4.6 and 4.8).
pub struct Recorder {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    handle: Option<JoinHandle<()>>,
}

/// Shortest sampling interval (a shorter one would only measure the recorder itself).
pub const MIN_INTERVAL: Duration = Duration::from_millis(1);
/// Most samples kept: past it, neighbouring samples are merged in pairs and the interval
/// doubles, so a long recording stays bounded (about 100 MiB at most).
pub const MAX_SAMPLES: usize = 1 << 18;

/// Merge neighbouring samples in pairs (bytes add up; the later time stays).
fn halve(v: &mut Vec<Sample>) {
    let old = std::mem::take(v);
    let mut it = old.into_iter();
    while let Some(mut a) = it.next() {
        if let Some(b) = it.next() {
            for (k, x) in b.read {
                *a.read.entry(k).or_default() += x;
            }
            for (k, x) in b.written {
                *a.written.entry(k).or_default() += x;
            }
            a.t = b.t;
        }
        v.push(a);
    }
}

impl Recorder {
    /// Start sampling `devices` every `interval` (from [`MIN_INTERVAL`] to an hour).
    pub fn start(
        devices: Vec<(String, Arc<DeviceCounters>)>,
        interval: Duration,
    ) -> crate::Result<Self> {
        crate::ensure!(
            (MIN_INTERVAL..=Duration::from_secs(3600)).contains(&interval),
            "recording interval {interval:?}: it must be from {MIN_INTERVAL:?} to an hour"
        );
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (stop2, samples2) = (stop.clone(), samples.clone());
        // The starting point is taken here, not in the thread: traffic between `start`
        // returning and the thread running must land in the first sample.
        let t0 = Instant::now();
        let mut last: Vec<CounterSnapshot> = devices.iter().map(|(_, c)| c.snapshot()).collect();
        let handle = std::thread::Builder::new()
            .name("tiermem-recorder".into())
            .spawn(move || {
                let mut interval = interval;
                let mut next = t0 + interval;
                loop {
                    let stopping = stop2.load(Relaxed);
                    let now = Instant::now();
                    if now < next && !stopping {
                        std::thread::sleep((next - now).min(Duration::from_millis(5)));
                        continue;
                    }
                    // A late wake-up (a busy machine) skips the ticks it missed rather than
                    // catching up with a burst of empty samples.
                    next = (next + interval).max(now);
                    let mut s = Sample {
                        t: now.duration_since(t0).as_secs_f64(),
                        read: BTreeMap::new(),
                        written: BTreeMap::new(),
                    };
                    for ((name, c), prev) in devices.iter().zip(last.iter_mut()) {
                        let cur = c.snapshot();
                        s.read
                            .insert(name.clone(), cur.bytes_read.saturating_sub(prev.bytes_read));
                        s.written.insert(
                            name.clone(),
                            cur.bytes_written.saturating_sub(prev.bytes_written),
                        );
                        *prev = cur;
                    }
                    let mut all = samples2
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    all.push(s);
                    if all.len() >= MAX_SAMPLES {
                        halve(&mut all);
                        interval *= 2;
                    }
                    drop(all);
                    if stopping {
                        return;
                    }
                }
            })
            .expect("spawn recorder thread");
        Ok(Recorder {
            stop,
            samples,
            handle: Some(handle),
        })
    }

    /// Stop recording and return every sample (the last one covers the partial interval).
    #[must_use]
    pub fn finish(mut self) -> Vec<Sample> {
        self.stop_thread();
        std::mem::take(
            &mut *self
                .samples
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorder_sees_traffic_right_after_start_and_before_finish() {
        for _ in 0..50 {
            let c = Arc::new(DeviceCounters::default());
            let rec =
                Recorder::start(vec![("d".into(), c.clone())], Duration::from_millis(1)).unwrap();
            c.wrote(100); // before the thread may even run
            std::thread::sleep(Duration::from_millis(3));
            c.read(7);
            let samples = rec.finish();
            let written: u64 = samples.iter().map(|s| s.written["d"]).sum();
            let read: u64 = samples.iter().map(|s| s.read["d"]).sum();
            assert_eq!((written, read), (100, 7));
            assert!(samples.windows(2).all(|w| w[0].t <= w[1].t));
        }
    }

    #[test]
    fn snapshot_and_reset() {
        let c = DeviceCounters::default();
        c.read(5);
        DeviceCounters::bump(&c.evictions);
        let s = c.snapshot();
        assert_eq!((s.bytes_read, s.evictions), (5, 1));
        c.reset();
        assert_eq!(c.snapshot(), CounterSnapshot::default());
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains("\"bytes_read\":5"));
    }
}
