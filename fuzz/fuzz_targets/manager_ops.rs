//! Sequences of manager operations (alloc, free, writes and reads through guards, guards held
//! open across steps, guards closed twice, holds, evict, prefetch, softevict, write-back)
//! read from the fuzzer's bytes, against a model of every object's bytes; `Manager::check`
//! after every step.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use tiermem_core::device::Device;
use tiermem_core::manager::{GuardTicket, Manager};
use tiermem_core::mechanism::Place;
use tiermem_core::policy;
use tiermem_core::Error;

const POLICIES: [&str; 4] = ["lru", "lru_in_place", "first_touch", "all_slow"];

fuzz_target!(|data: &[u8]| {
    let Some((&p, data)) = data.split_first() else {
        return;
    };
    let devs = vec![
        Device::open("dram", 64 << 10).unwrap(),
        Device::open("numa:0", 1 << 20).unwrap(),
    ];
    let m = Manager::new(devs, policy::builtin(POLICIES[p as usize % 4]).unwrap()).unwrap();
    let mut model: HashMap<u64, u8> = HashMap::new();
    let mut ids: Vec<u64> = Vec::new();
    let mut open: Vec<(GuardTicket, u64, bool)> = Vec::new();
    // Closed guards: (ticket, object, still a hold). A hold pins its object until closed.
    let mut closed: Vec<(GuardTicket, u64, bool)> = Vec::new();
    let pick = |ids: &Vec<u64>, k: u16| (!ids.is_empty()).then(|| ids[k as usize % ids.len()]);
    for c in data.chunks_exact(3) {
        let k = u16::from_le_bytes([c[1], c[2]]);
        let held = |id: u64, closed: &Vec<(GuardTicket, u64, bool)>| closed.iter().any(|g| g.1 == id && g.2);
        let pinned = |id: u64, open: &Vec<(GuardTicket, u64, bool)>| open.iter().any(|g| g.1 == id) || held(id, &closed);
        match c[0] % 12 {
            0 | 1 => match m.alloc(u64::from(k % 20_000) + 1, if k & 1 == 0 { Place::Fast } else { Place::Slow }) {
                Ok(id) => {
                    m.write(id).unwrap().as_mut_slice().fill(0);
                    model.insert(id, 0);
                    ids.push(id);
                }
                Err(Error::DeviceFull { .. } | Error::AllPinned { .. }) => {}
                Err(e) => panic!("alloc: {e}"),
            },
            2 => {
                if let Some(id) = pick(&ids, k) {
                    match m.free(id) {
                        Ok(()) => {
                            assert!(!pinned(id, &open), "freed a pinned object");
                            ids.retain(|x| *x != id);
                            model.remove(&id);
                        }
                        Err(Error::Pinned { .. }) => assert!(pinned(id, &open)),
                        Err(e) => panic!("free: {e}"),
                    }
                }
            }
            3 => {
                if let Some(id) = pick(&ids, k) {
                    match m.write(id) {
                        Ok(mut g) => {
                            g.as_mut_slice().fill(c[2]);
                            model.insert(id, c[2]);
                        }
                        Err(Error::Guard(_)) => assert!(pinned(id, &open)),
                        Err(Error::DeviceFull { .. } | Error::AllPinned { .. }) => {}
                        Err(e) => panic!("write: {e}"),
                    }
                }
            }
            4 => {
                if let Some(id) = pick(&ids, k) {
                    match m.read(id) {
                        Ok(g) => assert!(g.as_slice().iter().all(|&b| b == model[&id]), "bytes lost"),
                        Err(Error::Guard(_)) => assert!(open.iter().any(|g| g.1 == id && g.2)),
                        Err(Error::DeviceFull { .. } | Error::AllPinned { .. }) => {}
                        Err(e) => panic!("read: {e}"),
                    }
                }
            }
            5 => {
                if let Some(id) = pick(&ids, k) {
                    match m.open(id, k & 2 == 0) {
                        Ok((t, ptr, len)) => {
                            // SAFETY: the guard pins the object; ptr holds len bytes.
                            let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
                            assert!(bytes.iter().all(|&b| b == model[&id]));
                            open.push((t, id, k & 2 == 0));
                        }
                        Err(Error::Guard(_) | Error::DeviceFull { .. } | Error::AllPinned { .. }) => {}
                        Err(e) => panic!("open: {e}"),
                    }
                }
            }
            6 => {
                if !open.is_empty() {
                    let (t, id, _) = open.swap_remove(k as usize % open.len());
                    let hold = k & 4 != 0;
                    match if hold { m.hold(t) } else { m.close(t) } {
                        Ok(()) | Err(Error::Policy { .. }) => closed.push((t, id, hold)),
                        Err(e) => panic!("close: {e}"),
                    }
                }
            }
            7 => {
                if !closed.is_empty() {
                    // A hold closes once more (releasing it); a closed guard never again.
                    let i = k as usize % closed.len();
                    let (t, _, hold) = closed[i];
                    let r = m.close(t);
                    assert_eq!(r.is_ok(), hold, "closing ticket {t}: {r:?}");
                    closed[i].2 = false;
                    assert!(matches!(m.close(t), Err(Error::Guard(_))), "closed twice");
                }
            }
            8 => {
                if let Some(id) = pick(&ids, k) {
                    match m.evict(id) {
                        Ok(()) | Err(Error::DeviceFull { .. } | Error::AllPinned { .. }) => {}
                        Err(Error::Pinned { .. }) => {}
                        Err(e) => panic!("evict: {e}"),
                    }
                }
            }
            9 => {
                if let Some(id) = pick(&ids, k) {
                    match m.prefetch(id, k & 1 == 1) {
                        Ok(()) | Err(Error::DeviceFull { .. } | Error::AllPinned { .. }) => {}
                        Err(e) => panic!("prefetch: {e}"),
                    }
                }
            }
            10 => {
                if let Some(id) = pick(&ids, k) {
                    m.softevict(id).unwrap();
                }
            }
            _ => {
                if let Some(id) = pick(&ids, k) {
                    match m.writeback(id) {
                        Ok(_) | Err(Error::DeviceFull { .. } | Error::AllPinned { .. }) => {}
                        Err(e) => panic!("writeback: {e}"),
                    }
                }
            }
        }
        m.check().unwrap();
    }
    for (t, _, _) in open {
        m.close(t).unwrap();
    }
    for (t, _, hold) in closed {
        if hold {
            m.close(t).unwrap(); // outstanding holds
        }
    }
    for id in ids {
        assert!(m.read(id).unwrap().as_slice().iter().all(|&b| b == model[&id]));
        m.free(id).unwrap();
    }
    assert_eq!(m.object_count().unwrap(), 0);
    m.check().unwrap();
});
