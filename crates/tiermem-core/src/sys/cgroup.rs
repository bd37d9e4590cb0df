//! The memory limit of this process's control group (cgroup v2 and v1): inside a container
//! or a batch job's slice, the host's `MemAvailable` overstates what the process may use, and
//! going past the limit gets it killed by the OOM killer with no error to catch.

use std::fs;
use std::path::{Path, PathBuf};

/// What the process's memory cgroup allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMemory {
    /// The tightest limit on the way from the process's cgroup to the root, bytes.
    pub limit: u64,
    /// Bytes charged to the process's cgroup now.
    pub usage: u64,
    /// The cgroup whose limit is `limit` (its path under the hierarchy's root).
    pub path: String,
}

impl CgroupMemory {
    /// Bytes the cgroup can still charge.
    #[must_use]
    pub fn headroom(&self) -> u64 {
        self.limit.saturating_sub(self.usage)
    }
}

/// v1 writes "no limit" as a page-rounded `i64::MAX`; anything this large is no limit.
const UNLIMITED: u64 = 1 << 60;

/// This process's memory cgroup limit, if it has one.
#[must_use]
pub fn cgroup_memory() -> Option<CgroupMemory> {
    let own = fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_memory_from(&own, Path::new("/sys/fs/cgroup"))
}

/// As [`cgroup_memory`], from the text of `/proc/self/cgroup` and a cgroup file system root
/// (tests point it at fixtures). v2 (`0::/path`, files `memory.max`, `memory.current`, at the
/// root or under `unified/`) is read before v1 (`N:memory:/path`, `memory.limit_in_bytes`,
/// `memory.usage_in_bytes` under `memory/`).
#[must_use]
pub fn cgroup_memory_from(own: &str, root: &Path) -> Option<CgroupMemory> {
    let mut found: Vec<CgroupMemory> = Vec::new();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        if controllers.is_empty() {
            for base in [root.to_path_buf(), root.join("unified")] {
                if let Some(m) = walk(&base, rel, "memory.max", "memory.current") {
                    found.push(m);
                }
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            let base = root.join("memory");
            if let Some(m) = walk(&base, rel, "memory.limit_in_bytes", "memory.usage_in_bytes") {
                found.push(m);
            }
        }
    }
    found.into_iter().min_by_key(|m| m.limit)
}

/// The tightest limit from `base/rel` up to `base` (a namespaced process may see its own
/// cgroup as `/`, or its path may not exist under this mount: then the mount's root counts).
fn walk(base: &Path, rel: &str, limit_file: &str, usage_file: &str) -> Option<CgroupMemory> {
    let mut dir: PathBuf = base.join(rel);
    let mut best: Option<CgroupMemory> = None;
    let mut usage: Option<u64> = None;
    loop {
        if dir.starts_with(base) {
            if usage.is_none() {
                usage = read_u64(&dir.join(usage_file));
            }
            if let Some(limit) = read_u64(&dir.join(limit_file)).filter(|l| *l < UNLIMITED) {
                if best.as_ref().is_none_or(|b| limit < b.limit) {
                    let path = dir.strip_prefix(base).unwrap_or(&dir);
                    best = Some(CgroupMemory {
                        limit,
                        usage: 0,
                        path: format!("/{}", path.display()),
                    });
                }
            }
        }
        if dir == base || !dir.pop() {
            break;
        }
    }
    best.map(|mut b| {
        b.usage = usage.unwrap_or(0);
        b
    })
}

/// A number, or `None` for "max", a missing file or junk.
fn read_u64(p: &Path) -> Option<u64> {
    fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// Bytes of memory this process can still take, and what bounds them: the machine's
/// `MemAvailable`, or its memory cgroup's headroom when that is smaller.
#[must_use]
pub fn available_memory() -> (u64, String) {
    let host = super::discover::topology().mem_available;
    match cgroup_memory() {
        Some(cg) if host == 0 || cg.headroom() < host => (
            cg.headroom(),
            format!(
                "left under the memory limit of cgroup {} ({} of {} bytes in use)",
                cg.path, cg.usage, cg.limit
            ),
        ),
        _ => (host, "memory available on this machine".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(root: &Path, rel: &str, file: &str, text: &str) {
        let d = root.join(rel);
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join(file), text).unwrap();
    }

    #[test]
    fn v2_leaf_and_ancestor_limits() {
        let root = std::env::temp_dir().join(format!("tiermem-cg2-{}", std::process::id()));
        put(&root, "job/step", "memory.max", "max\n");
        put(&root, "job/step", "memory.current", "1000\n");
        put(&root, "job", "memory.max", "268435456\n");
        let m = cgroup_memory_from("0::/job/step\n", &root).unwrap();
        assert_eq!(
            (m.limit, m.usage, m.path.as_str()),
            (268_435_456, 1000, "/job")
        );
        assert_eq!(m.headroom(), 268_435_456 - 1000);
        assert!(cgroup_memory_from("0::/other\n", &root).is_none());
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn v1_memory_controller_and_unlimited() {
        let root = std::env::temp_dir().join(format!("tiermem-cg1-{}", std::process::id()));
        put(
            &root,
            "memory/docker/abc",
            "memory.limit_in_bytes",
            "536870912\n",
        );
        put(
            &root,
            "memory/docker/abc",
            "memory.usage_in_bytes",
            "4096\n",
        );
        put(
            &root,
            "memory",
            "memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        let own = "12:pids:/docker/abc\n4:memory:/docker/abc\n0::/\n";
        let m = cgroup_memory_from(own, &root).unwrap();
        assert_eq!((m.limit, m.usage), (536_870_912, 4096));
        put(
            &root,
            "memory/docker/abc",
            "memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        assert!(cgroup_memory_from(own, &root).is_none());
        fs::remove_dir_all(&root).unwrap();
    }
}
