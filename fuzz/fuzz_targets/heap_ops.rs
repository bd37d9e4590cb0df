//! Sequences of heap operations (alloc, free, evict_from with a callback that keeps or frees
//! what it meets) read from the fuzzer's bytes; `Heap::check` after every step.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiermem_core::heap::{Disposition, Heap};

fuzz_target!(|data: &[u8]| {
    let mut h = Heap::new(1 << 20, 64);
    let mut live: Vec<u64> = Vec::new();
    let mut owner = 1u64;
    let mut it = data.chunks_exact(5);
    for c in it.by_ref() {
        let arg = u32::from_le_bytes([c[1], c[2], c[3], c[4]]) as u64;
        match c[0] % 4 {
            0 | 1 => {
                if let Some(off) = h.alloc(arg % (300 << 10) + 1, owner) {
                    live.push(off);
                    owner += 1;
                }
            }
            2 => {
                if !live.is_empty() {
                    let off = live.swap_remove(arg as usize % live.len());
                    assert!(h.free(off).is_some(), "free of a live block failed");
                    assert!(h.free(off).is_none(), "double free accepted");
                }
            }
            _ => {
                let start = arg % (1 << 20);
                let size = (arg >> 7) % (512 << 10) + 1;
                let mut n = 0u32;
                let freed: std::cell::RefCell<Vec<u64>> = Default::default();
                let r: Result<Option<u64>, ()> = h.evict_from(start, size, |off, _| {
                    n += 1;
                    if (arg >> (n % 32)) & 1 == 1 {
                        freed.borrow_mut().push(off);
                        Ok(Disposition::Evicted)
                    } else {
                        Ok(Disposition::Kept)
                    }
                });
                let freed = freed.into_inner();
                live.retain(|o| !freed.contains(o));
                if let Ok(Some(off)) = r {
                    let (_, b) = h.block_at(off).unwrap();
                    assert!(b.owner.is_none() && b.size >= size, "evict_from returned a bad span");
                }
            }
        }
        h.check().unwrap();
    }
});
