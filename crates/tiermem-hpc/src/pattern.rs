//! Access-pattern analysis for pattern-aware staging (Arima & Schulz,
//! `../shared/papers/arima-schulz-pattern-aware-staging.txt` §4-5): sample a few thousand
//! addresses per thread, measure *sparseness* with a page-address Bloom filter (PAF) and
//! *regularity* with a stride Bloom filter (SF), and decide whether copying a chunk to fast
//! memory before a loop pays for itself on the calibrated break-even line (eq. 2-9).
//!
//! The filters are the paper's (Table 3): `2^N` bits (N = 11; stored a byte per bit, 2 KiB
//! per filter per thread), two hashes `hash_k(x) = (x >> (N * k)) & (2^N - 1)`, cleared after 256 inputs
//! (sets); each sample is a `test` that counts a hit, or a miss followed by a `set`. A thread
//! samples its first 2048 addresses into the PAF and its first 1024 strides into the SF.
//!
//! One addition to the paper: a third filter of the same kind over the sampled addresses'
//! cache *lines* (LF), large enough (2^14 bits) to remember a thread's whole sample, over
//! mixed line addresses (the bit-slice hashes alias strided lines). Its hit rate `R_lf` is
//! the share of accesses to a line seen earlier in the sample, which a cache serves (reuse
//! farther apart than a sample is invisible to it): the paper multiplies its per-access gain by the
//! loop's references per element `U`, which overstates the gain of loops that reuse lines
//! (a banded SpMV reads each `x` element dozens of times but fetches its line once).
//! [`BreakEven::decide`] scales the gain by the lines fetched, `U (1 - R_lf)`, against the
//! calibration patterns' own line reuse; with no line reuse anywhere it is the paper's rule.
//! Two models then see past the sample ([`BreakEven::fetches`]): a sweep whose band of lines
//! fits the cache fetches only at its front (`R_front`), and a working set that grows slowly
//! (`ws_exponent`) is extrapolated to the whole loop. The fetched lines are priced at their
//! own pattern: a PAF and an SF fed only the LF's misses (`R_paf_fetched`, `R_sf_fetched`).

use std::cell::RefCell;

use serde::{Deserialize, Serialize};

use tiermem_core::{Error, Result};

/// log2 of a filter's bits (256 bytes).
pub const FILTER_BITS_LOG2: u32 = 11;
/// Inputs (sets) after which a filter is cleared.
pub const MAX_INPUTS: u32 = 256;
/// Addresses a thread samples into its page-address filter.
pub const PAF_SAMPLES: usize = 2048;
/// Strides a thread samples into its stride filter.
pub const SF_SAMPLES: usize = 1024;
/// Fetched lines (the LF's misses) a thread feeds its fetched-line PAF and SF: enough for
/// their rates, and a bound on the analysis's cost when nearly every access fetches.
pub const FETCHED_SAMPLES: u64 = 512;
/// Addresses a thread's sampler takes at most (its PAF's, or its SF's strides and one).
pub const WANTED: usize = if PAF_SAMPLES > SF_SAMPLES {
    PAF_SAMPLES
} else {
    SF_SAMPLES + 1
};
/// The page the PAF sees addresses by.
pub const PAGE_BYTES: u64 = 4096;
/// The line the LF sees addresses by.
pub const LINE_BYTES: u64 = 64;

const BITS: usize = 1 << FILTER_BITS_LOG2;

/// The line filter's bits (2^14) and inputs between clears: it remembers a
/// whole thread's sample of lines (our addition; see the module's note).
pub const LF_BITS: usize = 1 << 14;
/// Inputs after which the line filter is cleared.
pub const LF_MAX_INPUTS: u32 = PAF_SAMPLES as u32;

/// A Bloom filter of `B` bits with the paper's two hashes and clearing policy, cleared
/// after `MAX` inputs; the default is the paper's (2^11 bits, 256 inputs).
///
/// A bit is a byte: a test is two loads, a set two stores, with no shifts (a quarter off
/// the sampling's time, measured; generation marks in place of zeroing on a clear were
/// slower).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bloom<const B: usize = BITS, const MAX: u32 = MAX_INPUTS> {
    bits: [u8; B],
    inputs: u32,
}

impl<const B: usize, const MAX: u32> Default for Bloom<B, MAX> {
    fn default() -> Self {
        Bloom {
            bits: [0; B],
            inputs: 0,
        }
    }
}

impl<const B: usize, const MAX: u32> Bloom<B, MAX> {
    const LOG2: u32 = B.trailing_zeros();
    const MASK: u64 = (1 << Self::LOG2) - 1;

    fn slots(x: u64) -> [usize; 2] {
        [
            (x & Self::MASK) as usize,
            ((x >> Self::LOG2) & Self::MASK) as usize,
        ]
    }

    /// Whether `x` may have been set since the last clear.
    #[must_use]
    pub fn test(&self, x: u64) -> bool {
        let [a, b] = Self::slots(x);
        self.bits[a] & self.bits[b] != 0
    }

    /// Record `x`; the filter clears itself first once it holds `MAX` inputs.
    pub fn set(&mut self, x: u64) {
        if self.inputs >= MAX {
            self.clear();
        }
        let [a, b] = Self::slots(x);
        self.bits[a] = 1;
        self.bits[b] = 1;
        self.inputs += 1;
    }

    /// Whether nothing was set since the last clear (an observation now cannot hit).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.inputs == 0
    }

    /// Empty it.
    pub fn clear(&mut self) {
        self.bits = [0; B];
        self.inputs = 0;
    }

    /// Test `x`, and set it on a miss; returns whether it hit.
    ///
    /// Without a branch on the outcome, which is data and mispredicts on sparse patterns:
    /// setting a hit's bits again changes nothing, so only the count and the clear depend
    /// on it.
    #[inline]
    pub fn observe(&mut self, x: u64) -> bool {
        Self::observe_in(&mut self.bits, &mut self.inputs, x)
    }

    /// [`Bloom::observe`] on a filter's parts, so that a loop can keep its count in a
    /// register rather than in the filter (a count stored and reloaded every access is a
    /// chain the loop cannot run ahead of).
    #[inline(always)]
    fn observe_in(bits: &mut [u8; B], inputs: &mut u32, x: u64) -> bool {
        let [a, b] = Self::slots(x);
        let hit = bits[a] & bits[b] != 0;
        if !hit & (*inputs >= MAX) {
            *bits = [0; B];
            *inputs = 0;
        }
        bits[a] = 1;
        bits[b] = 1;
        *inputs += u32::from(!hit);
        hit
    }
}

/// One thread's sampler: its PAF, SF and LF and their counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sampler {
    paf: Bloom,
    sf: Bloom,
    lf: Bloom<LF_BITS, LF_MAX_INPUTS>,
    last: Option<u64>,
    paf_hits: u64,
    lf_hits: u64,
    paf_samples: u64,
    sf_hits: u64,
    sf_samples: u64,
    fetched: Fetched,
}

/// What a sampler sees of the lines its LF missed (the lines a loop fetches: the first
/// [`FETCHED_SAMPLES`]), and of the band of lines its sample spans.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fetched {
    paf: Bloom,
    sf: Bloom,
    last: Option<u64>,
    samples: u64,
    paf_hits: u64,
    sf_hits: u64,
    sf_samples: u64,
    /// Observations that met an empty filter (they cannot hit): left out of the rates, which
    /// are then a warm filter's, however few lines were fetched.
    paf_cold: u64,
    sf_cold: u64,
    /// Lowest and highest line sampled (`u64::MAX, 0` before any).
    band: (u64, u64),
    /// The highest line once a quarter of the sample was in.
    front_at_quarter: u64,
    /// Distinct lines (LF misses) once a quarter of the sample was in.
    lines_at_quarter: u64,
}

impl Sampler {
    /// Whether it has all the samples it takes.
    #[must_use]
    pub fn full(&self) -> bool {
        self.paf_samples >= PAF_SAMPLES as u64 && self.sf_samples >= SF_SAMPLES as u64
    }

    /// Feed one byte address; returns false once the sampler is full (stop feeding). The
    /// plain form of `feed_all`, kept as the reference its test compares with.
    #[cfg(test)]
    fn feed(&mut self, addr: u64) -> bool {
        if self.paf_samples < PAF_SAMPLES as u64 {
            self.paf_hits += u64::from(self.paf.observe(addr / PAGE_BYTES));
            // Lines are mixed first: the paper's bit-slice hashes alias strided lines.
            let line = addr / LINE_BYTES;
            let hit = self
                .lf
                .observe(line.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 36);
            self.lf_hits += u64::from(hit);
            if !hit && self.fetched.samples < FETCHED_SAMPLES {
                self.fetched.feed(addr);
            }
            let f = &mut self.fetched;
            f.band = (f.band.0.min(line), f.band.1.max(line));
            self.paf_samples += 1;
            if self.paf_samples == PAF_SAMPLES as u64 / 4 {
                f.front_at_quarter = f.band.1;
                f.lines_at_quarter = self.paf_samples - self.lf_hits;
            }
        }
        if let Some(prev) = self.last {
            if self.sf_samples < SF_SAMPLES as u64 {
                self.sf_hits += u64::from(self.sf.observe(addr.wrapping_sub(prev)));
                self.sf_samples += 1;
            }
        }
        self.last = Some(addr);
        !self.full()
    }

    /// Empty it as new, in place: its filters' memory stays (a test checks that it equals a
    /// new sampler).
    pub fn reset(&mut self) {
        self.paf.clear();
        self.sf.clear();
        self.lf.clear();
        self.last = None;
        self.paf_hits = 0;
        self.lf_hits = 0;
        self.paf_samples = 0;
        self.sf_hits = 0;
        self.sf_samples = 0;
        self.fetched.reset();
    }

    /// Feed addresses until the sampler is full; returns how many it took. The same
    /// counts as feeding one address at a time (a test checks it), in two tight
    /// passes: pages and lines, then strides. The LF's misses are gathered without a
    /// branch and fed to the fetched-line filters after the first pass.
    pub fn feed_all(&mut self, addrs: &[u64]) -> usize {
        let paf = (PAF_SAMPLES as u64 - self.paf_samples.min(PAF_SAMPLES as u64)) as usize;
        let strides = (SF_SAMPLES as u64 - self.sf_samples.min(SF_SAMPLES as u64)) as usize;
        let sf = strides + usize::from(strides > 0 && self.last.is_none());
        let taken = paf.max(sf).max(1).min(addrs.len());
        let mut missed = [0u64; FETCHED_SAMPLES as usize + 1];
        let room = (FETCHED_SAMPLES - self.fetched.samples) as usize;
        let mut n = 0;
        let quarter = PAF_SAMPLES as u64 / 4;
        // A key equal to the one just observed hits and changes nothing (a hit neither sets
        // nor clears): skipping it spares a sweep the wait on the store it just made.
        let (mut page_was, mut line_was) = (u64::MAX, u64::MAX);
        let (mut paf_in, mut lf_in) = (self.paf.inputs, self.lf.inputs);
        let (mut paf_hits, mut lf_hits) = (0, 0);
        let (mut lo, mut hi) = self.fetched.band;
        let first = self.paf_samples;
        for (k, &addr) in addrs[..paf.min(taken)].iter().enumerate() {
            let page = addr / PAGE_BYTES;
            paf_hits += u64::from(
                page == page_was
                    || Bloom::<BITS, MAX_INPUTS>::observe_in(&mut self.paf.bits, &mut paf_in, page),
            );
            page_was = page;
            let line = addr / LINE_BYTES;
            let hit = line == line_was
                || Bloom::<LF_BITS, LF_MAX_INPUTS>::observe_in(
                    &mut self.lf.bits,
                    &mut lf_in,
                    line.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 36,
                );
            line_was = line;
            lf_hits += u64::from(hit);
            missed[n] = addr;
            n += usize::from(!hit & (n < room));
            (lo, hi) = (lo.min(line), hi.max(line));
            if first + k as u64 + 1 == quarter {
                self.fetched.front_at_quarter = hi;
                self.fetched.lines_at_quarter = quarter - (self.lf_hits + lf_hits);
            }
        }
        self.paf.inputs = paf_in;
        self.lf.inputs = lf_in;
        self.paf_hits += paf_hits;
        self.lf_hits += lf_hits;
        self.paf_samples += paf.min(taken) as u64;
        self.fetched.band = (lo, hi);
        self.fetched.feed_all(&missed[..n]);
        let strided = &addrs[..sf.min(taken)];
        let (mut prev, rest) = match (self.last, strided) {
            (Some(p), _) => (p, strided),
            (None, [first, rest @ ..]) => (*first, rest),
            (None, []) => (0, strided),
        };
        let mut stride_was = None;
        for &addr in rest {
            let stride = addr.wrapping_sub(prev);
            let hit = stride_was == Some(stride) || self.sf.observe(stride);
            self.sf_hits += u64::from(hit);
            stride_was = Some(stride);
            prev = addr;
        }
        self.sf_samples += rest.len() as u64;
        if taken > 0 {
            self.last = Some(addrs[taken - 1]);
        }
        taken
    }
}

impl Default for Fetched {
    fn default() -> Self {
        Fetched {
            paf: Bloom::default(),
            sf: Bloom::default(),
            last: None,
            samples: 0,
            paf_hits: 0,
            sf_hits: 0,
            sf_samples: 0,
            paf_cold: 0,
            sf_cold: 0,
            band: (u64::MAX, 0),
            front_at_quarter: 0,
            lines_at_quarter: 0,
        }
    }
}

impl Fetched {
    /// [`Sampler::reset`]'s part.
    fn reset(&mut self) {
        self.paf.clear();
        self.sf.clear();
        self.last = None;
        self.samples = 0;
        self.paf_hits = 0;
        self.sf_hits = 0;
        self.sf_samples = 0;
        self.paf_cold = 0;
        self.sf_cold = 0;
        self.band = (u64::MAX, 0);
        self.front_at_quarter = 0;
        self.lines_at_quarter = 0;
    }

    /// A line the LF missed, at byte `addr`: into this PAF and SF (the reference of
    /// `feed_all`, as `Sampler::feed` is).
    #[cfg(test)]
    fn feed(&mut self, addr: u64) {
        self.samples += 1;
        self.paf_cold += u64::from(self.paf.is_empty());
        self.paf_hits += u64::from(self.paf.observe(addr / PAGE_BYTES));
        if let Some(prev) = self.last {
            self.sf_cold += u64::from(self.sf.is_empty());
            self.sf_hits += u64::from(self.sf.observe(addr.wrapping_sub(prev)));
            self.sf_samples += 1;
        }
        self.last = Some(addr);
    }

    /// Each of `addrs` into this PAF and SF, skipping (as hits) a page or stride equal to
    /// the one just observed.
    fn feed_all(&mut self, addrs: &[u64]) {
        let (mut page_was, mut stride_was) = (u64::MAX, None);
        for &addr in addrs {
            let page = addr / PAGE_BYTES;
            if page == page_was {
                self.paf_hits += 1;
            } else {
                self.paf_cold += u64::from(self.paf.is_empty());
                self.paf_hits += u64::from(self.paf.observe(page));
            }
            page_was = page;
            if let Some(prev) = self.last {
                let stride = addr.wrapping_sub(prev);
                if stride_was == Some(stride) {
                    self.sf_hits += 1;
                } else {
                    self.sf_cold += u64::from(self.sf.is_empty());
                    self.sf_hits += u64::from(self.sf.observe(stride));
                }
                stride_was = Some(stride);
                self.sf_samples += 1;
            }
            self.last = Some(addr);
        }
        self.samples += addrs.len() as u64;
    }

    /// Lines the band's top advanced per sampled access over the last three quarters of
    /// the sample.
    fn front_rate(&self, samples: u64) -> f64 {
        let top = self.band.1;
        let later = samples - samples / 4;
        top.saturating_sub(self.front_at_quarter) as f64 / later.max(1) as f64
    }
}

thread_local! {
    /// Each thread's samplers, kept between analyses.
    static SAMPLERS: RefCell<Vec<Sampler>> = const { RefCell::new(Vec::new()) };
}

/// Run `f` on `n` empty samplers. They are this thread's, kept between calls: a sampler is
/// 24 KiB of filters, and on a virtual machine the first-touch faults of fresh memory for
/// them cost more than the sampling (measured: 8 us a sampler, against 3-13 us of feeding).
/// A nested call gets fresh ones.
pub fn with_samplers<R>(n: usize, f: impl FnOnce(&mut [Sampler]) -> R) -> R {
    SAMPLERS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut kept) => {
            let len = kept.len().max(n);
            kept.resize_with(len, Sampler::default);
            let samplers = &mut kept[..n];
            samplers.iter_mut().for_each(Sampler::reset);
            f(samplers)
        }
        Err(_) => f(&mut vec![Sampler::default(); n]),
    })
}

/// Hit rates of a set of samplers (laid out as C lays it out: the C API hands it over as
/// `tm_rates`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// PAF hit rate: near 1 dense (pages reused), near 0 sparse.
    pub r_paf: f64,
    /// SF hit rate: near 1 regular (few strides), near 0 irregular.
    pub r_sf: f64,
    /// LF hit rate: the share of accesses to a line used shortly before.
    #[serde(default)]
    pub r_lf: f64,
    /// PAF hit rate over the lines the LF missed (the fetched lines' sparseness), of a warm
    /// filter (observations of an empty one left out; 1 with none left).
    #[serde(default)]
    pub r_paf_fetched: f64,
    /// SF hit rate over the lines the LF missed (the fetched lines' regularity), warm as
    /// `r_paf_fetched` is.
    #[serde(default)]
    pub r_sf_fetched: f64,
    /// Lines the top of a thread's sampled band of lines advanced per access, pooled: the
    /// rate a sweep fetches new lines once the lines behind its front are cached.
    #[serde(default)]
    pub r_front: f64,
    /// The widest band of lines one thread's sample spans (highest less lowest, plus one).
    #[serde(default)]
    pub band_lines: u64,
    /// How the distinct lines a thread's sample touches grow with its length `n`, as
    /// `n^ws_exponent` between a quarter of the sample and all of it: 1 when every access
    /// is as likely to fetch late as early (a stream, a uniform gather), below 1 when a
    /// few hot lines take ever more of the accesses (a power-law gather).
    #[serde(default = "one")]
    pub ws_exponent: f64,
    /// Accesses per thread a sample was taken from (mean).
    #[serde(default)]
    pub sampled_per_thread: f64,
    /// Accesses per thread in the whole loop, when known (0: not known): the working set
    /// is extrapolated to it ([`BreakEven::fetches`]).
    #[serde(default)]
    pub accesses_per_thread: f64,
    /// Addresses sampled in all.
    pub samples: u64,
}

fn one() -> f64 {
    1.0
}

/// Pool the samplers' counts (the paper sums the threads' private counters).
///
/// # Errors
/// [`Error::InvalidArgument`] when no sampler saw an address and a stride.
pub fn rates(samplers: &[Sampler]) -> Result<Rates> {
    let sum = |f: fn(&Sampler) -> u64| samplers.iter().map(f).sum::<u64>();
    let (ph, ps, sh, ss, lh) = (
        sum(|s| s.paf_hits),
        sum(|s| s.paf_samples),
        sum(|s| s.sf_hits),
        sum(|s| s.sf_samples),
        sum(|s| s.lf_hits),
    );
    if ps == 0 || ss == 0 {
        return Err(Error::InvalidArgument(format!(
            "pattern analysis: the sampler saw {ps} addresses and {ss} strides; a stream needs at \
             least two addresses per thread"
        )));
    }
    let warm = |hits: u64, n: u64, cold: u64| {
        let n = n - cold;
        if n == 0 {
            1.0
        } else {
            hits as f64 / n as f64
        }
    };
    let r_paf_fetched = warm(
        sum(|s| s.fetched.paf_hits),
        sum(|s| s.fetched.samples),
        sum(|s| s.fetched.paf_cold),
    );
    let r_sf_fetched = warm(
        sum(|s| s.fetched.sf_hits),
        sum(|s| s.fetched.sf_samples),
        sum(|s| s.fetched.sf_cold),
    );
    let front: f64 = samplers
        .iter()
        .map(|s| s.fetched.front_rate(s.paf_samples) * s.paf_samples as f64)
        .sum();
    Ok(Rates {
        r_paf: ph as f64 / ps as f64,
        r_sf: sh as f64 / ss as f64,
        r_lf: lh as f64 / ps as f64,
        r_paf_fetched,
        r_sf_fetched,
        r_front: front / ps as f64,
        band_lines: samplers
            .iter()
            .filter(|s| s.paf_samples > 0)
            .map(|s| s.fetched.band.1 - s.fetched.band.0 + 1)
            .max()
            .unwrap_or(0),
        ws_exponent: ws_exponent(
            sum(|s| s.fetched.lines_at_quarter),
            ps - lh,
            samplers.iter().all(|s| s.paf_samples >= PAF_SAMPLES as u64),
        ),
        sampled_per_thread: ps as f64 / samplers.len() as f64,
        accesses_per_thread: 0.0,
        samples: ps,
    })
}

/// The working set's growth exponent from the distinct lines at a quarter of the samples
/// and at all of them (1 unless every sample was full and both counts are positive).
fn ws_exponent(at_quarter: u64, at_end: u64, full: bool) -> f64 {
    if !full || at_quarter == 0 {
        return 1.0;
    }
    ((at_end.max(at_quarter) as f64 / at_quarter as f64).ln() / 4f64.ln()).clamp(0.0, 1.0)
}

/// Analyse an index stream as `threads` threads would see it under a static schedule (each
/// its contiguous share, sampled from its start): element `i` is at byte `i * elem_bytes`.
/// Only the sampled indices are read.
///
/// # Errors
/// [`Error::InvalidArgument`] for an empty stream, zero threads or zero-sized elements, or a
/// negative sampled index (naming its position).
pub fn analyse_indices(indices: &[i64], elem_bytes: u64, threads: usize) -> Result<Rates> {
    if indices.is_empty() {
        tiermem_core::bail!("pattern analysis: the index stream is empty");
    }
    if threads == 0 || elem_bytes == 0 {
        tiermem_core::bail!("pattern analysis: threads ({threads}) and element bytes ({elem_bytes}) must be positive");
    }
    let share = indices.len().div_ceil(threads);
    let parts = indices.len().div_ceil(share);
    let mut r = with_samplers(parts, |samplers| {
        for (p, (part, s)) in indices.chunks(share).zip(samplers.iter_mut()).enumerate() {
            let wanted = &part[..part.len().min(WANTED)];
            let addrs = wanted
                .iter()
                .enumerate()
                .map(|(k, &i)| match u64::try_from(i) {
                    Ok(i) => Ok(i.wrapping_mul(elem_bytes)),
                    Err(_) => Err(Error::InvalidArgument(format!(
                        "pattern analysis: index {} is negative ({i})",
                        p * share + k
                    ))),
                })
                .collect::<Result<Vec<_>>>()?;
            s.feed_all(&addrs);
        }
        rates(samplers)
    })?;
    r.accesses_per_thread = indices.len() as f64 / parts as f64;
    Ok(r)
}

/// How a chunk is used in its loop (the paper's `U`, `R`, `W`, Table 4).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Use {
    /// Accesses to the chunk over its elements.
    pub u: f64,
    /// Whether the loop reads it (then it is copied in).
    pub read: bool,
    /// Whether the loop writes it (then it is copied back).
    pub write: bool,
}

/// Gains per GB (slow-device time less fast-device time, s/GB) of one access mode on the
/// calibration patterns (eq. 7).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Boosts {
    /// Random accesses (`R_sf` ~ 0, `R_paf` ~ 0).
    pub random: f64,
    /// Accesses at a long stride (`R_sf` ~ 1, `R_paf` ~ 0).
    pub strided: f64,
    /// Sequential streaming (`R_sf` ~ 1, `R_paf` ~ 1).
    pub sequential: f64,
}

impl Boosts {
    /// Eq. 8: the linear gain at `(r_sf, r_paf)`.
    #[must_use]
    pub fn at(&self, r_sf: f64, r_paf: f64) -> f64 {
        self.random - (self.random - self.strided) * r_sf - (self.strided - self.sequential) * r_paf
    }
}

/// The calibrated break-even line of one slow/fast device pair.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BreakEven {
    /// Gains when the loop only reads.
    pub read: Boosts,
    /// Gains when it only writes.
    pub write: Boosts,
    /// Gains when it reads and writes.
    pub read_write: Boosts,
    /// Copy-in time, s/GB (slow to fast).
    pub t_1st: f64,
    /// Copy-back time, s/GB (fast to slow).
    pub t_3rd: f64,
    /// The LF hit rates of the random, strided and sequential calibration patterns (all 0:
    /// the paper's rule).
    #[serde(default)]
    pub lines: [f64; 3],
    /// Lines a core's cache holds for one stream (0: no sweep model, see
    /// [`BreakEven::fetches`]).
    #[serde(default)]
    pub cache_lines: u64,
}

/// A staging decision and the figures behind it (s/GB of chunk).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Decision {
    /// Whether to stage: `t_boost - t_copy > t_th` (eq. 9).
    pub stage: bool,
    /// Predicted gain of running on the fast device: eq. 4-5 and 8 per line fetched, times
    /// the lines fetched per element `U (1 - R_lf)`.
    pub t_boost: f64,
    /// The paper's predicted gain (eq. 4-5, 8: per reference, times `U`).
    pub t_boost_paper: f64,
    /// The paper's decision: `t_boost_paper - t_copy > t_th`.
    pub stage_paper: bool,
    /// Copy time (eq. 3): in if read, back if written.
    pub t_copy: f64,
}

impl BreakEven {
    /// Lines fetched per sampled access: the LF's misses, `1 - R_lf`; but when a thread's
    /// sample spans a band of lines the cache holds, the loop sweeps that band (a stencil, a
    /// mesh, a band matrix), and once its first pass has filled the cache only the band's
    /// advancing top fetches: `R_front`, if lower. A sample from the start of a sweep sees
    /// every trailing run of the band fetch its lines for the first time, which the LF
    /// counts and the cache will not.
    ///
    /// And when the loop is longer than the sample (`accesses_per_thread`), the sample's
    /// distinct lines `d0` in `n0` accesses are extrapolated along `n^ws_exponent`: while
    /// the working set `d(N)` of the whole loop fits the cache, its lines are fetched once,
    /// `d(N) / N` per access; past it, a cache of `C` lines misses at the working set's
    /// slope where it reaches `C` (the working-set model of LRU), `ws_exponent * C / T`
    /// with `d(T) = C`. A power-law gather's prefix sees its hot lines arrive and
    /// overstates the misses of a loop that then hits them for a long time.
    #[must_use]
    pub fn fetches(&self, r: &Rates) -> f64 {
        let lf = 1.0 - r.r_lf;
        let c = self.cache_lines as f64;
        let (n0, n) = (r.sampled_per_thread, r.accesses_per_thread);
        let beta = r.ws_exponent;
        let extrapolated = if c > 0.0 && n > n0 && n0 > 0.0 && lf > 0.0 && beta < 1.0 {
            let d0 = lf * n0;
            let dn = d0 * (n / n0).powf(beta);
            if dn <= c {
                dn / n
            } else if beta > 0.0 && d0 < c {
                let t = n0 * (c / d0).powf(1.0 / beta);
                beta * c / t
            } else {
                lf // the sample's own lines overflow the cache: it misses as sampled
            }
        } else {
            lf
        };
        let lf = extrapolated.min(lf);
        if r.band_lines > 0 && r.band_lines <= self.cache_lines {
            lf.min(r.r_front)
        } else {
            lf
        }
    }

    /// Decide for a chunk with these rates and use, at threshold `t_th` (s/GB).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a use that neither reads nor writes, or a negative or
    /// non-finite `u`.
    pub fn decide(&self, r: &Rates, u: &Use, t_th: f64) -> Result<Decision> {
        if !(u.u >= 0.0 && u.u.is_finite()) {
            tiermem_core::bail!(
                "staging: accesses per element U must be a finite number >= 0, got {}",
                u.u
            );
        }
        let b = match (u.read, u.write) {
            (true, false) => &self.read,
            (false, true) => &self.write,
            (true, true) => &self.read_write,
            (false, false) => {
                tiermem_core::bail!(
                    "staging: a chunk the loop neither reads nor writes needs no staging"
                )
            }
        };
        let t_boost_paper = u.u * b.at(r.r_sf, r.r_paf);
        // Each corner's gain per line it fetched (a corner that reuses lines fetches fewer).
        let per_line = |g: f64, h: f64| g / (1.0 - h).max(1e-3);
        let lines = Boosts {
            random: per_line(b.random, self.lines[0]),
            strided: per_line(b.strided, self.lines[1]),
            sequential: per_line(b.sequential, self.lines[2]),
        };
        let t_boost = u.u * self.fetches(r) * lines.at(r.r_sf_fetched, r.r_paf_fetched);
        let t_copy =
            f64::from(u8::from(u.read)) * self.t_1st + f64::from(u8::from(u.write)) * self.t_3rd;
        Ok(Decision {
            stage: t_boost - t_copy > t_th,
            t_boost,
            t_copy,
            t_boost_paper,
            stage_paper: t_boost_paper - t_copy > t_th,
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Streams that mix runs of the patterns the filters tell apart: sequential, strided,
    /// repeated and random addresses.
    fn stream() -> impl Strategy<Value = Vec<u64>> {
        let run = (0u8..4, any::<u64>(), 1u64..5000, 1usize..900).prop_map(
            |(kind, seed, stride, len)| {
                let mut x = seed >> 20;
                (0..len)
                    .map(|k| match kind {
                        0 => (seed >> 24) + 8 * k as u64,
                        1 => (seed >> 24) + stride * 8 * k as u64,
                        2 => (seed >> 24) + 64 * (k as u64 % stride.min(40)),
                        _ => {
                            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                            x >> 30
                        }
                    })
                    .collect::<Vec<_>>()
            },
        );
        prop::collection::vec(run, 1..8).prop_map(|runs| runs.concat())
    }

    proptest! {
        #[test]
        fn a_reset_sampler_is_a_new_one(addrs in stream()) {
            let mut s = Sampler::default();
            s.feed_all(&addrs);
            s.reset();
            prop_assert_eq!(&s, &Sampler::default());
        }

        #[test]
        fn feeding_a_batch_counts_as_feeding_one_by_one(addrs in stream(), cuts in prop::collection::vec(0usize..4000, 0..4)) {
            let mut one = Sampler::default();
            let mut took_one = 0;
            for &a in &addrs {
                took_one += 1;
                if !one.feed(a) {
                    break;
                }
            }
            let mut batch = Sampler::default();
            let mut at = 0;
            let mut cuts = cuts;
            cuts.sort_unstable();
            for c in cuts.into_iter().chain([addrs.len()]) {
                let c = c.clamp(at, addrs.len());
                at += batch.feed_all(&addrs[at..c]);
                if batch.full() {
                    break;
                }
            }
            prop_assert_eq!(at, took_one);
            prop_assert_eq!(&batch, &one);
        }
    }

    fn lcg(n: usize, range: i64) -> Vec<i64> {
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                ((x >> 11) % range as u64) as i64
            })
            .collect()
    }

    #[test]
    fn the_three_calibration_patterns_land_on_their_corners() {
        let seq: Vec<i64> = (0..1 << 20).collect();
        let r = analyse_indices(&seq, 8, 4).unwrap();
        assert!(r.r_paf > 0.99 && r.r_sf > 0.99, "{r:?}");
        let strided: Vec<i64> = (0..1 << 16).map(|i| i * 1024).collect(); // 8 KiB apart
        let r = analyse_indices(&strided, 8, 4).unwrap();
        assert!(r.r_paf < 0.2 && r.r_sf > 0.99, "{r:?}");
        let random = lcg(1 << 16, 1 << 27);
        let r = analyse_indices(&random, 8, 4).unwrap();
        assert!(r.r_paf < 0.2 && r.r_sf < 0.2, "{r:?}");
        assert_eq!(r.samples, 4 * PAF_SAMPLES as u64);
    }

    #[test]
    fn a_power_law_gather_extrapolates_below_its_sampled_misses() {
        // Zipf-like: index k drawn as floor(1 / u^1.6) over a large array, so a few hot
        // elements take most accesses and new ones keep arriving ever more slowly.
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let zipf: Vec<i64> = (0..1 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let u = (x >> 11) as f64 / (1u64 << 53) as f64;
                ((1.0 / u.max(1e-12).powf(1.6)) as i64).min(1 << 30) * 1031 % (1 << 30)
            })
            .collect();
        let r = analyse_indices(&zipf, 8, 2).unwrap();
        assert!(r.ws_exponent < 0.9, "{r:?}");
        assert_eq!(r.accesses_per_thread, (1 << 19) as f64);
        let line = BreakEven {
            read: Boosts {
                random: 1.0,
                strided: 1.0,
                sequential: 0.1,
            },
            write: Boosts {
                random: 1.0,
                strided: 1.0,
                sequential: 0.1,
            },
            read_write: Boosts {
                random: 1.0,
                strided: 1.0,
                sequential: 0.1,
            },
            t_1st: 0.5,
            t_3rd: 0.5,
            lines: [0.0; 3],
            cache_lines: 4096,
        };
        let f = line.fetches(&r);
        assert!(f < 0.5 * (1.0 - r.r_lf), "{f} vs {}", 1.0 - r.r_lf);
        // Unknown loop length, or no cache model: the sample's own rate.
        let short = Rates {
            accesses_per_thread: 0.0,
            ..r
        };
        assert_eq!(line.fetches(&short), 1.0 - r.r_lf);
        // A uniform gather grows linearly: nothing to extrapolate.
        let uniform = lcg(1 << 18, 1 << 27);
        let r = analyse_indices(&uniform, 8, 2).unwrap();
        assert!(r.ws_exponent > 0.97, "{r:?}");
        assert!((line.fetches(&r) - (1.0 - r.r_lf)).abs() < 0.05);
    }

    #[test]
    fn a_filter_clears_after_its_inputs() {
        let mut b: Bloom = Bloom::default();
        for x in 0..u64::from(MAX_INPUTS) {
            assert!(!b.observe(x));
        }
        assert!(b.test(0));
        b.set(1_000_000); // the 257th input clears first
        assert!(!b.test(0) && b.test(1_000_000));
    }

    #[test]
    fn decisions_follow_the_break_even_line() {
        let boosts = Boosts {
            random: 2.0,
            strided: 1.0,
            sequential: 0.1,
        };
        let be = BreakEven {
            read: boosts,
            write: boosts,
            read_write: boosts,
            t_1st: 0.5,
            t_3rd: 0.6,
            lines: [0.0; 3],
            cache_lines: 0,
        };
        let random = Rates {
            r_paf: 0.0,
            r_sf: 0.0,
            r_lf: 0.0,
            r_paf_fetched: 0.0,
            r_sf_fetched: 0.0,
            r_front: 1.0,
            band_lines: 1 << 20,
            ws_exponent: 1.0,
            sampled_per_thread: 1.0,
            accesses_per_thread: 0.0,
            samples: 1,
        };
        let seq = Rates {
            r_paf: 1.0,
            r_sf: 1.0,
            r_lf: 0.0,
            r_paf_fetched: 1.0,
            r_sf_fetched: 1.0,
            r_front: 1.0,
            band_lines: 256,
            ws_exponent: 1.0,
            sampled_per_thread: 1.0,
            accesses_per_thread: 0.0,
            samples: 1,
        };
        let read = Use {
            u: 1.0,
            read: true,
            write: false,
        };
        let rw = Use {
            u: 1.0,
            read: true,
            write: true,
        };
        assert!(be.decide(&random, &read, 0.0).unwrap().stage);
        assert!(!be.decide(&seq, &read, 0.0).unwrap().stage);
        let d = be.decide(&random, &rw, 0.0).unwrap();
        assert_eq!((d.t_boost, d.t_copy), (2.0, 1.1));
        assert!(!be.decide(&random, &rw, 1.0).unwrap().stage); // a higher threshold stages less
        let low_u = Use {
            u: 0.25,
            read: true,
            write: false,
        };
        assert!(!be.decide(&random, &low_u, 0.0).unwrap().stage);
        assert!(be
            .decide(
                &random,
                &Use {
                    u: 1.0,
                    read: false,
                    write: false
                },
                0.0
            )
            .is_err());
        assert!(analyse_indices(&[], 8, 1)
            .unwrap_err()
            .to_string()
            .contains("empty"));
        assert!(analyse_indices(&[5], 8, 1)
            .unwrap_err()
            .to_string()
            .contains("at least two"));
        assert!(analyse_indices(&[5, 6, -1], 8, 1)
            .unwrap_err()
            .to_string()
            .contains("index 2 is negative"));
    }
}
