//! How bytes go from one kind of device to another: one route per (source reach,
//! destination reach) pair ([`Reach`]), looked up in [`ROUTES`]. A kind of memory the CPU
//! cannot load (an accelerator's) adds its routes here and nothing else in the engine.

use super::{CopyEngine, Plan};
use crate::device::{Device, Reach};
use crate::{Error, Result};

/// One end of a copy: a device and a byte offset in it.
#[derive(Clone, Copy)]
pub(super) struct End<'a> {
    pub dev: &'a Device,
    pub off: u64,
}

impl End<'_> {
    /// The host address of this end; an error on a device the CPU cannot load (a route
    /// table naming the wrong reach).
    fn host(&self) -> Result<*mut u8> {
        self.dev.addr(self.off).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "copy route: device '{}' has no host address at offset {}",
                self.dev.name, self.off
            ))
        })
    }
}

type Run = fn(&CopyEngine, End<'_>, End<'_>, usize, &Plan) -> Result<()>;

/// A copy route: from, to, what it is called, and how it runs.
pub(super) struct Route {
    pub from: Reach,
    pub to: Reach,
    pub name: &'static str,
    pub run: Run,
}

/// Every route the engine knows.
pub(super) const ROUTES: &[Route] = &[
    Route {
        from: Reach::Host,
        to: Reach::Host,
        name: "memory copy",
        run: |e, s, d, n, plan| {
            e.copy_memory(
                d.host()?,
                s.host()?,
                n,
                plan.threads,
                n >= plan.nt_threshold,
            );
            Ok(())
        },
    },
    Route {
        from: Reach::Block,
        to: Reach::Host,
        name: "direct-I/O read",
        run: |e, s, d, n, plan| e.read_block(s.dev, s.off, d.host()?, n, plan.threads),
    },
    Route {
        from: Reach::Host,
        to: Reach::Block,
        name: "direct-I/O write",
        run: |e, s, d, n, plan| e.write_block(d.dev, d.off, s.host()?, n, plan.threads),
    },
    Route {
        from: Reach::Block,
        to: Reach::Block,
        name: "direct-I/O read, then write",
        run: |e, s, d, n, plan| e.block_to_block(s.dev, s.off, d.dev, d.off, n, plan.threads),
    },
];

/// The route from `from` to `to`.
pub(super) fn find(from: Reach, to: Reach) -> Result<&'static Route> {
    ROUTES
        .iter()
        .find(|r| r.from == from && r.to == to)
        .ok_or_else(|| Error::InvalidArgument(format!("no copy route from {from:?} to {to:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pair_of_reaches_has_exactly_one_route() {
        let all = [Reach::Host, Reach::Block];
        for from in all {
            for to in all {
                let n = ROUTES
                    .iter()
                    .filter(|r| r.from == from && r.to == to)
                    .count();
                assert_eq!(n, 1, "{from:?} -> {to:?}");
                assert!(!find(from, to).unwrap().name.is_empty());
            }
        }
    }
}
