//! Batched entry points for one kernel run outside tiermem (a tiered-tensor op): one call
//! opens every guard and allocates every output, one call charges, closes and soft-evicts.
//! Each takes the manager lock once, so an op crosses into the core twice, whatever its
//! operand count, and a plan's moves around the op ride on the same two calls.

use super::trace::{TraceCounts, TraceFollower, TraceOp};
use super::{GuardTicket, Manager, Use};
use crate::mechanism::{DataManager, GuardUse, ObjectId, Place};
use crate::policy::Policy;
use crate::{Error, Result};

/// What one op asks of [`Manager::op_open`].
#[derive(Debug, Clone, Copy, Default)]
pub struct OpRequest<'a> {
    /// Each input and how the op uses it.
    pub inputs: &'a [(ObjectId, GuardUse)],
    /// Each output's length in bytes.
    pub outputs: &'a [u64],
    /// Where the outputs go: one place for all, or one per output.
    pub places: &'a [Place],
    /// Heap offsets, one per output (a policy that follows a plan's offsets), or none.
    pub offsets: &'a [Option<u64>],
    /// Make the outputs before the inputs' guards open (a policy that brings inputs into
    /// fast memory then cannot evict the outputs to make room), else after (making room for
    /// outputs cannot evict this op's pinned inputs).
    pub outputs_first: bool,
    /// A plan's moves done first, before any guard opens.
    pub moves: Moves<'a>,
    /// The op's place in the iteration, for the trace follower (see `trace.rs`; ignored
    /// when none follows).
    pub trace: Option<TraceOp>,
}

/// A plan's moves around one kernel: each of `evict` leaves fast memory, then each of
/// `prefetch` (`(object, heap offset or None)`) is offered to the policy's planned prefetch.
#[derive(Debug, Clone, Copy, Default)]
pub struct Moves<'a> {
    /// Objects to bring into fast memory, each at a heap offset or anywhere it fits.
    pub prefetch: &'a [(ObjectId, Option<u64>)],
    /// Objects to move out of fast memory.
    pub evict: &'a [ObjectId],
}

/// How a batch of [`Moves`] inside an op went: objects of `prefetch` not in fast memory
/// afterwards (no room), and moves refused (an object pinned or freed meanwhile; the rest
/// still run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MovesDone {
    /// Prefetched objects that are not in fast memory afterwards.
    pub missed: usize,
    /// Moves refused, each counted once.
    pub refused: usize,
}

/// What [`Manager::op_open`] opened: guards on the inputs, in the order given, then on the
/// new outputs. Pair with [`Manager::op_close`] (every ticket).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenOp {
    /// A ticket per input, then per output.
    pub tickets: Vec<GuardTicket>,
    /// The address of each guard's bytes, in the same order.
    pub addrs: Vec<usize>,
    /// The new outputs' object ids.
    pub outputs: Vec<ObjectId>,
    /// How the request's moves went.
    pub moves: MovesDone,
}

fn evict_one(m: &mut DataManager, p: &mut dyn Policy, id: ObjectId) -> Result<()> {
    m.ensure_unpinned(id, "evict")?;
    p.evict(m, id)
}

/// Prefetch one object; whether it is in fast memory afterwards.
fn prefetch_one(
    m: &mut DataManager,
    p: &mut dyn Policy,
    id: ObjectId,
    at: Option<u64>,
) -> Result<bool> {
    m.object(id)?;
    p.prefetch_at(m, id, at)?;
    Ok(m.device_of(m.primary(id)?)? == 0)
}

/// Every move of `moves`, each refusal counted and the rest still run.
fn apply_moves(m: &mut DataManager, p: &mut dyn Policy, moves: Moves<'_>) -> MovesDone {
    let mut done = MovesDone::default();
    for &id in moves.evict {
        done.refused += usize::from(evict_one(m, p, id).is_err());
    }
    for &(id, at) in moves.prefetch {
        match prefetch_one(m, p, id, at) {
            Ok(landed) => done.missed += usize::from(!landed),
            Err(_) => done.refused += 1,
        }
    }
    done
}

impl Manager {
    /// Run the request's [`Moves`] (each refusal counted, the rest still run), then open a
    /// guard on every input and allocate every output where the request says and open an
    /// overwrite guard on it (see [`OpRequest`]). All or nothing for the guards and outputs:
    /// on failure every guard opened here is closed and every output freed, and the error
    /// is returned (the moves stay done: each is a whole move).
    pub fn op_open(&self, req: &OpRequest<'_>) -> Result<OpenOp> {
        let OpRequest {
            inputs,
            outputs,
            places,
            offsets,
            outputs_first,
            moves,
            trace,
        } = *req;
        if let Some(&b) = outputs.iter().find(|&&b| b == 0) {
            crate::bail!("cannot allocate an op output of {b} bytes");
        }
        crate::ensure!(
            places.len() == 1 || places.len() == outputs.len(),
            "op_open: {} places for {} outputs (give one for all, or one each)",
            places.len(),
            outputs.len()
        );
        crate::ensure!(
            offsets.is_empty() || offsets.len() == outputs.len(),
            "op_open: {} offsets for {} outputs (give none, or one each)",
            offsets.len(),
            outputs.len()
        );
        let want = (outputs, places, offsets);
        self.with_inner(|i| {
            let mut open = OpenOp {
                tickets: Vec::with_capacity(inputs.len() + outputs.len()),
                addrs: Vec::with_capacity(inputs.len() + outputs.len()),
                outputs: Vec::with_capacity(outputs.len()),
                moves: apply_moves(&mut i.data, i.policy.as_mut(), moves),
            };
            let mut in_open = Vec::with_capacity(inputs.len());
            let mut out_open = Vec::with_capacity(outputs.len());
            let r = (|| {
                if outputs_first {
                    Self::make_outputs(i, want, &mut open.outputs, &mut out_open)?;
                }
                for &(id, how) in inputs {
                    in_open.push(Self::open_inner(i, id, how)?);
                }
                if !outputs_first {
                    Self::make_outputs(i, want, &mut open.outputs, &mut out_open)?;
                }
                Ok(())
            })();
            if let Err(e) = r {
                for &(t, _) in in_open.iter().chain(&out_open) {
                    // Rollback of what this call opened: each ticket is open and ours.
                    let _ = Self::close_inner(i, t);
                }
                for &id in &open.outputs {
                    let _ = i.policy.unsafe_free(&mut i.data, id);
                }
                return Err(e);
            }
            for (t, a) in in_open.into_iter().chain(out_open) {
                open.tickets.push(t);
                open.addrs.push(a as usize);
            }
            if let (Some(op), Some(f)) = (trace, i.follower.as_mut()) {
                let ids: Vec<ObjectId> = inputs.iter().map(|&(id, _)| id).collect();
                let data = &i.data;
                let fast = |id| {
                    data.primary(id)
                        .and_then(|r| data.device_of(r))
                        .is_ok_and(|d| d == 0)
                };
                f.op_start(op, &ids, fast);
                for (k, &id) in open.outputs.iter().enumerate() {
                    f.made(op.pos, k as u32, id);
                }
            }
            Ok(open)
        })
    }

    /// A plan's moves around one kernel, under one lock: each object of `evict` leaves fast
    /// memory (a no-op for one already slower; an error for a pinned one), then each of
    /// `prefetch` (`(object, heap offset or None)`) is offered to the policy's planned
    /// prefetch (the `planned` policy copies it into fast memory at that offset, or anywhere
    /// it fits, evicting nothing). Returns how many of `prefetch` are not in
    /// fast memory afterwards.
    pub fn plan_moves(
        &self,
        prefetch: &[(ObjectId, Option<u64>)],
        evict: &[ObjectId],
    ) -> Result<usize> {
        self.with(|m, p| {
            for &id in evict {
                evict_one(m, p, id)?;
            }
            let mut missed = 0;
            for &(id, at) in prefetch {
                missed += usize::from(!prefetch_one(m, p, id, at)?);
            }
            Ok(missed)
        })
    }

    /// Allocate and open each output of `(bytes, places, offsets)` (see [`Manager::op_open`]).
    fn make_outputs(
        i: &mut super::Inner,
        (outputs, places, offsets): (&[u64], &[Place], &[Option<u64>]),
        made: &mut Vec<ObjectId>,
        opened: &mut Vec<(GuardTicket, *mut u8)>,
    ) -> Result<()> {
        for (k, &bytes) in outputs.iter().enumerate() {
            let place = places[if places.len() == 1 { 0 } else { k }];
            let at = offsets.get(k).copied().flatten();
            let id = i.policy.alloc_at(&mut i.data, bytes, place, at)?;
            made.push(id);
            opened.push(Self::open_inner(i, id, GuardUse::Overwrite)?);
        }
        Ok(())
    }

    /// Charge the op's operands (as [`Manager::charge`]), close every ticket (as
    /// [`Manager::close`]), soft-evict `softevict` (as [`Manager::softevict`]; but those the
    /// trace follower keeps for the next ops) and evict
    /// `evict` (a plan's evictions after the op; a refused one is counted, the rest still
    /// run), under one lock. Every ticket is closed even if an earlier one fails; the first
    /// error is returned. Returns the evictions refused. The emulated time charged is waited
    /// out after the lock is released.
    pub fn op_close(
        &self,
        tickets: &[GuardTicket],
        charges: &[(ObjectId, u64, u64)],
        threads: usize,
        softevict: &[ObjectId],
        evict: &[ObjectId],
    ) -> Result<usize> {
        let mut per_device = vec![(0u64, 0u64, 0u64); self.devices.len()];
        let (charges_operands, result) = self.with_inner(|i| {
            let mut first: Option<Error> = None;
            let charges_operands = i.policy.charges_operands();
            if charges_operands {
                for &(id, read, written) in charges {
                    match i.data.primary(id).and_then(|r| i.data.device_of(r)) {
                        Ok(d) => {
                            per_device[d].0 += read;
                            per_device[d].2 += written;
                        }
                        Err(e) => {
                            first.get_or_insert(e);
                        }
                    }
                }
            }
            for &t in tickets {
                if let Err(e) = Self::close_inner(i, t) {
                    first.get_or_insert(e);
                }
            }
            let mut refused = 0;
            if first.is_none() {
                for &id in softevict {
                    if i.follower.as_ref().is_some_and(|f| f.keeps(id)) {
                        continue; // the next ops read it: it stays (see `trace.rs`)
                    }
                    if let Err(e) = i.policy.softevict(&mut i.data, id) {
                        first.get_or_insert(e);
                    }
                    if let Some(f) = i.follower.as_mut() {
                        let data = &i.data;
                        if let Ok(o) = data.object(id) {
                            f.softevicted(id, o.len, |old| data.object(old).is_ok());
                        }
                    }
                }
                let moves = Moves {
                    prefetch: &[],
                    evict,
                };
                refused = apply_moves(&mut i.data, i.policy.as_mut(), moves).refused;
            }
            Ok((charges_operands, first.map_or(Ok(refused), Err)))
        })?;
        if charges_operands {
            self.charge_devices(&per_device, threads);
        }
        result
    }

    /// One guard opened under the lock (the body of [`Manager::open_for`]).
    pub(super) fn open_inner(
        i: &mut super::Inner,
        id: ObjectId,
        how: GuardUse,
    ) -> Result<(GuardTicket, *mut u8)> {
        let write = how != GuardUse::Read;
        let (m, p) = (&mut i.data, i.policy.as_mut());
        let (pins, writer, guards) = {
            let o = m.object(id)?;
            (o.pins, o.writer, o.pins - o.held)
        };
        if writer || (write && guards > 0) {
            // Fails with a clear error before the policy moves anything.
            m.pin(id, write)?;
        }
        if pins == 0 {
            p.before_access(m, id, write)?;
        }
        let r = m.primary(id)?;
        let Some(addr) = m.address(r)? else {
            return Err(Error::Guard(format!(
                "object {id} is on '{}', which is not byte-addressable, and policy '{}' did \
                 not bring it to memory",
                m.devices()[m.device_of(r)?].name,
                p.name()
            )));
        };
        m.pin(id, write)?;
        Ok((i.issue(id, Use::Guard(how), addr as usize), addr))
    }

    /// One ticket closed under the lock (the body of [`Manager::close`]).
    pub(super) fn close_inner(i: &mut super::Inner, ticket: GuardTicket) -> Result<()> {
        let (id, use_, _) = Self::take_ticket(i, ticket)?;
        let (m, p) = (&mut i.data, i.policy.as_mut());
        let Use::Guard(how) = use_ else {
            return m.release(id);
        };
        m.unpin(id)?;
        Self::record_use(m, p, id, how)
    }
}

impl Manager {
    /// Follow the trace of the ops that tell their place ([`OpRequest::trace`]) with
    /// `follower`, or stop following (None). Returns what the follower replaced had done.
    pub fn follow_trace(&self, follower: Option<TraceFollower>) -> Result<Option<TraceCounts>> {
        self.with_inner(|i| Ok(std::mem::replace(&mut i.follower, follower).map(|f| f.counts())))
    }

    /// An iteration starts for the trace follower (nothing without one).
    pub fn trace_iteration(&self) -> Result<()> {
        self.with_inner(|i| {
            if let Some(f) = i.follower.as_mut() {
                f.iteration();
            }
            Ok(())
        })
    }

    /// Object `id`, made outside [`Manager::op_open`], is output `k` of the op at `pos`
    /// (for the trace follower; nothing without one).
    pub fn trace_made(&self, pos: u32, k: u32, id: ObjectId) -> Result<()> {
        self.with_inner(|i| {
            if let Some(f) = i.follower.as_mut() {
                f.made(pos, k, id);
            }
            Ok(())
        })
    }

    /// What the trace follower has done so far, if one follows.
    pub fn trace_counts(&self) -> Result<Option<TraceCounts>> {
        self.with_inner(|i| Ok(i.follower.as_ref().map(TraceFollower::counts)))
    }
}
