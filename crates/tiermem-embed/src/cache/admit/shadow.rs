//! `shadow:M` (Bandana Fig. 11b): a block's other row goes in if it is in a shadow cache of
//! the rows asked for (row ids only, least recently used first out) of `M` times the cache's
//! size. Not simulated by the miniature caches.

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;

use super::{Admit, Known};

/// A least-recently-used list of row ids (no contents).
#[derive(Default)]
struct Lru {
    capacity: usize,
    clock: u64,
    at: HashMap<u64, u64>,
    order: BTreeMap<u64, u64>,
}

impl Lru {
    fn touch(&mut self, row: u64) {
        self.clock += 1;
        if let Some(old) = self.at.insert(row, self.clock) {
            self.order.remove(&old);
        }
        self.order.insert(self.clock, row);
        while self.at.len() > self.capacity {
            let Some((_, r)) = self.order.pop_first() else {
                break;
            };
            self.at.remove(&r);
        }
    }
}

/// `shadow:M`, `M` in hundredths.
pub struct Shadow {
    hundredths: u32,
    /// A leaf lock, taken inside a staged call (under the table's exclusive lock).
    lru: Mutex<Lru>,
}

impl Admit for Shadow {
    const NAME: &'static str = "shadow";

    fn parse(arg: Option<&str>) -> Result<Self, String> {
        let m = match arg {
            None => 1.0,
            Some(a) => a.parse::<f64>().map_err(|_| bad())?,
        };
        if !(m.is_finite() && m > 0.0 && m <= 1000.0) {
            return Err(bad());
        }
        Ok(Shadow {
            hundredths: (m * 100.0).round().max(1.0) as u32,
            lru: Mutex::default(),
        })
    }

    fn name(&self) -> String {
        format!("shadow:{}", f64::from(self.hundredths) / 100.0)
    }

    fn asked(&self, rows: &[u64], slots: usize) {
        let mut l = self.lru.lock();
        l.capacity = (slots * self.hundredths as usize / 100).max(1);
        for &r in rows {
            l.touch(r);
        }
    }

    fn neighbour(&self, row: u64, _known: Known<'_>) -> bool {
        self.lru.lock().at.contains_key(&row)
    }
}

fn bad() -> String {
    "the shadow cache's size is a multiple of the cache's, above 0 and at most 1000".into()
}
