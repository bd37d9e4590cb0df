//! tiermem's C ABI: `libtiermem.so` and `libtiermem.a`, declared in `include/tiermem.h`
//! (generated from these declarations by cbindgen in `build.rs`; a test checks the header
//! kept in the repository matches). Every entry point returns a [`TmStatus`] (errors and
//! panics alike; a panic never crosses the boundary) and leaves a message for
//! [`tm_last_error`]; no lock is held between calls, and a pin (`tm_pin`) holds no lock,
//! only the object in place.

pub mod h2m;
pub mod manager;
pub mod staging;
pub mod status;

pub use h2m::types::*;
pub use h2m::*;
pub use manager::*;
pub use staging::*;
pub use status::{tm_last_error, tm_status_name, TmStatus};

#[cfg(test)]
mod tests {
    /// The header kept in the repository (and installed) is the one the declarations give.
    #[test]
    fn header_is_current() {
        let generated = include_str!(concat!(env!("OUT_DIR"), "/tiermem.h"));
        let kept = include_str!("../include/tiermem.h");
        assert!(
            generated == kept,
            "include/tiermem.h is stale: copy the generated header over it (make capi-header)"
        );
    }
}
