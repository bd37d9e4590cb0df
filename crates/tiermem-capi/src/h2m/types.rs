//! H2M's C types and constants (the PPAM'22 slides' `h2m_alloc_trait_t`, its keys and
//! values, return codes), declared here once and generated into the header. Keys and values
//! are plain `int`s, not Rust enums: values are OR-ed (`h2m_atv_mem_space_hbw |
//! h2m_atv_mem_space_low_lat`), and a key from C may be anything, which a Rust enum could
//! not hold.
#![allow(non_camel_case_types, non_upper_case_globals)]

use std::ffi::{c_int, c_long, c_uint, c_void};

/// Return and `err` codes. `H2M_SUCCESS` is H2M's; the others are nonzero, so a program
/// that tests against `H2M_SUCCESS` reads them as H2M's failures.
pub type h2m_status_t = c_int;
/// Success.
pub const H2M_SUCCESS: h2m_status_t = 0;
/// A failure none of the codes below names (the message says what).
pub const H2M_FAILURE: h2m_status_t = 1;
/// A bad argument: a NULL pointer, a size of zero, an unknown trait key or value, a trait
/// set no space satisfies with `fallback=error`.
pub const H2M_INVALID_ARGUMENT: h2m_status_t = 2;
/// No memory space has room.
pub const H2M_OUT_OF_MEMORY: h2m_status_t = 3;
/// A pointer that is not an allocation of this library (or was freed already).
pub const H2M_NO_SUCH_ALLOCATION: h2m_status_t = 4;
/// Called before `h2m_init` or after `h2m_finalize`.
pub const H2M_NOT_INITIALIZED: h2m_status_t = 5;
/// `h2m_init` called again before `h2m_finalize`.
pub const H2M_ALREADY_INITIALIZED: h2m_status_t = 6;
/// Called in a child forked after `h2m_init` (its allocations belong to the parent).
pub const H2M_FORKED: h2m_status_t = 7;
/// A panic inside tiermem (a bug), caught at the boundary.
pub const H2M_PANIC: h2m_status_t = 8;

/// A trait key.
pub type h2m_alloc_trait_key_t = c_int;
/// Spaces the allocation must be in (`atv`, OR-ed `h2m_atv_mem_space_*`).
pub const h2m_atk_req_mem_space: h2m_alloc_trait_key_t = 1;
/// Spaces to try first (`atv`, OR-ed `h2m_atv_mem_space_*`).
pub const h2m_atk_pref_mem_space: h2m_alloc_trait_key_t = 2;
/// Alignment in bytes (`sz`), a power of two up to the page size (allocations are
/// page-aligned).
pub const h2m_atk_mem_alignment: h2m_alloc_trait_key_t = 3;
/// Sensitivity (`atv`, OR-ed `h2m_atv_bw_sensitive`, `h2m_atv_lat_sensitive`).
pub const h2m_atk_sensitivity: h2m_alloc_trait_key_t = 4;
/// Access mode (`atv`, one `h2m_atv_access_mode_*`).
pub const h2m_atk_access_mode: h2m_alloc_trait_key_t = 5;
/// Access frequency (`dbl` or `i`, >= 0).
pub const h2m_atk_access_freq: h2m_alloc_trait_key_t = 6;
/// Priority (`dbl` or `i`; higher first under `H2M_STRATEGY_PRIORITY`).
pub const h2m_atk_access_prio: h2m_alloc_trait_key_t = 7;
/// Access pattern (`atv`, one `h2m_atv_access_pattern_*`).
pub const h2m_atk_access_pattern: h2m_alloc_trait_key_t = 8;
/// Bytes between accesses (`sz`), with `h2m_atv_access_pattern_strided`.
pub const h2m_atk_access_stride: h2m_alloc_trait_key_t = 9;
/// Data structure (`atv`, one `h2m_atv_structure_*`).
pub const h2m_atk_structure_type: h2m_alloc_trait_key_t = 10;
/// tiermem: measured seconds a run saves with the allocation in the fastest space rather
/// than the slowest (`dbl`, >= 0; `H2M_STRATEGY_GAIN` ranks by it per byte).
pub const h2m_atk_gain: h2m_alloc_trait_key_t = 100;
/// tiermem: what happens when no space the traits allow has room (`atv`, one
/// `h2m_atv_fallback_*`).
pub const h2m_atk_fallback: h2m_alloc_trait_key_t = 101;

/// tiermem (OpenMP's `partition`): how the allocation spreads over its space's nodes
/// (`atv`, one `h2m_atv_partition_*`); fixed at allocation.
pub const h2m_atk_mem_partition: h2m_alloc_trait_key_t = 102;

/// tiermem (OpenMP's `pinned`): the allocation's pages locked in memory (`mlock`), also
/// after a migration maps them anew (`i` or `sz`: 1 locks, 0 does not).
pub const h2m_atk_mem_pinned: h2m_alloc_trait_key_t = 103;

/// A trait value.
pub type h2m_alloc_trait_value_t = c_int;
/// Nodes with the highest bandwidth (HBM, MCDRAM, or DRAM beside slower memory).
pub const h2m_atv_mem_space_hbw: h2m_alloc_trait_value_t = 0x1;
/// Nodes with the lowest latency.
pub const h2m_atv_mem_space_low_lat: h2m_alloc_trait_value_t = 0x2;
/// Nodes with the largest capacity.
pub const h2m_atv_mem_space_large_cap: h2m_alloc_trait_value_t = 0x4;
/// Sensitive to bandwidth.
pub const h2m_atv_bw_sensitive: h2m_alloc_trait_value_t = 0x8;
/// Sensitive to latency.
pub const h2m_atv_lat_sensitive: h2m_alloc_trait_value_t = 0x10;
/// Read only.
pub const h2m_atv_access_mode_readonly: h2m_alloc_trait_value_t = 0x20;
/// Written only.
pub const h2m_atv_access_mode_writeonly: h2m_alloc_trait_value_t = 0x40;
/// Read and written.
pub const h2m_atv_access_mode_readwrite: h2m_alloc_trait_value_t = 0x80;
/// Element after element.
pub const h2m_atv_access_pattern_sequential: h2m_alloc_trait_value_t = 0x100;
/// A fixed stride (give `h2m_atk_access_stride`).
pub const h2m_atv_access_pattern_strided: h2m_alloc_trait_value_t = 0x200;
/// Irregular.
pub const h2m_atv_access_pattern_random: h2m_alloc_trait_value_t = 0x400;
/// A dense array.
pub const h2m_atv_structure_array: h2m_alloc_trait_value_t = 0x800;
/// A dense matrix.
pub const h2m_atv_structure_matrix: h2m_alloc_trait_value_t = 0x1000;
/// A sparse matrix.
pub const h2m_atv_structure_sparse: h2m_alloc_trait_value_t = 0x2000;
/// A tree.
pub const h2m_atv_structure_tree: h2m_alloc_trait_value_t = 0x4000;
/// A hash table.
pub const h2m_atv_structure_hash: h2m_alloc_trait_value_t = 0x8000;
/// A graph.
pub const h2m_atv_structure_graph: h2m_alloc_trait_value_t = 0x10000;
/// tiermem: on no room, the next device, then every other, fastest first (the default).
pub const h2m_atv_fallback_next_best: h2m_alloc_trait_value_t = 0x20000;
/// tiermem: on no room, fail with `H2M_OUT_OF_MEMORY` or `H2M_INVALID_ARGUMENT`.
pub const h2m_atv_fallback_error: h2m_alloc_trait_value_t = 0x40000;

/// tiermem: whole, on the nearest node with room (the default).
pub const h2m_atv_partition_nearest: h2m_alloc_trait_value_t = 0x80000;
/// tiermem: one contiguous block per node of the space, in the calling thread's order.
pub const h2m_atv_partition_blocked: h2m_alloc_trait_value_t = 0x100000;
/// tiermem: round-robin over the space's nodes in chunks of whole pages (at most 4096
/// chunks).
pub const h2m_atv_partition_interleaved: h2m_alloc_trait_value_t = 0x200000;

/// The order declared allocations claim memory in (`h2m_commit_allocs`), also used by
/// `h2m_apply_migration`.
pub type h2m_strategy_t = c_int;
/// As declared (H2M's default).
pub const H2M_STRATEGY_FIFO: h2m_strategy_t = 0;
/// Largest first.
pub const H2M_STRATEGY_SIZE: h2m_strategy_t = 1;
/// Highest priority first, then largest.
pub const H2M_STRATEGY_PRIORITY: h2m_strategy_t = 2;
/// tiermem: highest measured gain per byte first.
pub const H2M_STRATEGY_GAIN: h2m_strategy_t = 3;

/// A trait's value: which member is read depends on the key (see each `h2m_atk_*`).
#[repr(C)]
#[derive(Clone, Copy)]
pub union h2m_atv_union_t {
    /// An int.
    pub i: c_int,
    /// An unsigned int.
    pub ui: c_uint,
    /// A double.
    pub dbl: f64,
    /// A long.
    pub l: c_long,
    /// A value constant (OR-ed where the key allows).
    pub atv: h2m_alloc_trait_value_t,
    /// A pointer.
    pub ptr: *mut c_void,
    /// A size.
    pub sz: usize,
}

/// One allocation trait: a key and its value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct h2m_alloc_trait_t {
    /// The key (`h2m_atk_*`).
    pub key: h2m_alloc_trait_key_t,
    /// The value.
    pub value: h2m_atv_union_t,
}
