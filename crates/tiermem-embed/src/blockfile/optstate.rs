//! A table file's optimizer companion, `PATH.optim`: the fused optimizer's name, its step
//! count and per-row state (Adagrad's sums of squares), so a re-attached table trains on as
//! if it had never been closed. Written like every file tiermem makes (aside, fsynced,
//! renamed over the old companion only), checksummed, and tied to the table file by its
//! shape and layout generation. Little-endian:
//!
//! ```text
//! 0   magic "TMEMOPT1"         8   version u32         12  per-row floats u32
//! 16  rows u64                 24  width u32           28  (zero)
//! 32  generation u64           40  steps u64           48  optimizer name, 16 bytes, NUL-padded
//! 64  crc32c of the floats     68  crc32c of bytes 0..68
//! 72  rows * per-row floats (f32)
//! ```

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use tiermem_core::sys::devfile::MARK_TABLE;
use tiermem_core::sys::files::{self, Create, Replace};

/// The companion's first eight bytes.
pub const MAGIC: [u8; 8] = *b"TMEMOPT1";
const VERSION: u32 = 1;
const HEAD: usize = 72;

/// What a companion holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Saved {
    /// The optimizer's name.
    pub optimizer: String,
    /// Steps taken.
    pub steps: u64,
    /// The table file's layout generation when it was written.
    pub generation: u64,
    /// Rows and width of the table.
    pub rows: u64,
    /// Elements per row.
    pub width: u32,
    /// `rows * per_row` floats (empty for a stateless optimizer).
    pub state: Vec<f32>,
}

/// The companion's path for the table file `path`.
#[must_use]
pub fn path_of(table: &Path) -> PathBuf {
    files::with_suffix(table, ".optim")
}

/// Write `s` as `table`'s companion (aside, fsync, rename over the old companion only).
pub fn write(table: &Path, s: &Saved) -> std::io::Result<()> {
    let per_row = (s.state.len() as u64).checked_div(s.rows).unwrap_or(0);
    let name = s.optimizer.as_bytes();
    if name.len() > 16 || per_row * s.rows != s.state.len() as u64 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "optimizer name over 16 bytes or state not whole rows",
        ));
    }
    let mut head = [0u8; HEAD];
    head[0..8].copy_from_slice(&MAGIC);
    head[8..12].copy_from_slice(&VERSION.to_le_bytes());
    head[12..16].copy_from_slice(&(per_row as u32).to_le_bytes());
    head[16..24].copy_from_slice(&s.rows.to_le_bytes());
    head[24..28].copy_from_slice(&s.width.to_le_bytes());
    head[32..40].copy_from_slice(&s.generation.to_le_bytes());
    head[40..48].copy_from_slice(&s.steps.to_le_bytes());
    head[48..48 + name.len()].copy_from_slice(name);
    let body: &[u8] = bytemuck_f32(&s.state);
    head[64..68].copy_from_slice(&crc32c::crc32c(body).to_le_bytes());
    let hc = crc32c::crc32c(&head[..68]);
    head[68..72].copy_from_slice(&hc.to_le_bytes());
    let dst = path_of(table);
    let tmp = files::with_suffix(&dst, ".tmp");
    let mut f = files::create_aside_marked(
        &tmp,
        Create {
            read: false,
            flags: 0,
            mode: 0o600,
        },
        MARK_TABLE,
    )?;
    let done = (|| {
        f.write_all(&head)?;
        f.write_all(body)?;
        f.sync_all()?;
        files::rename_over(&tmp, &dst, Replace::Marked)
    })();
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// Remove the companion beside a table file about to be created (an earlier table's, whose
/// state is not the new table's): only a file tiermem made (marked, or starting with
/// [`MAGIC`] and this user's); another file of that name is an error naming it.
pub fn remove_orphan(table: &Path) -> Result<(), String> {
    let p = path_of(table);
    let Ok(m) = std::fs::symlink_metadata(&p) else {
        return Ok(());
    };
    let ours = files::marked(&p).is_some()
        || (m.is_file()
            && files::open_existing(&p, false, 0)
                .and_then(|mut f| {
                    let mut magic = [0u8; 8];
                    f.read_exact(&mut magic).map(|()| magic == MAGIC)
                })
                .unwrap_or(false));
    if !ours {
        return Err(format!(
            "'{}' is there and is not a tiermem optimizer file: a new table's optimizer state \
             would be written over it; move it or use another path",
            p.display()
        ));
    }
    std::fs::remove_file(&p).map_err(|e| format!("'{}' cannot be removed ({e})", p.display()))
}

/// Read `table`'s companion, if there is one. The error says what is wrong with it; a
/// companion is checked against the expected `rows` and `width` before its floats are read.
pub fn read(table: &Path, rows: u64, width: u32) -> Result<Option<Saved>, String> {
    let p = path_of(table);
    let mut f = match files::open_existing(&p, false, 0) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: cannot be opened ({e})", p.display())),
    };
    let shown = p.display();
    let meta = f.metadata().map_err(|e| format!("{shown}: {e}"))?;
    if !files::is_mine(&meta) {
        return Err(format!(
            "{shown}: owned by another user, so not this table's state"
        ));
    }
    if let Some(p) = files::single_link_problem(&f) {
        return Err(format!("{shown}: {p}"));
    }
    let len = meta.len();
    let mut head = [0u8; HEAD];
    f.read_exact(&mut head)
        .map_err(|_| format!("{shown}: {len} bytes, shorter than its header"))?;
    let u32_at = |o: usize| u32::from_le_bytes(head[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(head[o..o + 8].try_into().expect("8 bytes"));
    if head[0..8] != MAGIC {
        return Err(format!("{shown}: not a tiermem optimizer file (bad magic)"));
    }
    if u32_at(68) != crc32c::crc32c(&head[..68]) {
        return Err(format!("{shown}: header checksum mismatch"));
    }
    if u32_at(8) != VERSION {
        return Err(format!(
            "{shown}: format version {}, this tiermem reads {VERSION}",
            u32_at(8)
        ));
    }
    let (per_row, got_rows, got_width) = (u64::from(u32_at(12)), u64_at(16), u32_at(24));
    if (got_rows, got_width) != (rows, width) {
        return Err(format!(
            "{shown}: optimizer state of {got_rows} rows of width {got_width}, the table has \
             {rows} x {width}"
        ));
    }
    if per_row > u64::from(width) * 2 + 1 || HEAD as u64 + rows * per_row * 4 != len {
        return Err(format!(
            "{shown}: {len} bytes, {per_row} state floats per row of {rows} rows would take {}",
            HEAD as u64 + rows.saturating_mul(per_row).saturating_mul(4)
        ));
    }
    let name_bytes = &head[48..64];
    let end = name_bytes.iter().position(|&b| b == 0).unwrap_or(16);
    let optimizer = std::str::from_utf8(&name_bytes[..end])
        .map_err(|_| format!("{shown}: optimizer name is not text"))?
        .to_owned();
    let mut body = vec![0u8; (rows * per_row * 4) as usize];
    f.read_exact(&mut body)
        .map_err(|e| format!("{shown}: {e}"))?;
    if crc32c::crc32c(&body) != u32_at(64) {
        return Err(format!("{shown}: optimizer state checksum mismatch"));
    }
    let state = body
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    Ok(Some(Saved {
        optimizer,
        steps: u64_at(40),
        generation: u64_at(32),
        rows,
        width,
        state,
    }))
}

/// `v`'s bytes (little-endian on every target tiermem builds for).
fn bytemuck_f32(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and any byte pattern is a valid u8; the slice covers
    // exactly `v`'s memory for `v`'s lifetime.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_damage_is_named() {
        let d = std::env::temp_dir().join(format!("tiermem-optstate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let t = d.join("t.tbl");
        let s = Saved {
            optimizer: "adagrad".into(),
            steps: 7,
            generation: 3,
            rows: 5,
            width: 2,
            state: (0..10).map(|i| i as f32 * 0.5).collect(),
        };
        assert_eq!(read(&t, 5, 2).unwrap(), None);
        write(&t, &s).unwrap();
        assert_eq!(read(&t, 5, 2).unwrap(), Some(s.clone()));
        write(
            &t,
            &Saved {
                steps: 8,
                ..s.clone()
            },
        )
        .unwrap();
        assert_eq!(read(&t, 5, 2).unwrap().unwrap().steps, 8);
        assert!(read(&t, 6, 2).unwrap_err().contains("5 rows of width 2"));
        let mut bytes = std::fs::read(path_of(&t)).unwrap();
        let n = bytes.len();
        bytes[n - 1] ^= 1;
        std::fs::remove_file(path_of(&t)).unwrap();
        std::fs::write(path_of(&t), &bytes).unwrap();
        assert!(read(&t, 5, 2).unwrap_err().contains("checksum"));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
