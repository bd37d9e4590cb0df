//! The core's one error type. Every variant names what failed and the numbers involved;
//! the binding maps each variant once to a Python exception class.

use std::io;

/// Result alias used throughout the core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the core.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A caller passed a value that can never be valid (zero size, bad spec, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A device spec names a kind, profile or node that does not exist here.
    #[error("unknown device: {0}")]
    UnknownDevice(String),

    /// A device has no contiguous free span large enough.
    #[error(
        "device '{device}' is full: requested {requested} bytes, {free} bytes free \
         (largest contiguous {largest} bytes, capacity {capacity})"
    )]
    DeviceFull {
        /// Device name.
        device: String,
        /// Bytes asked for.
        requested: u64,
        /// Bytes free in total.
        free: u64,
        /// Largest contiguous free span.
        largest: u64,
        /// Device capacity.
        capacity: u64,
    },

    /// The operation would move, evict or free an object that a guard holds.
    #[error(
        "object {object} is pinned by {pins} open guard(s) and {held} hold(s) (a hold is a view \
         derived inside a guard that outlived it: drop such views to release the object); \
         {action} refused"
    )]
    Pinned {
        /// Object id.
        object: u64,
        /// Number of open guards.
        pins: u32,
        /// Number of holds (views that outlived their guard).
        held: u32,
        /// What was refused.
        action: &'static str,
    },

    /// A forced operation needed to evict data, but everything in the way is pinned.
    #[error(
        "cannot make {requested} contiguous bytes free on '{device}': every candidate region \
         is pinned ({pinned_bytes} bytes pinned, capacity {capacity})"
    )]
    AllPinned {
        /// Device name.
        device: String,
        /// Bytes asked for.
        requested: u64,
        /// Bytes held by pinned objects.
        pinned_bytes: u64,
        /// Device capacity.
        capacity: u64,
    },

    /// No object with this id (never existed or already freed).
    #[error("no object with id {0} (freed or never allocated)")]
    NoSuchObject(u64),

    /// An operating-system call on a device failed.
    #[error("I/O error on device '{device}' ({path}): {what}: {source}")]
    Io {
        /// Device name.
        device: String,
        /// Path or resource involved.
        path: String,
        /// What was being done.
        what: String,
        /// The OS error (keeps errno).
        #[source]
        source: io::Error,
    },

    /// An embedding lookup or update named a row the table does not have.
    #[error(
        "index out of range in table {table}: position {position} holds {value}, but the \
         table has {rows} rows (valid indices are 0..{rows})"
    )]
    IndexOutOfRange {
        /// Table number within the call (0 for a single table).
        table: usize,
        /// Position of the index in that table's `values`.
        position: usize,
        /// The offending index.
        value: i64,
        /// Rows in the table.
        rows: usize,
    },

    /// A guard's view was used after the guard closed, or a guard was misused.
    #[error("guard error: {0}")]
    Guard(String),

    /// A lock was requested where waiting for it could deadlock (see `lock_order`).
    #[error("lock order: {0}")]
    LockOrder(String),

    /// An earlier operation panicked midway; the manager (or table) refuses every later call
    /// rather than act on state it cannot vouch for.
    #[error("{0}")]
    Poisoned(String),

    /// A file tiermem keeps (an embedding table's block file) is not what it must be: a
    /// checksum mismatch, a truncated or foreign file, a header that contradicts itself.
    #[error("{path}: {what}")]
    Corrupt {
        /// The file.
        path: String,
        /// What is wrong, naming the table, block and numbers.
        what: String,
    },

    /// A policy (built-in or user-written) failed or broke a manager rule.
    #[error("policy '{policy}': {message}")]
    Policy {
        /// Policy name.
        policy: String,
        /// What went wrong.
        message: String,
    },
}

impl Error {
    /// Build an [`Error::Io`] from an `io::Error`.
    pub fn io(device: &str, path: &str, what: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            device: device.to_owned(),
            path: path.to_owned(),
            what: what.into(),
            source,
        }
    }
}

/// Return early with [`Error::InvalidArgument`] built from a format string.
#[macro_export]
macro_rules! bail {
    ($($arg:tt)*) => { return Err($crate::Error::InvalidArgument(format!($($arg)*))) };
}

/// Return [`Error::InvalidArgument`] unless the condition holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => { if !$cond { $crate::bail!($($arg)*); } };
}
