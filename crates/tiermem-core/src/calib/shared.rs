//! One DRAM measurement for the processes that start together on a machine (the ranks of a
//! distributed job, the processes a command or a test suite starts): they probe one at a time
//! under a file lock, and a process that finds a measurement taken on this machine in the last
//! [`FRESH`] uses it instead of probing again. Ranks that each probed at once measured each
//! other's traffic and scaled their emulated devices to different, lower figures.
//!
//! The lock (`dram-probe-BOOT.lock`) and the measurement (`dram-probe-BOOT.json`) sit beside
//! the calibration file, named by the kernel's boot id, so machines sharing a home folder
//! never share figures or wait for each other. Nothing here is ever an error: without the
//! folder, the boot id or the lock, the process measures on its own, as it did before.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::DramFigures;

/// How long a measurement serves the processes that start after it.
pub const FRESH: Duration = Duration::from_secs(60);

/// The `source` of figures another process measured (see [`DramFigures::source`]).
pub const SHARED: &str = "shared";

/// What `dram-probe-BOOT.json` holds.
#[derive(Debug, Serialize, Deserialize)]
struct Measurement {
    boot_id: String,
    /// When it was measured, seconds since the Unix epoch.
    measured_at: f64,
    pid: u32,
    dram: DramFigures,
}

/// This machine's figures: a fresh measurement another process left, else `measure()`'s,
/// left for the next process when they are usable (`Ok`).
pub fn figures(
    folder: &Path,
    measure: impl FnOnce() -> Result<DramFigures, String>,
) -> Result<DramFigures, String> {
    figures_waiting(folder, lock_wait(), measure)
}

/// [`figures`], waiting at most `wait` for the probe lock.
fn figures_waiting(
    folder: &Path,
    wait: Duration,
    measure: impl FnOnce() -> Result<DramFigures, String>,
) -> Result<DramFigures, String> {
    let Some((boot, lock_path, json_path)) = paths(folder) else {
        return measure();
    };
    // Held until the end of this function: the next process reads what this one wrote.
    let _lock = match lock(&lock_path, wait) {
        Locked::Held(f) => f,
        Locked::Unavailable => return measure(),
        Locked::TimedOut => {
            // A stopped or stuck process holds it: measure without it, and say so.
            return measure().map(|f| DramFigures {
                source: ALONE.into(),
                ..f
            });
        }
    };
    let text = std::fs::read_to_string(&json_path).unwrap_or_default();
    if let Some(f) = usable(&text, &boot, now()) {
        return Ok(f);
    }
    let f = measure()?;
    let m = Measurement {
        boot_id: boot,
        measured_at: now(),
        pid: std::process::id(),
        dram: f.clone(),
    };
    if let Ok(bytes) = serde_json::to_vec_pretty(&m) {
        // A failed write costs the next process a probe, nothing else.
        let _ = write_replace(&json_path, &bytes);
    }
    Ok(f)
}

/// The figures in `text` if it is a measurement of boot `boot` at most [`FRESH`] before `now`
/// (seconds since the epoch) whose figures are within physical bounds.
fn usable(text: &str, boot: &str, now: f64) -> Option<DramFigures> {
    let m: Measurement = serde_json::from_str(text).ok()?;
    let age = now - m.measured_at;
    let fresh = (0.0..=FRESH.as_secs_f64()).contains(&age);
    if m.boot_id != boot || !fresh || m.dram.validate().is_err() {
        return None;
    }
    Some(DramFigures {
        source: SHARED.into(),
        ..m.dram
    })
}

/// This boot's id and the lock's and the measurement's paths in `folder`, created (owner only)
/// if needed; `None` without a boot id, or when the folder is not this user's or anyone may
/// write in it (another user could plant figures).
fn paths(folder: &Path) -> Option<(String, PathBuf, PathBuf)> {
    let boot = boot_id()?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(folder)
        .ok()?;
    let meta = std::fs::metadata(folder).ok()?;
    let me = std::fs::metadata("/proc/self").ok()?.uid();
    if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o002 != 0 {
        return None;
    }
    let (lock, json) = (
        folder.join(format!("dram-probe-{boot}.lock")),
        folder.join(format!("dram-probe-{boot}.json")),
    );
    Some((boot, lock, json))
}

/// The kernel's id of this boot of this machine (the same in every container on it).
fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let id = id.trim();
    let ok = !id.is_empty() && id.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    ok.then(|| id.to_owned())
}

/// The `source` of figures measured without the probe lock, after another process held it
/// longer than [`lock_wait`] (a stopped process, or a stuck one).
pub const ALONE: &str = "alone";

/// How long a process waits for the probe lock: `TIERMEM_PROBE_WAIT` seconds, else 20 (a
/// probe takes about a second; ranks starting together queue for it).
#[must_use]
pub fn lock_wait() -> Duration {
    std::env::var("TIERMEM_PROBE_WAIT")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0 && *s <= 3600.0)
        .map_or(Duration::from_secs(20), Duration::from_secs_f64)
}

enum Locked {
    Held(File),
    /// The file cannot be opened or locked at all.
    Unavailable,
    /// Another process held it for the whole wait.
    TimedOut,
}

/// `path` opened (never through a symbolic link) and locked exclusively, waiting at most
/// `wait` for the process that holds it.
fn lock(path: &Path, wait: Duration) -> Locked {
    use crate::sys::files;
    let f = match files::open_existing(path, true, 0) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            match files::create(
                path,
                files::Create {
                    read: false,
                    flags: 0,
                    mode: 0o600,
                },
            )
            .or_else(|_| files::open_existing(path, true, 0))
            {
                Ok(f) => f,
                Err(_) => return Locked::Unavailable,
            }
        }
        Err(_) => return Locked::Unavailable,
    };
    let start = std::time::Instant::now();
    loop {
        match f.try_lock() {
            Ok(()) => return Locked::Held(f),
            Err(std::fs::TryLockError::WouldBlock) if start.elapsed() < wait => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(std::fs::TryLockError::WouldBlock) => return Locked::TimedOut,
            Err(std::fs::TryLockError::Error(_)) => return Locked::Unavailable,
        }
    }
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Write `bytes` to a temporary name beside `path`, fsync, rename over `path`, fsync the
/// folder: a reader sees the old file or the new one, never a torn one.
fn write_replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use crate::sys::files;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let result = (|| {
        let how = files::Create {
            read: false,
            flags: 0,
            mode: 0o600,
        };
        let mut f = files::create_aside(&tmp, how)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        files::rename_over(&tmp, path, files::Replace::Regular)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_held_past_the_wait_is_measured_alone_and_said() {
        let dir = std::env::temp_dir().join(format!("tiermem-probe-wait-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (_, lock_path, _) = paths(&dir).expect("a boot id and a private folder");
        let holder = File::create(&lock_path).unwrap();
        holder.lock().unwrap(); // another "process" (another open file) holds it
        let t = std::time::Instant::now();
        let f = figures_waiting(&dir, Duration::from_millis(200), || Ok(fig(20.0))).unwrap();
        assert_eq!(f.source, ALONE);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        drop(holder);
        let f = figures_waiting(&dir, Duration::from_millis(200), || Ok(fig(21.0))).unwrap();
        assert_ne!(f.source, ALONE);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn fig(read: f64) -> DramFigures {
        DramFigures {
            read_gbps: read,
            write_gbps: 30.0,
            copy_gbps: 15.0,
            latency_ns: 100.0,
            source: crate::calib::MEASURED.into(),
        }
    }

    fn text(boot: &str, at: f64, read: f64) -> String {
        let m = Measurement {
            boot_id: boot.into(),
            measured_at: at,
            pid: 1,
            dram: fig(read),
        };
        serde_json::to_string(&m).unwrap()
    }

    #[test]
    fn only_a_fresh_measurement_of_this_boot_is_used() {
        let t = text("b", 1000.0, 22.0);
        let f = usable(&t, "b", 1030.0).unwrap();
        assert_eq!((f.read_gbps, f.source.as_str()), (22.0, SHARED));
        assert!(
            usable(&t, "b", 1000.0 + FRESH.as_secs_f64() + 1.0).is_none(),
            "stale"
        );
        assert!(usable(&t, "b", 990.0).is_none(), "from the future");
        assert!(usable(&t, "other", 1030.0).is_none(), "another boot");
        assert!(
            usable(&text("b", 1000.0, 0.0), "b", 1030.0).is_none(),
            "bad figures"
        );
        assert!(usable("{not json", "b", 1030.0).is_none());
        assert!(usable("", "b", 1030.0).is_none());
    }

    #[test]
    fn the_second_process_reads_what_the_first_measured() {
        let dir = std::env::temp_dir().join(format!("tiermem-shared-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // A figure whose shortest decimal form reads back one ulp off without exact parsing.
        let read = 13.198_866_125_239_789;
        let first = figures(&dir, || Ok(fig(read))).unwrap();
        let second = figures(&dir, || Ok(fig(99.0))).unwrap();
        assert_eq!(first.source, crate::calib::MEASURED);
        if boot_id().is_some() {
            assert_eq!(
                (second.read_gbps.to_bits(), second.source.as_str()),
                (read.to_bits(), SHARED)
            );
        }
        // A failed measurement is not left for anyone.
        let dir2 = dir.join("failed");
        assert!(figures(&dir2, || Err("no".into())).is_err());
        assert_eq!(figures(&dir2, || Ok(fig(23.0))).unwrap().read_gbps, 23.0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
