//! The Criteo display-advertising TSV format (the Kaggle `train.txt`, the Terabyte `day_N`
//! files), read, parsed, hashed and batched in the core: per line a 0/1 label, 13 integer
//! and 26 categorical (hexadecimal) features, tab-separated, any feature possibly empty.
//!
//! The semantics are those of the Python reader (`tiermem.dlrm.data.criteo`), which stays
//! the reference: a missing integer is 0, a negative one 0, each becomes `ln(x + 1)`; a
//! categorical value is hashed into its table (`value % rows[t]`), a missing one is 0. A
//! field parses as Python's `int(field)` and `int(field, 16)` would (surrounding ASCII
//! whitespace, a sign, underscores between digits, a `0x` prefix for hexadecimal), and a
//! malformed line is rejected with the reference's words for the same reason. A line whose
//! content (without its newline) is longer than `max_line` bytes is malformed; no more than
//! `max_line + 1` bytes of a line are ever held, so memory stays bounded on any file.
//!
//! [`Reader`] reads a byte range of a file, lines that *start* in `[start, end)`, so that
//! ranks given adjacent line-aligned ranges ([`line_aligned_ranges`]) read every line once.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use tiermem_core::{Error, Result};

/// Integer features per line.
pub const INT_FEATURES: usize = 13;
/// Categorical features per line.
pub const CAT_FEATURES: usize = 26;
/// Columns per line (label, integers, categoricals).
pub const COLUMNS: usize = 1 + INT_FEATURES + CAT_FEATURES;
/// Longest integer field: an int64 in decimal with its sign.
pub const MAX_INT_DIGITS: usize = 20;
/// Longest categorical field: 64 bits in hexadecimal.
pub const MAX_HEX_DIGITS: usize = 16;
/// Bytes read from the file at a time.
const CHUNK: usize = 1 << 20;
/// Bad lines whose reasons are kept.
pub const EXAMPLES: usize = 5;

/// One parsed sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// 0 or 1.
    pub label: f32,
    /// `ln(max(x, 0) + 1)` per integer feature (0 when empty).
    pub dense: [f32; INT_FEATURES],
    /// Each categorical value modulo its table's rows (0 when empty).
    pub cats: [i64; CAT_FEATURES],
}

/// Python's `repr()` of the first 20 bytes of a field, as the reference quotes it.
fn quoted(field: &[u8]) -> String {
    let b = &field[..field.len().min(20)];
    let q = if b.contains(&b'\'') && !b.contains(&b'"') {
        b'"'
    } else {
        b'\''
    };
    let mut s = String::from("b");
    s.push(q as char);
    for &c in b {
        match c {
            b'\\' => s.push_str("\\\\"),
            b'\t' => s.push_str("\\t"),
            b'\n' => s.push_str("\\n"),
            b'\r' => s.push_str("\\r"),
            c if c == q => {
                s.push('\\');
                s.push(c as char);
            }
            0x20..=0x7e => s.push(c as char),
            c => s.push_str(&format!("\\x{c:02x}")),
        }
    }
    s.push(q as char);
    s
}

/// Python's ASCII whitespace (`bytes.strip()`, `int()`).
fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

fn strip(mut b: &[u8]) -> &[u8] {
    while let [c, rest @ ..] = b {
        if !is_space(*c) {
            break;
        }
        b = rest;
    }
    while let [rest @ .., c] = b {
        if !is_space(*c) {
            break;
        }
        b = rest;
    }
    b
}

/// `int(field, radix)` as Python parses it, for fields short enough to fit an `i128`.
fn py_int(field: &[u8], radix: u32) -> Option<i128> {
    let mut s = strip(field);
    let negative = match s.first() {
        Some(b'-') => {
            s = &s[1..];
            true
        }
        Some(b'+') => {
            s = &s[1..];
            false
        }
        _ => false,
    };
    let mut prefixed = false;
    if radix == 16 && s.len() >= 2 && s[0] == b'0' && (s[1] == b'x' || s[1] == b'X') {
        s = &s[2..];
        prefixed = true;
    }
    if prefixed && s.first() == Some(&b'_') {
        s = &s[1..]; // `0x_ff`: an underscore may follow the prefix
    }
    if s.is_empty() {
        return None;
    }
    let mut v: i128 = 0;
    let mut last_underscore = true; // no leading underscore (past the prefix's one)
    for &c in s {
        if c == b'_' {
            if last_underscore {
                return None;
            }
            last_underscore = true;
            continue;
        }
        let d = (c as char).to_digit(radix)?;
        v = v
            .checked_mul(i128::from(radix))?
            .checked_add(i128::from(d))?;
        last_underscore = false;
    }
    if last_underscore {
        return None; // a trailing underscore
    }
    Some(if negative { -v } else { v })
}

/// `ln(max(v, 0) + 1)` as `f32`, computed as the reference does (`f64` logarithm of the
/// integer converted to `f64`, then rounded); small values from a table of the same figures.
fn log1p_int(v: i128) -> f32 {
    const SMALL: usize = 4096;
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    let v = v.max(0);
    if v < SMALL as i128 {
        let t = TABLE.get_or_init(|| (0..SMALL).map(|x| ((x as f64) + 1.0).ln() as f32).collect());
        return t[v as usize];
    }
    ((v as f64) + 1.0).ln() as f32
}

/// Parse one line (without its newline or with it) into a sample, or the reference's
/// reason for refusing it.
///
/// # Errors
/// The reason, in the reference reader's words.
pub fn parse_line(line: &[u8], rows: &[u64; CAT_FEATURES]) -> std::result::Result<Sample, String> {
    let mut end = line.len();
    while end > 0 && matches!(line[end - 1], b'\r' | b'\n') {
        end -= 1;
    }
    let line = &line[..end];
    let mut cols: [&[u8]; COLUMNS] = [&[]; COLUMNS];
    let mut n = 0;
    let mut from = 0;
    for tab in memchr::memchr_iter(b'\t', line).chain(std::iter::once(line.len())) {
        if n < COLUMNS {
            cols[n] = &line[from..tab];
        }
        n += 1;
        from = tab + 1;
    }
    if n != COLUMNS {
        return Err(format!("{n} columns, expected {COLUMNS}"));
    }
    let label = match cols[0] {
        b"0" => 0.0,
        b"1" => 1.0,
        other => return Err(format!("label {} is not 0 or 1", quoted(other))),
    };
    let mut s = Sample {
        label,
        dense: [0.0; INT_FEATURES],
        cats: [0; CAT_FEATURES],
    };
    for (k, &c) in cols.iter().enumerate().take(1 + INT_FEATURES).skip(1) {
        if c.is_empty() {
            continue;
        }
        if c.len() > MAX_INT_DIGITS {
            return Err(format!(
                "integer feature {k} has {} digits (more than a 64-bit integer)",
                c.len()
            ));
        }
        let v = py_int(c, 10).ok_or_else(|| format!("integer feature {k} is {}", quoted(c)))?;
        s.dense[k - 1] = log1p_int(v);
    }
    for k in 0..CAT_FEATURES {
        let c = cols[1 + INT_FEATURES + k];
        if c.is_empty() {
            continue;
        }
        let f = k + 1;
        if c.len() > MAX_HEX_DIGITS {
            return Err(format!(
                "categorical feature {f} has {} hex digits (more than 64 bits)",
                c.len()
            ));
        }
        let v = py_int(c, 16)
            .ok_or_else(|| format!("categorical feature {f} is {}, not hexadecimal", quoted(c)))?;
        if v < 0 {
            return Err(format!("categorical feature {f} is negative"));
        }
        // 0 <= v < 2^64: at most 16 hexadecimal digits, and not negative.
        s.cats[k] = (v as u64 % rows[k]) as i64;
    }
    Ok(s)
}

/// Where a batch goes: `labels[i]`, `dense[i * 13 + f]`, `cats[t * cap + i]` (table-major),
/// for `i < cap`.
pub struct Out<'a> {
    /// Labels.
    pub labels: &'a mut [f32],
    /// Integer features, row-major.
    pub dense: &'a mut [f32],
    /// Categorical indices, one run of `cap` per table.
    pub cats: &'a mut [i64],
}

/// A reader of the lines starting in `[start, end)` of one file.
pub struct Reader {
    path: String,
    file: File,
    rows: [u64; CAT_FEATURES],
    max_line: usize,
    stop_on_bad: bool,
    buf: Vec<u8>,
    /// Unconsumed bytes are `buf[head..]`.
    head: usize,
    eof: bool,
    /// File offset of `buf[head]`: the start of the next line.
    pos: u64,
    end: u64,
    /// Lines read (blank, good and bad) since the start.
    pub lines: u64,
    /// Malformed lines skipped.
    pub bad: u64,
    /// The first [`EXAMPLES`] skipped lines: (line number from the start, reason).
    pub examples: Vec<(u64, String)>,
    /// With `stop_on_bad`, the malformed line that stopped the read.
    pub failed: Option<(u64, String)>,
}

impl Reader {
    /// Open `path` at byte `start` (a line start: 0, a [`Reader::position`] or a
    /// [`line_aligned_ranges`] bound), reading lines that start before `end` (default: the
    /// file's end). `rows`: each table's rows; `stop_on_bad`: stop at the first malformed
    /// line (else skip and count it).
    ///
    /// # Errors
    /// A file that cannot be opened, a bad range, a table with no rows, a `max_line`
    /// outside 256 bytes to 1 GiB.
    pub fn open(
        path: &str,
        rows: &[u64],
        (start, end): (u64, Option<u64>),
        max_line: u64,
        stop_on_bad: bool,
    ) -> Result<Self> {
        let io = |what: &str, source| Error::Io {
            device: "criteo".into(),
            path: path.into(),
            what: what.into(),
            source,
        };
        tiermem_core::ensure!(
            (256..=1 << 30).contains(&max_line),
            "max_line must be from 256 to 2**30 bytes, got {max_line}"
        );
        let rows: [u64; CAT_FEATURES] = rows.try_into().map_err(|_| {
            Error::InvalidArgument(format!(
                "Criteo has {CAT_FEATURES} categorical features; got {} table sizes",
                rows.len()
            ))
        })?;
        tiermem_core::ensure!(
            rows.iter().all(|&r| r > 0),
            "every table needs at least one row"
        );
        let mut file = File::open(path).map_err(|e| io("opening the file", e))?;
        let size = file
            .metadata()
            .map_err(|e| io("reading its size", e))?
            .len();
        let end = end.unwrap_or(size).min(size);
        tiermem_core::ensure!(
            start <= size && start <= end,
            "byte range [{start}, {end}) is outside the file's {size} bytes"
        );
        file.seek(SeekFrom::Start(start))
            .map_err(|e| io("seeking", e))?;
        Ok(Reader {
            path: path.into(),
            file,
            rows,
            max_line: max_line as usize,
            stop_on_bad,
            buf: Vec::with_capacity(CHUNK),
            head: 0,
            eof: false,
            pos: start,
            end,
            lines: 0,
            bad: 0,
            examples: Vec::new(),
            failed: None,
        })
    }

    /// The byte offset of the next unread line.
    #[must_use]
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Read more of the file into the buffer (dropping what was consumed); false at its end.
    fn refill(&mut self) -> Result<bool> {
        if self.eof {
            return Ok(false);
        }
        self.buf.drain(..self.head);
        self.head = 0;
        let have = self.buf.len();
        self.buf.resize(have + CHUNK, 0);
        let got = self
            .file
            .read(&mut self.buf[have..])
            .map_err(|e| Error::Io {
                device: "criteo".into(),
                path: self.path.clone(),
                what: format!("reading at byte {}", self.pos + have as u64),
                source: e,
            })?;
        self.buf.truncate(have + got);
        self.eof = got == 0;
        Ok(got > 0)
    }

    /// The next line: `Some(Ok(range in buf))`, `Some(Err(bytes))` for a line longer than
    /// `max_line` (consumed and dropped), `None` at the range's or the file's end.
    fn next_line(&mut self) -> Result<Option<std::result::Result<(usize, usize), u64>>> {
        if self.pos >= self.end {
            return Ok(None);
        }
        let mut scanned = 0;
        loop {
            let avail = &self.buf[self.head..];
            if let Some(i) = memchr::memchr(b'\n', &avail[scanned..]) {
                let len = scanned + i; // content, without the newline
                if len > self.max_line {
                    self.consume(len + 1);
                    return Ok(Some(Err(len as u64 + 1)));
                }
                let line = (self.head, self.head + len);
                self.consume(len + 1);
                return Ok(Some(Ok(line)));
            }
            scanned = avail.len();
            if scanned > self.max_line {
                // Too long: drop it up to its newline without holding it.
                let mut dropped = scanned as u64;
                self.consume(scanned);
                loop {
                    if !self.refill()? {
                        return Ok(Some(Err(dropped)));
                    }
                    let avail = &self.buf[self.head..];
                    if let Some(i) = memchr::memchr(b'\n', avail) {
                        self.consume(i + 1);
                        return Ok(Some(Err(dropped + i as u64 + 1)));
                    }
                    dropped += avail.len() as u64;
                    let n = avail.len();
                    self.consume(n);
                }
            }
            if !self.refill()? {
                // The last line, with no newline.
                let avail = self.buf.len() - self.head;
                if avail == 0 {
                    return Ok(None);
                }
                let line = (self.head, self.head + avail);
                self.consume(avail);
                return Ok(Some(Ok(line)));
            }
        }
    }

    fn consume(&mut self, n: usize) {
        self.head += n;
        self.pos += n as u64;
    }

    /// Fill `out` with up to `cap` samples (`cap`: the labels' length). Returns how many;
    /// fewer than `cap` at the range's end, or when a malformed line stopped the read
    /// (`failed`). [`Reader::position`] is then after the last line consumed.
    ///
    /// # Errors
    /// Outputs of the wrong lengths; a read error.
    pub fn fill(&mut self, out: &mut Out<'_>) -> Result<usize> {
        let cap = out.labels.len();
        tiermem_core::ensure!(
            out.dense.len() == cap * INT_FEATURES && out.cats.len() == cap * CAT_FEATURES,
            "a batch of {cap} needs {} dense and {} categorical slots, got {} and {}",
            cap * INT_FEATURES,
            cap * CAT_FEATURES,
            out.dense.len(),
            out.cats.len()
        );
        let mut n = 0;
        while n < cap && self.failed.is_none() {
            let Some(next) = self.next_line()? else {
                break;
            };
            self.lines += 1;
            let parsed = match next {
                Ok((a, b)) => {
                    let line = &self.buf[a..b];
                    if strip(line).is_empty() {
                        continue;
                    }
                    parse_line(line, &self.rows)
                }
                Err(_) => Err(format!(
                    "line longer than {} bytes (max_line)",
                    self.max_line
                )),
            };
            match parsed {
                Ok(s) => {
                    out.labels[n] = s.label;
                    out.dense[n * INT_FEATURES..(n + 1) * INT_FEATURES].copy_from_slice(&s.dense);
                    for (t, &c) in s.cats.iter().enumerate() {
                        out.cats[t * cap + n] = c;
                    }
                    n += 1;
                }
                Err(why) if self.stop_on_bad => self.failed = Some((self.lines, why)),
                Err(why) => {
                    self.bad += 1;
                    if self.examples.len() < EXAMPLES {
                        self.examples.push((self.lines, why));
                    }
                }
            }
        }
        Ok(n)
    }
}

/// Split a file into `parts` byte ranges that start at line starts (each bound moved
/// forward past the next newline), so that readers of adjacent ranges read every line once.
///
/// # Errors
/// Zero parts, or a file that cannot be read.
pub fn line_aligned_ranges(path: &str, parts: u64) -> Result<Vec<(u64, u64)>> {
    tiermem_core::ensure!(
        parts > 0,
        "a file splits into at least one range, got {parts}"
    );
    let io = |what: String, source| Error::Io {
        device: "criteo".into(),
        path: path.into(),
        what,
        source,
    };
    let mut f = File::open(path).map_err(|e| io("opening the file".into(), e))?;
    let size = f
        .metadata()
        .map_err(|e| io("reading its size".into(), e))?
        .len();
    let mut bounds = vec![0u64];
    for k in 1..parts {
        let mut at = (size * k / parts).max(*bounds.last().unwrap_or(&0));
        if at > 0 && at < size {
            // Past the newline that ends the line `at - 1` is in.
            f.seek(SeekFrom::Start(at - 1))
                .map_err(|e| io(format!("seeking to byte {}", at - 1), e))?;
            let mut b = [0u8; 4096];
            'scan: loop {
                let got = f
                    .read(&mut b)
                    .map_err(|e| io(format!("reading at byte {at}"), e))?;
                if got == 0 {
                    at = size;
                    break;
                }
                for (i, &c) in b[..got].iter().enumerate() {
                    if c == b'\n' {
                        at += i as u64;
                        break 'scan;
                    }
                }
                at += got as u64;
            }
        }
        bounds.push(at.min(size));
    }
    bounds.push(size);
    Ok(bounds.windows(2).map(|w| (w[0], w[1])).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_parse_as_python_int_does() {
        assert_eq!(py_int(b" 12 ", 10), Some(12));
        assert_eq!(py_int(b"-1_000", 10), Some(-1000));
        assert_eq!(py_int(b"+007", 10), Some(7));
        for bad in [
            &b"1__0"[..],
            b"_1",
            b"1_",
            b"",
            b" ",
            b"+",
            b"1 2",
            b"0x1",
            b"- 5",
            b"\xff",
        ] {
            assert_eq!(py_int(bad, 10), None, "{bad:?}");
        }
        assert_eq!(py_int(b"0x_ff", 16), Some(255));
        assert_eq!(py_int(b"0XfF", 16), Some(255));
        assert_eq!(py_int(b"-0", 16), Some(0));
        assert_eq!(py_int(b"ffffffffffffffff", 16), Some(u64::MAX.into()));
        for bad in [&b"0x"[..], b"0x__f", b"g", b"_f"] {
            assert_eq!(py_int(bad, 16), None, "{bad:?}");
        }
        assert_eq!(quoted(b"a'b"), "b\"a'b\"");
        assert_eq!(quoted(b"x\x00\\"), "b'x\\x00\\\\'");
    }
}
