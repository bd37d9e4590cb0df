//! Return codes and the thread-local message of the last failure: the one mapping from core
//! errors to C, and the guard every entry point runs its body in (a panic never crosses the
//! boundary: it becomes [`TmStatus::Panic`] with its message).

use std::cell::RefCell;
use std::ffi::{c_char, CString};

use tiermem_core::Error;

/// What a call did. `TM_OK` is zero; every failure leaves a message for [`tm_last_error`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TmStatus {
    /// Success.
    TmOk = 0,
    /// A bad argument (a null pointer, an unknown name, a size of zero, ...).
    TmInvalidArgument = 1,
    /// A device spec names no device this machine has.
    TmUnknownDevice = 2,
    /// No room: the device (and every fallback) is full.
    TmDeviceFull = 3,
    /// The object is pinned (an open `tm_pin`), so it cannot be moved or freed now.
    TmPinned = 4,
    /// No such object (freed, or never allocated).
    TmNoSuchObject = 5,
    /// An I/O error of a device's file.
    TmIo = 6,
    /// A guard misused (unpinned twice, an unknown ticket).
    TmGuard = 7,
    /// A previous call panicked midway: the manager refuses every call.
    TmPoisoned = 8,
    /// A file tiermem reads is damaged.
    TmCorrupt = 9,
    /// A panic inside tiermem (a bug): caught at the boundary.
    TmPanic = 10,
    /// Any other failure.
    TmOther = 11,
}

thread_local! {
    static LAST: RefCell<Option<CString>> = const { RefCell::new(None) };
}

pub(crate) fn set_last(msg: String) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = Some(c));
}

pub(crate) fn status_of(e: &Error) -> TmStatus {
    match e {
        Error::InvalidArgument(_) | Error::IndexOutOfRange { .. } | Error::LockOrder(_) => {
            TmStatus::TmInvalidArgument
        }
        Error::UnknownDevice(_) => TmStatus::TmUnknownDevice,
        Error::DeviceFull { .. } => TmStatus::TmDeviceFull,
        Error::Pinned { .. } | Error::AllPinned { .. } => TmStatus::TmPinned,
        Error::NoSuchObject(_) => TmStatus::TmNoSuchObject,
        Error::Io { .. } => TmStatus::TmIo,
        Error::Guard(_) => TmStatus::TmGuard,
        Error::Poisoned(_) => TmStatus::TmPoisoned,
        Error::Corrupt { .. } => TmStatus::TmCorrupt,
        _ => TmStatus::TmOther,
    }
}

/// Run an entry point's body: its error becomes a status and the thread's last message, a
/// panic becomes [`TmStatus::TmPanic`].
pub(crate) fn guard(body: impl FnOnce() -> tiermem_core::Result<()>) -> TmStatus {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => TmStatus::TmOk,
        Ok(Err(e)) => {
            let s = status_of(&e);
            set_last(e.to_string());
            s
        }
        Err(p) => {
            set_last(panic_message(p.as_ref()));
            TmStatus::TmPanic
        }
    }
}

/// The message left for a panic caught at the boundary.
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into());
    format!("tiermem panicked (a bug; please report it): {what}")
}

/// The message of this thread's last failed call, or NULL if none failed. Valid until this
/// thread's next failing call; owned by tiermem (do not free it).
#[no_mangle]
pub extern "C" fn tm_last_error() -> *const c_char {
    LAST.with(|l| l.borrow().as_ref().map_or(std::ptr::null(), |c| c.as_ptr()))
}

/// A short name of `status` (`"TM_DEVICE_FULL"`, ...); a static string.
#[no_mangle]
pub extern "C" fn tm_status_name(status: TmStatus) -> *const c_char {
    let s: &'static [u8] = match status {
        TmStatus::TmOk => b"TM_OK\0",
        TmStatus::TmInvalidArgument => b"TM_INVALID_ARGUMENT\0",
        TmStatus::TmUnknownDevice => b"TM_UNKNOWN_DEVICE\0",
        TmStatus::TmDeviceFull => b"TM_DEVICE_FULL\0",
        TmStatus::TmPinned => b"TM_PINNED\0",
        TmStatus::TmNoSuchObject => b"TM_NO_SUCH_OBJECT\0",
        TmStatus::TmIo => b"TM_IO\0",
        TmStatus::TmGuard => b"TM_GUARD\0",
        TmStatus::TmPoisoned => b"TM_POISONED\0",
        TmStatus::TmCorrupt => b"TM_CORRUPT\0",
        TmStatus::TmPanic => b"TM_PANIC\0",
        TmStatus::TmOther => b"TM_OTHER\0",
    };
    s.as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        // SAFETY: tm_last_error returns NULL or a live NUL-terminated string of this thread.
        unsafe { CStr::from_ptr(tm_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn errors_and_panics_become_statuses_with_messages() {
        let s = guard(|| Err(Error::NoSuchObject(42)));
        assert_eq!(s, TmStatus::TmNoSuchObject);
        assert!(last().contains("42"), "{}", last());
        let s = guard(|| panic!("boom"));
        assert_eq!(s, TmStatus::TmPanic);
        assert!(last().contains("boom"));
        assert_eq!(guard(|| Ok(())), TmStatus::TmOk);
    }
}
