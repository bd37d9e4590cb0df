//! The on-disk format of a table's block file (version 1), little-endian throughout:
//!
//! ```text
//! block 0                       header (HEADER_BYTES used, the rest zero)
//! blocks 1 ..= layout_blocks    the layout: one u32 per row, the row's position
//!                               (position p: data block p / rows_per_block * blocks_per_row,
//!                               slot p % rows_per_block), checksummed in the header
//! then data_blocks blocks       BLOCK bytes each: PAYLOAD bytes of rows, then a trailer of
//!                               crc32c(payload ++ index) and the block's index (u32 each)
//! ```
//!
//! A row narrower than a payload shares its block with others (`rows_per_block` of them,
//! `blocks_per_row` = 1); a wider one spans `blocks_per_row` whole blocks, each with its own
//! trailer (`rows_per_block` = 1). The index in the trailer catches a block written to the
//! wrong place; the checksum, a damaged one.

use tiermem_core::sys::direct_io::ALIGN;

use crate::DType;

/// Bytes per block: the device's direct-I/O unit.
pub const BLOCK: usize = ALIGN;
/// Bytes of a block's trailer.
pub const TRAILER: usize = 8;
/// Bytes of rows a block holds.
pub const PAYLOAD: usize = BLOCK - TRAILER;
/// The file's first eight bytes.
pub const MAGIC: [u8; 8] = *b"TMEMBLK1";
/// The format version this code writes and reads.
pub const VERSION: u32 = 1;
/// The checksum algorithm's code in the header: crc32c.
pub const CRC32C: u8 = 1;
/// Bytes of the header that carry fields (the header checksum covers them).
pub const HEADER_BYTES: usize = 72;

/// The header's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Rows in the table.
    pub rows: u64,
    /// Elements per row.
    pub width: u32,
    /// Storage type.
    pub dtype: DType,
    /// Bytes per row (`width` elements, rounded up to 4).
    pub stride: u32,
    /// Rows sharing one block (1 when a row spans blocks).
    pub rows_per_block: u32,
    /// Blocks one row spans (1 when rows share blocks).
    pub blocks_per_row: u32,
    /// Blocks of rows.
    pub data_blocks: u64,
    /// Blocks of layout.
    pub layout_blocks: u64,
    /// Bumped by every relayout.
    pub generation: u64,
    /// crc32c of the layout's bytes.
    pub layout_crc: u32,
}

impl Header {
    /// The geometry of a table of `rows` rows of `width` elements of `dtype`.
    #[must_use]
    pub fn new(rows: u64, width: u32, dtype: DType) -> Self {
        let stride = dtype.row_bytes(width as usize).next_multiple_of(4);
        let (rows_per_block, blocks_per_row) = if stride <= PAYLOAD {
            ((PAYLOAD / stride) as u32, 1)
        } else {
            (1, stride.div_ceil(PAYLOAD) as u32)
        };
        let data_blocks = rows.div_ceil(u64::from(rows_per_block)) * u64::from(blocks_per_row);
        let layout_blocks = (rows * 4).div_ceil(BLOCK as u64);
        Header {
            rows,
            width,
            dtype,
            stride: stride as u32,
            rows_per_block,
            blocks_per_row,
            data_blocks,
            layout_blocks,
            generation: 1,
            layout_crc: 0,
        }
    }

    /// File offset of data block `b`.
    #[must_use]
    pub fn data_offset(&self, b: u64) -> u64 {
        (1 + self.layout_blocks + b) * BLOCK as u64
    }

    /// Bytes the whole file takes.
    #[must_use]
    pub fn file_bytes(&self) -> u64 {
        self.data_offset(self.data_blocks)
    }

    /// The header block.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..20].copy_from_slice(&self.rows.to_le_bytes());
        b[20..24].copy_from_slice(&self.width.to_le_bytes());
        b[24] = match self.dtype {
            DType::F32 => 0,
            DType::Bf16 => 1,
            DType::F16 => 2,
            DType::Int8 => 3,
        };
        b[25] = CRC32C;
        b[28..32].copy_from_slice(&self.stride.to_le_bytes());
        b[32..36].copy_from_slice(&self.rows_per_block.to_le_bytes());
        b[36..40].copy_from_slice(&self.blocks_per_row.to_le_bytes());
        b[40..48].copy_from_slice(&self.data_blocks.to_le_bytes());
        b[48..56].copy_from_slice(&self.layout_blocks.to_le_bytes());
        b[56..64].copy_from_slice(&self.generation.to_le_bytes());
        b[64..68].copy_from_slice(&self.layout_crc.to_le_bytes());
        let crc = crc32c::crc32c(&b[..68]);
        b[68..72].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parse and check a header block; the error says what is wrong (the caller names the
    /// file).
    pub fn decode(b: &[u8]) -> Result<Self, String> {
        if b.len() < HEADER_BYTES || b[0..8] != MAGIC {
            return Err("not a tiermem block file (bad magic)".into());
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let version = u32_at(8);
        if version != VERSION {
            return Err(format!(
                "format version {version}, this tiermem reads version {VERSION}"
            ));
        }
        let crc = crc32c::crc32c(&b[..68]);
        if crc != u32_at(68) {
            return Err(format!(
                "header checksum mismatch (stored {:#010x}, computed {crc:#010x})",
                u32_at(68)
            ));
        }
        if b[25] != CRC32C {
            return Err(format!("unknown checksum algorithm {}", b[25]));
        }
        let dtype = match b[24] {
            0 => DType::F32,
            1 => DType::Bf16,
            2 => DType::F16,
            3 => DType::Int8,
            d => return Err(format!("unknown storage type code {d}")),
        };
        let (rows, width) = (u64_at(12), u32_at(20));
        if rows == 0 || width == 0 || rows > u64::from(u32::MAX) {
            return Err(format!("{rows} rows of width {width}: not a table"));
        }
        let h = Header {
            generation: u64_at(56),
            layout_crc: u32_at(64),
            ..Header::new(rows, width, dtype)
        };
        let stored = (u32_at(28), u32_at(32), u32_at(36), u64_at(40), u64_at(48));
        let derived = (
            h.stride,
            h.rows_per_block,
            h.blocks_per_row,
            h.data_blocks,
            h.layout_blocks,
        );
        if stored != derived {
            return Err(format!(
                "geometry {stored:?} (stride, rows per block, blocks per row, data blocks, \
                 layout blocks) contradicts {rows} rows of width {width} ({derived:?} expected)"
            ));
        }
        Ok(h)
    }
}

/// Seal a data block: write its trailer (checksum over payload and index, then the index).
pub fn seal(block: &mut [u8], index: u64) {
    let idx = (index as u32).to_le_bytes();
    let mut crc = crc32c::crc32c(&block[..PAYLOAD]);
    crc = crc32c::crc32c_append(crc, &idx);
    block[PAYLOAD..PAYLOAD + 4].copy_from_slice(&crc.to_le_bytes());
    block[PAYLOAD + 4..BLOCK].copy_from_slice(&idx);
}

/// Check a data block read from index `index`; the error says what is wrong.
pub fn verify(block: &[u8], index: u64) -> Result<(), String> {
    let stored_idx = u32::from_le_bytes(block[PAYLOAD + 4..BLOCK].try_into().expect("4 bytes"));
    if stored_idx != index as u32 {
        return Err(format!(
            "block {index} holds the trailer of block {stored_idx} (misplaced write)"
        ));
    }
    let mut crc = crc32c::crc32c(&block[..PAYLOAD]);
    crc = crc32c::crc32c_append(crc, &block[PAYLOAD + 4..BLOCK]);
    let stored = u32::from_le_bytes(block[PAYLOAD..PAYLOAD + 4].try_into().expect("4 bytes"));
    if crc != stored {
        return Err(format!(
            "block {index} checksum mismatch (stored {stored:#010x}, computed {crc:#010x})"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_of_narrow_and_wide_rows() {
        let h = Header::new(1000, 16, DType::F32);
        assert_eq!((h.stride, h.rows_per_block, h.blocks_per_row), (64, 63, 1));
        assert_eq!((h.data_blocks, h.layout_blocks), (16, 1));
        let w = Header::new(10, 3000, DType::F32);
        assert_eq!(
            (w.stride, w.rows_per_block, w.blocks_per_row),
            (12000, 1, 3)
        );
        assert_eq!(w.data_blocks, 30);
    }

    #[test]
    fn header_round_trips_and_damage_is_named() {
        let mut h = Header::new(12345, 64, DType::Bf16);
        h.generation = 7;
        h.layout_crc = 0xdead_beef;
        let b = h.encode();
        assert_eq!(Header::decode(&b).unwrap(), h);
        let mut bad = b.clone();
        bad[13] ^= 1;
        assert!(Header::decode(&bad)
            .unwrap_err()
            .contains("header checksum"));
        let mut foreign = b.clone();
        foreign[0] = b'X';
        assert!(Header::decode(&foreign).unwrap_err().contains("magic"));
    }

    #[test]
    fn blocks_seal_and_verify() {
        let mut b = vec![7u8; BLOCK];
        seal(&mut b, 42);
        verify(&b, 42).unwrap();
        assert!(verify(&b, 43).unwrap_err().contains("trailer of block 42"));
        b[100] ^= 0x10;
        assert!(verify(&b, 42).unwrap_err().contains("checksum mismatch"));
    }
}
