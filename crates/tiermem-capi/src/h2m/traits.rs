//! H2M's C traits as the core's `key = value` pairs (the core parses and validates them, so
//! what a trait means is defined once, there).

use tiermem_core::{bail, Result};

use super::types::*;

/// Value bits naming spaces.
const SPACES: [(h2m_alloc_trait_value_t, &str); 3] = [
    (h2m_atv_mem_space_hbw, "hbw"),
    (h2m_atv_mem_space_low_lat, "low_lat"),
    (h2m_atv_mem_space_large_cap, "large_cap"),
];
const SENSITIVITIES: [(h2m_alloc_trait_value_t, &str); 2] = [
    (h2m_atv_bw_sensitive, "bandwidth"),
    (h2m_atv_lat_sensitive, "latency"),
];
const MODES: [(h2m_alloc_trait_value_t, &str); 3] = [
    (h2m_atv_access_mode_readonly, "read"),
    (h2m_atv_access_mode_writeonly, "write"),
    (h2m_atv_access_mode_readwrite, "read_write"),
];
const PATTERNS: [(h2m_alloc_trait_value_t, &str); 3] = [
    (h2m_atv_access_pattern_sequential, "sequential"),
    (h2m_atv_access_pattern_strided, "strided"),
    (h2m_atv_access_pattern_random, "random"),
];
const STRUCTURES: [(h2m_alloc_trait_value_t, &str); 6] = [
    (h2m_atv_structure_array, "array"),
    (h2m_atv_structure_matrix, "matrix"),
    (h2m_atv_structure_sparse, "sparse"),
    (h2m_atv_structure_tree, "tree"),
    (h2m_atv_structure_hash, "hash"),
    (h2m_atv_structure_graph, "graph"),
];
const FALLBACKS: [(h2m_alloc_trait_value_t, &str); 2] = [
    (h2m_atv_fallback_next_best, "next_best"),
    (h2m_atv_fallback_error, "error"),
];

const PARTITIONS: [(h2m_alloc_trait_value_t, &str); 3] = [
    (h2m_atv_partition_nearest, "nearest"),
    (h2m_atv_partition_blocked, "blocked"),
    (h2m_atv_partition_interleaved, "interleaved"),
];

/// The names of the bits set in `v`, every bit known (`one`: exactly one bit).
fn bits(
    key: &str,
    v: h2m_alloc_trait_value_t,
    table: &[(h2m_alloc_trait_value_t, &str)],
    one: bool,
) -> Result<String> {
    let known = table.iter().fold(0, |a, (b, _)| a | b);
    let names: Vec<&str> = table
        .iter()
        .filter(|(b, _)| v & b != 0)
        .map(|(_, n)| *n)
        .collect();
    let want: Vec<String> = table.iter().map(|(b, n)| format!("{n} ({b:#x})")).collect();
    if v & !known != 0 || names.is_empty() || (one && names.len() > 1) {
        bail!(
            "trait {key}: value {v:#x} is not {} of {}",
            if one { "one" } else { "an OR of values" },
            want.join(", ")
        );
    }
    Ok(names.join("|"))
}

/// A number given as `dbl` or as `i`: eight bytes that are a normal double (or zero) read
/// as the double, anything else as the int in the low four (an `{key, 15}` initialiser sets
/// `i` and leaves the rest zero, which as a double is a subnormal no one means).
fn number(v: &h2m_atv_union_t) -> f64 {
    // SAFETY: every bit pattern is a valid usize; the union is 8 bytes.
    let bits = unsafe { v.sz } as u64;
    let exponent = (bits >> 52) & 0x7ff;
    if bits == 0 || (exponent != 0 && exponent != 0x7ff) {
        f64::from_bits(bits)
    } else {
        // SAFETY: any bit pattern is a valid c_int.
        f64::from(unsafe { v.i })
    }
}

/// The core's pairs for `traits`.
///
/// # Errors
/// An unknown key, a value outside the key's constants, a bad alignment.
pub fn pairs(traits: &[h2m_alloc_trait_t]) -> Result<Vec<(String, String)>> {
    let page = tiermem_core::sys::page_size();
    let mut out: Vec<(String, String)> = Vec::with_capacity(traits.len());
    for t in traits {
        // SAFETY: every bit pattern is a valid c_int (and so for each member read below).
        let atv = unsafe { t.value.atv };
        let (key, value) = match t.key {
            k if k == h2m_atk_req_mem_space => ("required", bits("req_mem_space", atv, &SPACES, false)?),
            k if k == h2m_atk_pref_mem_space => ("preferred", bits("pref_mem_space", atv, &SPACES, false)?),
            k if k == h2m_atk_mem_alignment => {
                // SAFETY: as above.
                let a = unsafe { t.value.sz };
                if !a.is_power_of_two() || a > page {
                    bail!(
                        "trait mem_alignment: {a} bytes is not a power of two up to the page size \
                         ({page}; allocations are page-aligned)"
                    );
                }
                continue;
            }
            k if k == h2m_atk_sensitivity => ("sensitivity", bits("sensitivity", atv, &SENSITIVITIES, false)?),
            k if k == h2m_atk_access_mode => ("access", bits("access_mode", atv, &MODES, true)?),
            k if k == h2m_atk_access_freq => ("frequency", number(&t.value).to_string()),
            k if k == h2m_atk_access_prio => ("priority", number(&t.value).to_string()),
            k if k == h2m_atk_access_pattern => ("pattern", bits("access_pattern", atv, &PATTERNS, true)?),
            // SAFETY: as above.
            k if k == h2m_atk_access_stride => ("stride", unsafe { t.value.sz }.to_string()),
            k if k == h2m_atk_structure_type => ("structure", bits("structure_type", atv, &STRUCTURES, true)?),
            k if k == h2m_atk_gain => ("gain", number(&t.value).to_string()),
            k if k == h2m_atk_fallback => ("fallback", bits("fallback", atv, &FALLBACKS, true)?),
            k if k == h2m_atk_mem_partition => ("partition", bits("mem_partition", atv, &PARTITIONS, true)?),
            k if k == h2m_atk_mem_pinned => ("pinned", match atv {
                0 => "false".to_owned(),
                1 => "true".to_owned(),
                v => bail!("trait mem_pinned: value {v} is not 0 or 1"),
            }),
            k => bail!(
                "unknown trait key {k} (keys: h2m_atk_req_mem_space .. h2m_atk_structure_type are 1-10, \
                 h2m_atk_gain 100, h2m_atk_fallback 101, h2m_atk_mem_partition 102, h2m_atk_mem_pinned 103)"
            ),
        };
        out.push((key.to_owned(), value));
    }
    Ok(out)
}

/// `old` with every key of `new` replaced or added (`h2m_update_traits` without
/// `replace_complete`).
#[must_use]
pub fn merged(old: &[(String, String)], new: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = old
        .iter()
        .filter(|(k, _)| !new.iter().any(|(n, _)| n == k))
        .cloned()
        .collect();
    out.extend(new);
    out
}

/// The `h2m_atv_mem_space_*` name of a space, as the slides' log prints it.
#[must_use]
pub fn space_constant(space: &str) -> String {
    format!("h2m_atv_mem_space_{space}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(key: h2m_alloc_trait_key_t, value: h2m_atv_union_t) -> h2m_alloc_trait_t {
        h2m_alloc_trait_t { key, value }
    }

    fn atv(v: h2m_alloc_trait_value_t) -> h2m_atv_union_t {
        h2m_atv_union_t {
            sz: v as u32 as usize,
        }
    }

    #[test]
    fn slides_traits_become_the_cores_pairs() {
        let p = pairs(&[
            t(
                h2m_atk_req_mem_space,
                atv(h2m_atv_mem_space_hbw | h2m_atv_mem_space_low_lat),
            ),
            t(
                h2m_atk_sensitivity,
                atv(h2m_atv_bw_sensitive | h2m_atv_lat_sensitive),
            ),
            t(h2m_atk_access_prio, h2m_atv_union_t { sz: 15 }),
            t(h2m_atk_access_freq, h2m_atv_union_t { dbl: 2.5 }),
            t(h2m_atk_mem_alignment, h2m_atv_union_t { sz: 64 }),
        ])
        .unwrap();
        let want = [
            ("required", "hbw|low_lat"),
            ("sensitivity", "bandwidth|latency"),
            ("priority", "15"),
            ("frequency", "2.5"),
        ];
        assert_eq!(p.len(), want.len());
        for ((k, v), (wk, wv)) in p.iter().zip(want) {
            assert_eq!((k.as_str(), v.as_str()), (wk, wv));
        }
        tiermem_core::traits::Traits::from_pairs(&p).unwrap();
    }

    #[test]
    fn bad_traits_name_key_and_value() {
        for (tr, msg) in [
            (t(42, atv(1)), "unknown trait key 42"),
            (
                t(h2m_atk_req_mem_space, atv(0x8)),
                "req_mem_space: value 0x8",
            ),
            (t(h2m_atk_req_mem_space, atv(0)), "req_mem_space: value 0x0"),
            (
                t(
                    h2m_atk_access_mode,
                    atv(h2m_atv_access_mode_readonly | h2m_atv_access_mode_writeonly),
                ),
                "is not one of",
            ),
            (
                t(h2m_atk_mem_alignment, h2m_atv_union_t { sz: 48 }),
                "not a power of two",
            ),
            (
                t(h2m_atk_mem_alignment, h2m_atv_union_t { sz: 1 << 21 }),
                "up to the page size",
            ),
        ] {
            let e = pairs(&[tr]).unwrap_err().to_string();
            assert!(e.contains(msg), "{e}");
        }
    }

    #[test]
    fn updates_merge_by_key() {
        let old = vec![
            ("preferred".into(), "hbw".into()),
            ("priority".into(), "1".into()),
        ];
        let m = merged(&old, vec![("priority".into(), "20".into())]);
        assert_eq!(
            m,
            vec![
                ("preferred".to_owned(), "hbw".to_owned()),
                ("priority".into(), "20".into())
            ]
        );
    }
}
