//! Model checking of the protocols that race, with shuttle: reduced models of the real code
//! paths (the same steps under the same locks and atomics), run under shuttle's schedulers
//! (random, PCT and, for the smallest, every interleaving), asserting what must hold
//! whatever the schedule. Each model names the code it reduces.

use shuttle::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use shuttle::sync::{Arc, Mutex, RwLock};
use shuttle::thread;

/// Memory of a toy device pair: region r holds one value.
#[derive(Default)]
struct Mem {
    regions: Vec<u32>,
}

/// `manager::Manager::{open, close}` against `policy::evict_object`: an object's primary
/// region, its pins, and a move that copies, switches and frees, all under the manager lock.
/// The guard writes *outside* the lock to the address it got while pinned.
struct Object {
    primary: usize,
    pins: u32,
}

#[test]
fn guard_pins_against_eviction_no_torn_write() {
    shuttle::check_pct(
        || {
            // Region 0: the object's fast copy; region 1: its slow sibling; 2: another object.
            let mgr = Arc::new(Mutex::new((
                Object {
                    primary: 0,
                    pins: 0,
                },
                vec![true, false, false], // region allocated?
            )));
            let mem = Arc::new(Mutex::new(Mem {
                regions: vec![0, 0, 0],
            }));
            let writer = {
                let (mgr, mem) = (mgr.clone(), mem.clone());
                thread::spawn(move || {
                    for v in 1..=2u32 {
                        // open: pin and read the address under the lock
                        let at = {
                            let mut g = mgr.lock().unwrap();
                            g.0.pins += 1;
                            g.0.primary
                        };
                        // the view is used with no lock held
                        mem.lock().unwrap().regions[at] = v;
                        // close
                        mgr.lock().unwrap().0.pins -= 1;
                    }
                })
            };
            let evictor = {
                let (mgr, mem) = (mgr.clone(), mem.clone());
                thread::spawn(move || {
                    for _ in 0..2 {
                        let mut g = mgr.lock().unwrap();
                        if g.0.pins > 0 {
                            continue; // PinnedError: refused
                        }
                        let (from, to) = (g.0.primary, 1 - g.0.primary);
                        let mut m = mem.lock().unwrap();
                        m.regions[to] = m.regions[from]; // copy
                        g.0.primary = to; // switch
                        g.1[to] = true;
                        g.1[from] = false; // free: the heap may hand it to another object
                        m.regions[from] = 0xDEAD; // ... which writes it
                    }
                })
            };
            writer.join().unwrap();
            evictor.join().unwrap();
            let g = mgr.lock().unwrap();
            let m = mem.lock().unwrap();
            assert_eq!(m.regions[g.0.primary], 2, "the last write was lost or torn");
        },
        2000,
        3,
    );
}

/// `tiermem_embed::cache`: a row's pointer-table entry (`slot << 2 | CACHED`, bit 1 the lock
/// taken by compare-and-swap, bit 30 the second-chance reference mark). Lookups under the
/// table's shared lock cache rows concurrently: the CAS winner copies the home row into a
/// fresh slot and publishes it; losers read the home row, which stays valid until the slot
/// is published; a hit sets the mark on the entry it read (`fetch_or`, only if unset).
/// Updates, reclaims and flushes hold the lock exclusively: an update writes the cached copy
/// (marking it updated) or the home row; a reclaim keeps marked rows (clearing the mark) and
/// drops the others, writing updated ones home and leaving their slots as holes; a flush
/// writes updated rows home and empties the cache. A new row takes the lowest hole by
/// clearing its bit in the bitmap (`cache/holes.rs`, no lock: the thread whose `fetch_and`
/// cleared the bit owns the slot), else bumps a fresh slot.
const CACHED: u32 = 1;
const LOCKED: u32 = 2;
const REF: u32 = 1 << 30;
const EMPTY: u32 = u32::MAX;

fn slot(e: u32) -> usize {
    ((e & !REF) >> 2) as usize
}

struct Table {
    entry: Vec<AtomicU32>,
    home: Vec<AtomicU32>,
    slots: Vec<AtomicU32>,
    next_slot: AtomicU32,
    holes: AtomicU64,
    dirty: Vec<AtomicU32>,
}

fn take_hole(t: &Table) -> Option<u32> {
    loop {
        let b = t.holes.load(Ordering::Relaxed);
        if b == 0 {
            return None;
        }
        let bit = b & b.wrapping_neg();
        if t.holes.fetch_and(!bit, Ordering::Relaxed) & bit != 0 {
            return Some(bit.trailing_zeros());
        }
    }
}

fn lookup(t: &Table, row: usize) -> u32 {
    let e = t.entry[row].load(Ordering::Acquire);
    if e != EMPTY && e & CACHED == CACHED {
        if e & REF == 0 {
            t.entry[row].fetch_or(REF, Ordering::Relaxed);
        }
        return t.slots[slot(e)].load(Ordering::Acquire);
    }
    if e == EMPTY
        && t.entry[row]
            .compare_exchange(EMPTY, LOCKED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    {
        let s = take_hole(t).unwrap_or_else(|| t.next_slot.fetch_add(1, Ordering::Relaxed));
        let v = t.home[row].load(Ordering::Acquire);
        t.slots[s as usize].store(v, Ordering::Release);
        t.entry[row].store(s << 2 | CACHED, Ordering::Release);
        return v;
    }
    t.home[row].load(Ordering::Acquire)
}

/// Under the exclusive lock: the row's newest value becomes `v`.
fn update(t: &Table, row: usize, v: u32) {
    let e = t.entry[row].load(Ordering::Acquire);
    if e != EMPTY && e & CACHED == CACHED {
        t.slots[slot(e)].store(v, Ordering::Release);
        t.dirty[row].store(1, Ordering::Release);
    } else {
        t.home[row].store(v, Ordering::Release);
    }
}

/// Under the exclusive lock: write updated rows home, drop every cached row.
fn flush(t: &Table) {
    for row in 0..t.entry.len() {
        let e = t.entry[row].load(Ordering::Acquire);
        assert!(e == EMPTY || e & LOCKED == 0, "row {row} left locked");
        if e != EMPTY {
            if t.dirty[row].swap(0, Ordering::AcqRel) == 1 {
                let v = t.slots[slot(e)].load(Ordering::Acquire);
                t.home[row].store(v, Ordering::Release);
            }
            t.entry[row].store(EMPTY, Ordering::Release);
        }
    }
    t.next_slot.store(0, Ordering::Relaxed);
    t.holes.store(0, Ordering::Relaxed);
}

/// Under the exclusive lock: keep the rows hit since the last pass (clearing the mark), drop
/// the others, writing updated ones home.
fn reclaim(t: &Table) {
    for row in 0..t.entry.len() {
        let e = t.entry[row].load(Ordering::Acquire);
        if e == EMPTY {
            continue;
        }
        assert!(e & LOCKED == 0, "row {row} left locked");
        if e & REF != 0 {
            t.entry[row].store(e & !REF, Ordering::Release);
        } else {
            if t.dirty[row].swap(0, Ordering::AcqRel) == 1 {
                let v = t.slots[slot(e)].load(Ordering::Acquire);
                t.home[row].store(v, Ordering::Release);
            }
            t.entry[row].store(EMPTY, Ordering::Release);
            t.holes.fetch_or(1 << slot(e), Ordering::Relaxed);
        }
    }
}

#[test]
fn cache_compare_and_swap_publish_mark_update_reclaim_and_flush() {
    shuttle::check_pct(
        || {
            let n = 2;
            let t = Arc::new(RwLock::new(Table {
                entry: (0..n).map(|_| AtomicU32::new(EMPTY)).collect(),
                home: (0..n).map(|r| AtomicU32::new(100 + r as u32)).collect(),
                slots: (0..8).map(|_| AtomicU32::new(0)).collect(),
                next_slot: AtomicU32::new(0),
                holes: AtomicU64::new(0),
                dirty: (0..n).map(|_| AtomicU32::new(0)).collect(),
            }));
            // The logical value of each row, changed only under the exclusive lock.
            let truth = Arc::new(Mutex::new(vec![100u32, 101]));
            let mut hs = Vec::new();
            for k in 0..2 {
                let (t, truth) = (t.clone(), truth.clone());
                hs.push(thread::spawn(move || {
                    for i in 0..2 {
                        let row = (k + i) % 2;
                        let g = t.read().unwrap();
                        let want = truth.lock().unwrap()[row];
                        assert_eq!(lookup(&g, row), want, "lookup saw a stale or torn row");
                    }
                }));
            }
            {
                let (t, truth) = (t.clone(), truth.clone());
                hs.push(thread::spawn(move || {
                    {
                        let g = t.write().unwrap();
                        update(&g, 0, 7);
                        truth.lock().unwrap()[0] = 7;
                    }
                    reclaim(&t.write().unwrap());
                    let g = t.write().unwrap();
                    flush(&g);
                }));
            }
            for h in hs {
                h.join().unwrap();
            }
            let g = t.write().unwrap();
            flush(&g);
            let truth = truth.lock().unwrap();
            for row in 0..2 {
                assert_eq!(
                    g.home[row].load(Ordering::Acquire),
                    truth[row],
                    "an update was lost"
                );
            }
        },
        3000,
        3,
    );
}

/// Two lookups that miss at once on a cache whose free slots are holes a reclaim left: each
/// takes a hole of its own (the bit its `fetch_and` cleared), so each row's copy stays its
/// own, whatever the schedule.
#[test]
fn lookups_missing_at_once_take_holes_of_their_own() {
    shuttle::check_pct(
        || {
            let t = Arc::new(RwLock::new(Table {
                entry: (0..2).map(|_| AtomicU32::new(EMPTY)).collect(),
                home: (0..2).map(|r| AtomicU32::new(100 + r)).collect(),
                slots: (0..4).map(|_| AtomicU32::new(0)).collect(),
                next_slot: AtomicU32::new(4),
                holes: AtomicU64::new(0b0110),
                dirty: (0..2).map(|_| AtomicU32::new(0)).collect(),
            }));
            let hs: Vec<_> = (0..2)
                .map(|row| {
                    let t = t.clone();
                    thread::spawn(move || {
                        let g = t.read().unwrap();
                        assert_eq!(lookup(&g, row), 100 + row as u32);
                        assert_eq!(
                            lookup(&g, row),
                            100 + row as u32,
                            "row {row}'s slot was shared"
                        );
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            let g = t.read().unwrap();
            let (a, b) = (
                g.entry[0].load(Ordering::Acquire),
                g.entry[1].load(Ordering::Acquire),
            );
            assert_ne!(slot(a), slot(b), "two rows in one slot");
            assert_eq!(g.holes.load(Ordering::Relaxed), 0, "both holes taken");
        },
        5000,
        3,
    );
}

/// `policy::writeback_object` (write-behind, `Manager::writeback`) against a write guard and
/// `policy::evict_object`: write-back copies a dirty primary to its slower sibling and marks
/// it clean; a later eviction of a clean object copies nothing. A write guard that closes
/// after the write-back marks it dirty again, so the eviction copies: nothing is lost.
#[test]
fn write_behind_then_write_then_evict_loses_nothing() {
    shuttle::check_dfs(
        || {
            // (fast value, slow value, dirty, pins, primary is fast)
            let st = Arc::new(Mutex::new((0u32, 0u32, true, 0u32, true)));
            let writer = {
                let st = st.clone();
                thread::spawn(move || {
                    // open (pin) under the lock; write outside it; close marks dirty
                    {
                        let mut g = st.lock().unwrap();
                        if !g.4 {
                            return; // evicted first: this model's writer only writes fast
                        }
                        g.3 += 1;
                    }
                    {
                        let mut g = st.lock().unwrap();
                        g.0 = 5;
                    }
                    let mut g = st.lock().unwrap();
                    g.3 -= 1;
                    g.2 = true;
                })
            };
            let behind = {
                let st = st.clone();
                thread::spawn(move || {
                    // write-back: refused while a writer holds the object
                    let mut g = st.lock().unwrap();
                    if g.4 && g.2 && g.3 == 0 {
                        g.1 = g.0;
                        g.2 = false;
                    }
                })
            };
            writer.join().unwrap();
            behind.join().unwrap();
            // evict: copy only if dirty
            let mut g = st.lock().unwrap();
            if g.4 {
                if g.2 {
                    g.1 = g.0;
                }
                g.4 = false;
            }
            let wrote = g.0;
            assert_eq!(g.1, wrote, "the slow copy lacks the last write");
        },
        None,
    );
}

/// `manager::Manager::writeback` (`manager/moving.rs`: `writeback_begin`, the copy with no
/// lock held, `writeback_end`) against a write guard and a free: the copy reads the held
/// primary outside the lock while a writer may write it; the primary is marked clean only if
/// the object's write count did not change, and a free during the copy waits for its end.
/// Whatever the schedule: the copy never reads freed memory, and a later eviction leaves the
/// slow copy equal to the last write.
#[test]
fn write_back_outside_the_lock_loses_no_write_and_reads_nothing_freed() {
    #[derive(Default)]
    struct St {
        dirty: bool,
        writes: u64,
        writer: bool,
        held: u32,
        moving: bool,
        free_pending: bool,
        freed: bool,
        last: u32,
    }
    shuttle::check_pct(
        || {
            let st = Arc::new(Mutex::new(St {
                dirty: true,
                ..St::default()
            }));
            // (fast value, slow value): written and read with no manager lock held.
            let mem = Arc::new(Mutex::new((0u32, 0u32)));
            let behind = {
                let (st, mem) = (st.clone(), mem.clone());
                thread::spawn(move || {
                    let writes = {
                        let mut g = st.lock().unwrap();
                        if g.freed || g.moving || !g.dirty || g.writer {
                            return;
                        }
                        g.held += 1;
                        g.moving = true;
                        g.writes
                    };
                    // The copy, outside the manager lock, in two steps (a torn read is possible).
                    let v = {
                        let m = mem.lock().unwrap();
                        assert!(!st.lock().unwrap().freed, "the copy read freed memory");
                        m.0
                    };
                    mem.lock().unwrap().1 = v;
                    let mut g = st.lock().unwrap();
                    g.held -= 1;
                    g.moving = false;
                    if g.writes == writes && !g.writer {
                        g.dirty = false;
                    }
                    if g.free_pending {
                        g.freed = true;
                    }
                })
            };
            let writer = {
                let (st, mem) = (st.clone(), mem.clone());
                thread::spawn(move || {
                    for v in 1..=2u32 {
                        {
                            let mut g = st.lock().unwrap();
                            if g.freed || g.free_pending || g.writer {
                                return;
                            }
                            g.writer = true;
                            g.writes += 1;
                        }
                        mem.lock().unwrap().0 = v;
                        let mut g = st.lock().unwrap();
                        g.writer = false;
                        g.dirty = true;
                        g.writes += 1;
                        g.last = v;
                    }
                })
            };
            let freer = {
                let st = st.clone();
                thread::spawn(move || {
                    thread::yield_now();
                    let mut g = st.lock().unwrap();
                    if g.writer {
                        return; // the owner frees only what it is not using
                    }
                    if g.moving {
                        g.free_pending = true;
                    } else {
                        g.freed = true;
                    }
                })
            };
            behind.join().unwrap();
            writer.join().unwrap();
            freer.join().unwrap();
            let g = st.lock().unwrap();
            assert!(!g.moving && g.held == 0);
            assert!(
                !g.free_pending || g.freed,
                "a free during the copy was lost"
            );
            if !g.freed {
                // evict: copies only when dirty
                let mut m = mem.lock().unwrap();
                if g.dirty {
                    m.1 = m.0;
                }
                assert_eq!(m.1, g.last, "the slow copy lacks the last write");
            }
        },
        5000,
        3,
    );
}
