use std::collections::HashMap;

use proptest::prelude::*;
use tiermem_core::mechanism::Place;
use tiermem_core::Error;

use crate::two_tier;

#[derive(Debug, Clone)]
enum Op {
    Alloc(u64, bool),
    Free(usize),
    Write(usize, u8),
    Read(usize),
    Evict(usize),
    Prefetch(usize, bool),
    Softevict(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u64..20_000, any::<bool>()).prop_map(|(n, f)| Op::Alloc(n, f)),
        1 => any::<usize>().prop_map(Op::Free),
        3 => (any::<usize>(), any::<u8>()).prop_map(|(i, v)| Op::Write(i, v)),
        2 => any::<usize>().prop_map(Op::Read),
        2 => any::<usize>().prop_map(Op::Evict),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(i, f)| Op::Prefetch(i, f)),
        1 => any::<usize>().prop_map(Op::Softevict),
    ]
}

fn run(policy: &str, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let m = two_tier(64 << 10, 2 << 20, policy);
    // Model: object id -> the byte every position holds.
    let mut model: HashMap<u64, u8> = HashMap::new();
    let mut ids: Vec<u64> = Vec::new();
    let mut last_id = 0;
    let pick = |ids: &Vec<u64>, i: usize| (!ids.is_empty()).then(|| ids[i % ids.len()]);
    for o in ops {
        match o {
            Op::Alloc(n, fast) => match m.alloc(n, if fast { Place::Fast } else { Place::Slow }) {
                Ok(id) => {
                    prop_assert!(id > last_id, "ids increase monotonically");
                    last_id = id;
                    m.write(id).unwrap().as_mut_slice().fill(0);
                    model.insert(id, 0);
                    ids.push(id);
                }
                Err(Error::DeviceFull { .. }) => {}
                Err(e) => prop_assert!(false, "alloc: {e}"),
            },
            Op::Free(i) => {
                if let Some(id) = pick(&ids, i) {
                    m.free(id).unwrap();
                    ids.retain(|x| *x != id);
                    model.remove(&id);
                    prop_assert!(matches!(m.free(id), Err(Error::NoSuchObject(_))));
                }
            }
            Op::Write(i, v) => {
                if let Some(id) = pick(&ids, i) {
                    match m.write(id) {
                        Ok(mut g) => {
                            g.as_mut_slice().fill(v);
                            model.insert(id, v);
                        }
                        Err(Error::Guard(_)) => {}
                        Err(e) => prop_assert!(false, "write: {e}"),
                    }
                }
            }
            Op::Read(i) => {
                if let Some(id) = pick(&ids, i) {
                    if let Ok(g) = m.read(id) {
                        let want = model[&id];
                        prop_assert!(g.as_slice().iter().all(|&b| b == want), "data lost");
                    }
                }
            }
            Op::Evict(i) => {
                if let Some(id) = pick(&ids, i) {
                    match m.evict(id) {
                        Ok(()) | Err(Error::DeviceFull { .. }) => {}
                        Err(e) => prop_assert!(false, "evict: {e}"),
                    }
                }
            }
            Op::Prefetch(i, force) => {
                if let Some(id) = pick(&ids, i) {
                    match m.prefetch(id, force) {
                        Ok(()) | Err(Error::DeviceFull { .. }) => {}
                        Err(e) => prop_assert!(false, "prefetch: {e}"),
                    }
                }
            }
            Op::Softevict(i) => {
                if let Some(id) = pick(&ids, i) {
                    m.softevict(id).unwrap();
                }
            }
        }
        if let Err(e) = m.check() {
            prop_assert!(false, "invariant broken: {e}");
        }
    }
    // Every object still holds its data, wherever it is.
    for (&id, &v) in &model {
        let g = m.read(id).unwrap();
        prop_assert!(g.as_slice().iter().all(|&b| b == v));
    }
    // No leak after freeing everything.
    for id in ids {
        m.free(id).unwrap();
    }
    for u in m.usage().unwrap() {
        prop_assert_eq!(u.used, 0, "device {} leaks", u.device);
        prop_assert!(u.peak <= u.capacity);
    }
    prop_assert_eq!(m.check(), Ok(()));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn lru_keeps_invariants_and_data(ops in prop::collection::vec(op(), 1..60)) {
        run("lru", ops)?;
    }

    #[test]
    fn baselines_keep_invariants_and_data(
        ops in prop::collection::vec(op(), 1..40),
        which in 0usize..4,
    ) {
        run(["all_fast", "all_slow", "first_touch", "2lm_model"][which], ops)?;
    }
}
