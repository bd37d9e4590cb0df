//! Placing and migrating a set of allocations by their traits (H2M's commit and migration
//! strategies): the order allocations claim the devices in, their placement, and moves when
//! traits change.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;

use super::choose::DeviceSpaces;
use super::set::{Fallback, Partition, Traits};
use crate::manager::Manager;
use crate::mechanism::moves::{evict_object, prefetch_object, relocate_object, Prefetched};
use crate::mechanism::{DataManager, ObjectId, Place};
use crate::policy::Policy;
use crate::{Error, Result};

/// The order in which allocations claim the devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// As declared (H2M's default).
    Fifo,
    /// Largest first.
    Size,
    /// Highest `priority` first, then largest.
    Priority,
    /// Highest measured `gain` per byte first (a knapsack's greedy order: the seconds the
    /// fast device saves per byte it gives), then as `priority`; allocations without a
    /// measured gain come after those with one.
    Gain,
}

impl Strategy {
    /// Every strategy's name, in this order.
    pub const NAMES: [&'static str; 4] = ["fifo", "size", "priority", "gain"];

    /// The strategy named `s`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the known strategies.
    pub fn parse(s: &str) -> Result<Strategy> {
        match s {
            "fifo" => Ok(Strategy::Fifo),
            "size" => Ok(Strategy::Size),
            "priority" => Ok(Strategy::Priority),
            "gain" => Ok(Strategy::Gain),
            _ => crate::bail!(
                "unknown commit strategy {s:?} (known: {})",
                Strategy::NAMES.join(", ")
            ),
        }
    }

    /// Indices of `items` (`(declaration number, bytes, traits)`) in claiming order.
    #[must_use]
    pub fn order(self, items: &[(u64, u64, &Traits)]) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..items.len()).collect();
        let prio = |i: usize| items[i].2.priority;
        let density = |i: usize| items[i].2.gain.map(|g| g / items[i].1.max(1) as f64);
        idx.sort_by(|&a, &b| {
            let (sa, sb) = (items[a].0, items[b].0);
            let (ba, bb) = (items[a].1, items[b].1);
            match self {
                Strategy::Fifo => sa.cmp(&sb),
                Strategy::Size => bb.cmp(&ba).then(sa.cmp(&sb)),
                Strategy::Priority => prio(b)
                    .total_cmp(&prio(a))
                    .then(bb.cmp(&ba))
                    .then(sa.cmp(&sb)),
                Strategy::Gain => {
                    let (ga, gb) = (density(a), density(b));
                    gb.is_some()
                        .cmp(&ga.is_some())
                        .then(gb.unwrap_or(0.0).total_cmp(&ga.unwrap_or(0.0)))
                        .then(prio(b).total_cmp(&prio(a)))
                        .then(bb.cmp(&ba))
                        .then(sa.cmp(&sb))
                }
            }
        });
        idx
    }
}

/// One object's move in a migration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Migration {
    /// The object.
    pub object: ObjectId,
    /// Its device before.
    pub from: usize,
    /// The device its traits chose.
    pub to: usize,
    /// Its device after (`to`, unless the move could not be made).
    pub now: usize,
    /// Why it is not on `to`, when it is not (pinned by an open guard, no contiguous room).
    pub note: Option<String>,
}

struct Entry {
    bytes: u64,
    traits: Traits,
    seq: u64,
}

#[derive(Default)]
struct Registry {
    objects: BTreeMap<ObjectId, Entry>,
    next: u64,
    /// Entries after the last sweep of freed objects.
    swept: usize,
}

impl Registry {
    /// Forget objects freed since (their ids are never reused), whenever the registry has
    /// doubled since the last sweep: amortised constant time per allocation.
    fn sweep(&mut self, m: &DataManager, now: bool) {
        if now || self.objects.len() >= 2 * self.swept.max(64) {
            self.objects.retain(|id, _| m.object(*id).is_ok());
            self.swept = self.objects.len();
        }
    }
}

/// A manager's allocations by traits: where each goes, and moves when traits change.
///
/// Lock order: the registry lock is taken only inside the manager lock (every method runs
/// in one `Manager::with_data` call), so it adds no edge a manager caller could deadlock on.
pub struct Traited {
    manager: Arc<Manager>,
    spaces: DeviceSpaces,
    registry: Mutex<Registry>,
    /// Moves keep no second copy ([`Traited::relocating`]).
    relocate: bool,
}

/// An allocation by traits here is one object in a device's pages: a partition over nodes
/// and pinned pages are refused by name (the C H2M interface has both).
fn whole(t: &Traits) -> Result<()> {
    if t.pinned {
        crate::bail!(
            "trait pinned=true locks an allocation's own pages, which only the C H2M interface \
             has (h2m_atk_mem_pinned); here objects share their device's pages"
        );
    }
    if t.partition != Partition::Nearest {
        crate::bail!(
            "trait partition={:?} needs an allocation made of parts, which only the C H2M \
             interface makes (h2m_atk_mem_partition); here an allocation is one object",
            t.partition
        );
    }
    Ok(())
}

fn room(m: &DataManager, d: usize, bytes: u64) -> bool {
    let h = m.heap(d);
    h.round(bytes).is_some_and(|b| h.largest_free() >= b)
}

fn device_now(m: &DataManager, id: ObjectId) -> Result<usize> {
    m.device_of(m.primary(id)?)
}

impl Traited {
    /// Allocation by traits on `manager`, its spaces mapped from its devices' traits.
    #[must_use]
    pub fn new(manager: Arc<Manager>) -> Traited {
        let devs = manager.devices();
        let spaces = DeviceSpaces::of(
            devs.iter().map(|d| d.name.clone()).collect(),
            &devs.iter().map(|d| d.traits()).collect::<Vec<_>>(),
        );
        Traited::with_spaces(manager, spaces)
    }

    /// Allocation by traits on `manager` with the spaces given (a manager whose devices
    /// stand for NUMA nodes takes them from the machine's space map, [`DeviceSpaces::of_nodes`]).
    #[must_use]
    pub fn with_spaces(manager: Arc<Manager>, spaces: DeviceSpaces) -> Traited {
        Traited {
            manager,
            spaces,
            registry: Mutex::new(Registry::default()),
            relocate: false,
        }
    }

    /// Migrations move each object whole to its new device and keep no copy behind
    /// ([`relocate_object`]): for objects written through addresses the manager does not
    /// guard, where a clean sibling left by a move could later stand in for newer bytes.
    #[must_use]
    pub fn relocating(mut self) -> Traited {
        self.relocate = true;
        self
    }

    /// The spaces over this manager's devices.
    #[must_use]
    pub fn spaces(&self) -> &DeviceSpaces {
        &self.spaces
    }

    /// Allocate `decls` (`(bytes, traits)`) in `strategy`'s order, each on its first
    /// candidate device with room. Returns `(object, device)` in declaration order. All or
    /// nothing: on an error every object this call made is freed again.
    ///
    /// # Errors
    /// Contradictory requirements with fallback `error` ([`Error::InvalidArgument`]); no
    /// allowed device with room ([`Error::DeviceFull`] naming the last device tried, or
    /// [`Error::InvalidArgument`] for fallback `error`, naming the spaces).
    pub fn commit(
        &self,
        decls: &[(u64, Traits)],
        strategy: Strategy,
    ) -> Result<Vec<(ObjectId, usize)>> {
        self.commit_in(decls, strategy, &self.spaces)
    }

    /// As [`Traited::commit`], trying devices in the order `spaces` gives (one source
    /// node's view of the spaces: the calling thread's nearest devices first).
    ///
    /// # Errors
    /// As [`Traited::commit`].
    pub fn commit_in(
        &self,
        decls: &[(u64, Traits)],
        strategy: Strategy,
        spaces: &DeviceSpaces,
    ) -> Result<Vec<(ObjectId, usize)>> {
        let mut cands = Vec::with_capacity(decls.len());
        for (bytes, t) in decls {
            if *bytes == 0 {
                crate::bail!("cannot allocate an object of zero bytes");
            }
            t.validate()?;
            whole(t)?;
            cands.push(spaces.candidates(t)?);
        }
        self.manager.with_data(|m, p| {
            let mut reg = self.registry.lock();
            reg.sweep(m, false);
            let base = reg.next;
            let items: Vec<(u64, u64, &Traits)> = decls
                .iter()
                .enumerate()
                .map(|(i, (b, t))| (base + i as u64, *b, t))
                .collect();
            let mut made: Vec<Option<(ObjectId, usize)>> = vec![None; decls.len()];
            for i in strategy.order(&items) {
                match self.place_one(m, p, decls[i].0, &decls[i].1, &cands[i]) {
                    Ok(x) => made[i] = Some(x),
                    Err(e) => {
                        for (id, _) in made.iter().flatten() {
                            p.unsafe_free(m, *id)?;
                        }
                        return Err(e);
                    }
                }
            }
            reg.next += decls.len() as u64;
            let out: Vec<(ObjectId, usize)> = made
                .into_iter()
                .map(|x| x.expect("every one placed"))
                .collect();
            for ((id, _), (i, (bytes, t))) in out.iter().zip(decls.iter().enumerate()) {
                reg.objects.insert(
                    *id,
                    Entry {
                        bytes: *bytes,
                        traits: t.clone(),
                        seq: base + i as u64,
                    },
                );
            }
            Ok(out)
        })
    }

    fn place_one(
        &self,
        m: &mut DataManager,
        p: &mut dyn Policy,
        bytes: u64,
        t: &Traits,
        cands: &[usize],
    ) -> Result<(ObjectId, usize)> {
        for &d in cands {
            if room(m, d, bytes) {
                let id = p.alloc(m, bytes, Place::Device(d))?;
                return Ok((id, device_now(m, id)?));
            }
        }
        // `next_best` candidates are every device, so only `error` can stop short of them.
        if t.fallback == Fallback::Error {
            let names: Vec<&str> = cands
                .iter()
                .map(|&d| self.spaces.names[d].as_str())
                .collect();
            crate::bail!(
                "no device the traits allow has room for {bytes} bytes (tried [{}]; fallback error)",
                names.join(", ")
            );
        }
        let last = cands.last().copied().unwrap_or(m.devices().len() - 1);
        Err(crate::mechanism::moves::full(m, last, bytes))
    }

    /// Record new traits for `id`; nothing moves until [`Traited::apply_migration`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for invalid traits, or an object not allocated by traits.
    pub fn update_traits(&self, id: ObjectId, traits: Traits) -> Result<()> {
        traits.validate()?;
        whole(&traits)?;
        self.spaces.candidates(&traits)?;
        self.manager.with_data(|m, _| {
            let mut reg = self.registry.lock();
            if m.object(id).is_err() {
                reg.objects.remove(&id);
            }
            let e = reg.objects.get_mut(&id).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "object {id} was not allocated with traits (or is freed)"
                ))
            })?;
            e.traits = traits;
            Ok(())
        })
    }

    /// The traits `id` was allocated or last updated with (None: not allocated by traits).
    ///
    /// # Errors
    /// Only the manager's own (a poisoned manager).
    pub fn traits_of(&self, id: ObjectId) -> Result<Option<Traits>> {
        self.manager.with_data(|_, _| {
            let reg = self.registry.lock();
            Ok(reg.objects.get(&id).map(|e| e.traits.clone()))
        })
    }

    /// Place again the objects in `only` (None: every object allocated by traits, as H2M's
    /// `h2m_apply_migration`) by their current traits, in `strategy`'s order, over the room the others leave, and move those whose device
    /// changes: first the moves to slower devices (they make room), then to faster ones.
    /// Objects freed meanwhile are forgotten. A move that cannot be made (an open guard
    /// pins the object; no contiguous room) leaves the object where it is, with a note.
    ///
    /// # Errors
    /// Only the manager's own (a poisoned manager); a single object's failure is a note.
    pub fn apply_migration(
        &self,
        only: Option<&[ObjectId]>,
        strategy: Strategy,
    ) -> Result<Vec<Migration>> {
        self.manager.with_data(|m, _| {
            let mut reg = self.registry.lock();
            reg.sweep(m, true);
            let chosen: Vec<ObjectId> = match only {
                Some(ids) => {
                    for id in ids {
                        if !reg.objects.contains_key(id) {
                            crate::bail!("object {id} was not allocated with traits (or is freed)");
                        }
                    }
                    ids.to_vec()
                }
                None => reg.objects.keys().copied().collect(),
            };
            // Room per device: free now plus what the chosen objects hold there.
            let n = m.devices().len();
            let mut free: Vec<u64> = (0..n).map(|d| m.heap(d).free_bytes()).collect();
            let mut from = BTreeMap::new();
            for id in &chosen {
                let d = device_now(m, *id)?;
                free[d] += m.heap(d).round(reg.objects[id].bytes).unwrap_or(0);
                from.insert(*id, d);
            }
            let items: Vec<(u64, u64, &Traits)> = chosen
                .iter()
                .map(|id| {
                    let e = &reg.objects[id];
                    (e.seq, e.bytes, &e.traits)
                })
                .collect();
            let mut to = BTreeMap::new();
            for i in strategy.order(&items) {
                let id = chosen[i];
                let (bytes, t) = (items[i].1, items[i].2);
                let cands = self
                    .spaces
                    .candidates(t)
                    .unwrap_or_else(|_| vec![from[&id]]);
                let d = cands
                    .iter()
                    .copied()
                    .find(|&d| m.heap(d).round(bytes).is_some_and(|b| free[d] >= b))
                    .unwrap_or(from[&id]);
                free[d] = free[d].saturating_sub(m.heap(d).round(bytes).unwrap_or(0));
                to.insert(id, d);
            }
            // Slower first: they make the room the faster moves need. A move between
            // devices of one speed (NUMA nodes) may wait for another to leave: passes repeat
            // while one makes progress, so a cycle of waits is the only thing left behind.
            let mut pending: Vec<ObjectId> = chosen
                .iter()
                .copied()
                .filter(|id| to[id] != from[id])
                .collect();
            pending.sort_by_key(|id| (to[id] < from[id], *id));
            let mut notes: BTreeMap<ObjectId, String> = BTreeMap::new();
            while !pending.is_empty() {
                let before = pending.len();
                let mut left = Vec::new();
                for id in pending {
                    let t = to[&id];
                    let moved = if self.relocate {
                        relocate(m, id, t)
                    } else {
                        move_to(m, id, t)
                    };
                    if let Err(e) = moved {
                        notes.insert(id, e.to_string());
                    }
                    if device_now(m, id)? == t {
                        notes.remove(&id);
                    } else {
                        left.push(id);
                    }
                }
                pending = left;
                if pending.len() == before {
                    break;
                }
            }
            let mut out = Vec::new();
            for id in chosen {
                let (f, t) = (from[&id], to[&id]);
                let now = device_now(m, id)?;
                let note = (now != t).then(|| {
                    notes.remove(&id).unwrap_or_else(|| {
                        format!("moved to device {now}, not {t} (no contiguous room)")
                    })
                });
                out.push(Migration {
                    object: id,
                    from: f,
                    to: t,
                    now,
                    note,
                });
            }
            out.sort_by_key(|x| x.object);
            Ok(out)
        })
    }
}

fn relocate(m: &mut DataManager, id: ObjectId, d: usize) -> Result<()> {
    match relocate_object(m, id, d)? {
        Prefetched::Done => Ok(()),
        Prefetched::Skipped => Err(Error::InvalidArgument(format!(
            "object {id} stays on device {}: it is pinned or device {d} has no contiguous room",
            device_now(m, id)?
        ))),
    }
}

/// Move `id`'s primary to device `d`: a prefetch towards faster devices, evictions towards
/// slower ones.
fn move_to(m: &mut DataManager, id: ObjectId, d: usize) -> Result<()> {
    let now = device_now(m, id)?;
    if d < now {
        return match prefetch_object(m, id, d, false, None)? {
            Prefetched::Done => Ok(()),
            Prefetched::Skipped => Err(Error::InvalidArgument(format!(
                "object {id} stays on device {now}: it is pinned by an open guard or device {d} has no contiguous room"
            ))),
        };
    }
    let mut at = now;
    while at < d {
        evict_object(m, id)?;
        let next = device_now(m, id)?;
        if next == at {
            break;
        }
        at = next;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;
    use crate::policy;

    const K: u64 = 256 << 10;

    fn manager() -> Arc<Manager> {
        Arc::new(
            Manager::new(
                vec![
                    Device::open("dram", 4 * K).unwrap(),
                    Device::open("emulated:optane-pmem", 64 * K).unwrap(),
                ],
                policy::builtin("first_touch").unwrap(),
            )
            .unwrap(),
        )
    }

    fn t(pairs: &[(&str, &str)]) -> Traits {
        Traits::from_pairs(pairs).unwrap()
    }

    /// The slides' DGEMM: A (hbw, prio 1), B (low_lat, prio 15), C (hbw, prio 5).
    fn dgemm() -> Vec<(u64, Traits)> {
        vec![
            (2 * K, t(&[("preferred", "hbw"), ("priority", "1")])),
            (2 * K, t(&[("preferred", "low_lat"), ("priority", "15")])),
            (2 * K, t(&[("preferred", "hbw"), ("priority", "5")])),
        ]
    }

    fn devices(x: &[(ObjectId, usize)]) -> Vec<usize> {
        x.iter().map(|p| p.1).collect()
    }

    #[test]
    fn strategies_order_claims() {
        let a = t(&[("priority", "1"), ("gain", "1")]);
        let b = t(&[("priority", "15")]);
        let c = t(&[("priority", "5"), ("gain", "4")]);
        let items = [(0, 100, &a), (1, 300, &b), (2, 200, &c)];
        assert_eq!(Strategy::Fifo.order(&items), vec![0, 1, 2]);
        assert_eq!(Strategy::Size.order(&items), vec![1, 2, 0]);
        assert_eq!(Strategy::Priority.order(&items), vec![1, 2, 0]);
        // Gain per byte: c 0.02, a 0.01; b unmeasured comes last.
        assert_eq!(Strategy::Gain.order(&items), vec![2, 0, 1]);
        assert!(Strategy::parse("lifo")
            .unwrap_err()
            .to_string()
            .contains("fifo, size, priority, gain"));
    }

    #[test]
    fn commit_strategies_decide_who_gets_fast_memory() {
        for (s, want) in [
            (Strategy::Fifo, vec![0, 0, 1]),
            (Strategy::Priority, vec![1, 0, 0]),
        ] {
            let m = manager();
            let tr = Traited::new(m.clone());
            assert_eq!(devices(&tr.commit(&dgemm(), s).unwrap()), want, "{s:?}");
            m.check().unwrap();
        }
    }

    #[test]
    fn migration_follows_updated_traits_and_keeps_the_data() {
        let m = manager();
        let tr = Traited::new(m.clone());
        let got = tr.commit(&dgemm(), Strategy::Priority).unwrap();
        let (a, c) = (got[0].0, got[2].0);
        m.write(a).unwrap().as_mut_slice().fill(7);
        m.write(c).unwrap().as_mut_slice().fill(9);
        tr.update_traits(a, t(&[("preferred", "hbw"), ("priority", "20")]))
            .unwrap();
        let moved = tr.apply_migration(None, Strategy::Priority).unwrap();
        let on: BTreeMap<ObjectId, usize> = moved.iter().map(|x| (x.object, x.now)).collect();
        assert_eq!((on[&a], on[&c]), (0, 1), "{moved:?}");
        assert!(moved.iter().all(|x| x.note.is_none() && x.now == x.to));
        assert!(m.read(a).unwrap().as_slice().iter().all(|&b| b == 7));
        assert!(m.read(c).unwrap().as_slice().iter().all(|&b| b == 9));
        m.check().unwrap();
    }

    #[test]
    fn a_pinned_object_stays_with_a_note() {
        let m = manager();
        let tr = Traited::new(m.clone());
        let got = tr.commit(&dgemm(), Strategy::Fifo).unwrap();
        let a = got[0].0;
        let g = m.read(a).unwrap();
        tr.update_traits(a, t(&[("preferred", "large_cap"), ("priority", "0")]))
            .unwrap();
        let moved = tr.apply_migration(Some(&[a]), Strategy::Fifo).unwrap();
        drop(g);
        assert_eq!((moved[0].from, moved[0].to, moved[0].now), (0, 1, 0));
        assert!(
            moved[0].note.as_deref().unwrap_or("").contains("pinned"),
            "{moved:?}"
        );
        m.check().unwrap();
    }

    #[test]
    fn bad_requests_allocate_nothing() {
        let m = manager();
        let tr = Traited::new(m.clone());
        // Fallback error and no room left in the required space: all or nothing.
        let strict = t(&[("required", "hbw"), ("fallback", "error")]);
        let decls = vec![
            (2 * K, strict.clone()),
            (2 * K, strict.clone()),
            (2 * K, strict),
        ];
        let e = tr.commit(&decls, Strategy::Fifo).unwrap_err().to_string();
        assert!(
            e.contains("no device the traits allow has room for 524288 bytes (tried [dram]"),
            "{e}"
        );
        assert_eq!(m.object_count().unwrap(), 0);
        assert!(tr
            .commit(&[(0, Traits::default())], Strategy::Fifo)
            .is_err());
        let e = tr
            .update_traits(12345, Traits::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("object 12345 was not allocated with traits"),
            "{e}"
        );
        let e = tr
            .apply_migration(Some(&[12345]), Strategy::Fifo)
            .unwrap_err()
            .to_string();
        assert!(e.contains("object 12345"), "{e}");
    }
}
