//! A trait set: what the program says about one allocation (H2M's `h2m_alloc_trait_t`
//! keys), typed and validated, parsed from `key = value` pairs where layers above pass
//! them as text.

use serde::Serialize;

use crate::device::spaces::Space;
use crate::{Error, Result};

/// How the data is accessed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// Only read (after its first write).
    Read,
    /// Only written.
    Write,
    /// Both.
    ReadWrite,
}

/// The access pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    /// Linear, element after element.
    Sequential,
    /// A fixed stride (give `stride`).
    Strided,
    /// Irregular (gathers, pointer chasing, hashing).
    Random,
}

/// The data structure the allocation holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Structure {
    /// A dense one-dimensional array.
    Array,
    /// A dense matrix.
    Matrix,
    /// A sparse matrix (CRS or similar).
    Sparse,
    /// A tree.
    Tree,
    /// A hash table.
    Hash,
    /// A graph.
    Graph,
}

/// What happens when no device the traits allow has room (OpenMP's `fallback` trait).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Fallback {
    /// The next device in the candidate order, then every other device fastest first
    /// (OpenMP's `default_mem_fb`).
    #[default]
    NextBest,
    /// An error naming the spaces and the devices (OpenMP's `null_fb` / `abort_fb`).
    Error,
}

/// How an allocation spreads over its space's nodes (OpenMP's `partition` trait).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Partition {
    /// Whole, on one node (the nearest with room).
    #[default]
    Nearest,
    /// In as many contiguous blocks as the space has nodes, one per node.
    Blocked,
    /// Round-robin in chunks over the space's nodes.
    Interleaved,
}

/// One allocation's traits. Every field is optional: an empty set places as the manager's
/// fastest device with room would.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct Traits {
    /// Spaces the device must be in (all of them; H2M's OR-ed `req_mem_space`).
    pub required: Vec<Space>,
    /// Spaces to try first (in this order) when nothing is required.
    pub preferred: Vec<Space>,
    /// Sensitive to bandwidth (places on `hbw` when no space is named).
    pub bandwidth_sensitive: bool,
    /// Sensitive to latency (places on `low_lat` when no space is named).
    pub latency_sensitive: bool,
    /// How it is accessed.
    pub access: Option<Access>,
    /// Accesses per second (or any relative measure), `>= 0`.
    pub frequency: Option<f64>,
    /// Higher first under the `priority` commit strategy (the slides' B: 15, C: 5, A: 1).
    pub priority: f64,
    /// The access pattern.
    pub pattern: Option<Pattern>,
    /// Bytes between accesses, with the `strided` pattern only.
    pub stride: Option<u64>,
    /// The data structure.
    pub structure: Option<Structure>,
    /// Measured seconds a run saves with it on the fastest device rather than the slowest
    /// (sensitivity detection; the `gain` commit strategy ranks by it per byte), `>= 0`.
    pub gain: Option<f64>,
    /// When no allowed device has room.
    pub fallback: Fallback,
    /// How it spreads over its space's nodes (where the layer placing it supports parts:
    /// the C H2M interface).
    pub partition: Partition,
    /// Its pages locked in memory (OpenMP's `pinned`: never swapped out; the C H2M
    /// interface locks an allocation's range).
    pub pinned: bool,
}

/// The keys [`Traits::from_pairs`] accepts, in documentation order.
pub const KEYS: [&str; 14] = [
    "required",
    "preferred",
    "sensitivity",
    "access",
    "frequency",
    "priority",
    "pattern",
    "stride",
    "structure",
    "gain",
    "fallback",
    "space",
    "partition",
    "pinned",
];

fn pick<T: Copy>(key: &str, v: &str, table: &[(&str, T)]) -> Result<T> {
    table
        .iter()
        .find(|(n, _)| *n == v)
        .map(|(_, t)| *t)
        .ok_or_else(|| {
            let known: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
            Error::InvalidArgument(format!(
                "trait {key}={v:?} is not one of {}",
                known.join(", ")
            ))
        })
}

fn number(key: &str, v: &str) -> Result<f64> {
    match v.trim().parse::<f64>() {
        Ok(x) if x.is_finite() => Ok(x),
        _ => Err(Error::InvalidArgument(format!(
            "trait {key}={v:?} is not a finite number"
        ))),
    }
}

fn spaces(key: &str, v: &str) -> Result<Vec<Space>> {
    let mut out = Vec::new();
    for part in v.split('|').map(str::trim) {
        let s = Space::parse(part).map_err(|e| match e {
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("trait {key}: {m}")),
            other => other,
        })?;
        if !out.contains(&s) {
            out.push(s);
        }
    }
    Ok(out)
}

impl Traits {
    /// Parse `key = value` pairs (keys in [`KEYS`]; spaces and sensitivities OR-ed with
    /// `|`, as H2M's values are: `required = "hbw|low_lat"`, `sensitivity =
    /// "bandwidth|latency"`; `space` is `preferred`'s short name), then [`Traits::validate`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the key, the value and what is allowed.
    pub fn from_pairs<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Result<Traits> {
        let mut t = Traits::default();
        let mut seen: Vec<&str> = Vec::new();
        for (k, v) in pairs {
            let (k, v) = (k.as_ref(), v.as_ref().trim());
            let key = *KEYS.iter().find(|x| **x == k).ok_or_else(|| {
                Error::InvalidArgument(format!("unknown trait {k:?} (known: {})", KEYS.join(", ")))
            })?;
            let canon = if key == "space" { "preferred" } else { key };
            if seen.contains(&canon) {
                crate::bail!("trait {canon} given twice");
            }
            seen.push(canon);
            match key {
                "required" => t.required = spaces(key, v)?,
                "preferred" | "space" => t.preferred = spaces(key, v)?,
                "sensitivity" => {
                    for part in v.split('|').map(str::trim) {
                        match pick(key, part, &[("bandwidth", 0), ("latency", 1)])? {
                            0 => t.bandwidth_sensitive = true,
                            _ => t.latency_sensitive = true,
                        }
                    }
                }
                "access" => {
                    t.access = Some(pick(
                        key,
                        v,
                        &[
                            ("read", Access::Read),
                            ("write", Access::Write),
                            ("read_write", Access::ReadWrite),
                        ],
                    )?);
                }
                "frequency" => t.frequency = Some(number(key, v)?),
                "priority" => t.priority = number(key, v)?,
                "pattern" => {
                    t.pattern = Some(pick(
                        key,
                        v,
                        &[
                            ("sequential", Pattern::Sequential),
                            ("strided", Pattern::Strided),
                            ("random", Pattern::Random),
                        ],
                    )?);
                }
                "stride" => {
                    t.stride = Some(v.parse::<u64>().map_err(|_| {
                        Error::InvalidArgument(format!(
                            "trait stride={v:?} is not a whole number of bytes"
                        ))
                    })?);
                }
                "structure" => {
                    t.structure = Some(pick(
                        key,
                        v,
                        &[
                            ("array", Structure::Array),
                            ("matrix", Structure::Matrix),
                            ("sparse", Structure::Sparse),
                            ("tree", Structure::Tree),
                            ("hash", Structure::Hash),
                            ("graph", Structure::Graph),
                        ],
                    )?);
                }
                "gain" => t.gain = Some(number(key, v)?),
                "pinned" => {
                    t.pinned = pick(key, v, &[("true", true), ("false", false)])?;
                }
                "partition" => {
                    t.partition = pick(
                        key,
                        v,
                        &[
                            ("nearest", Partition::Nearest),
                            ("blocked", Partition::Blocked),
                            ("interleaved", Partition::Interleaved),
                        ],
                    )?;
                }
                _ => {
                    t.fallback = pick(
                        key,
                        v,
                        &[
                            ("next_best", Fallback::NextBest),
                            ("error", Fallback::Error),
                        ],
                    )?;
                }
            }
        }
        t.validate()?;
        Ok(t)
    }

    /// Check the set on its own (a contradiction between spaces depends on the devices, and
    /// is found when placing).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the trait.
    pub fn validate(&self) -> Result<()> {
        if self.frequency.is_some_and(|f| !(f >= 0.0 && f.is_finite())) {
            crate::bail!(
                "trait frequency must be a finite number >= 0, got {:?}",
                self.frequency
            );
        }
        if self.gain.is_some_and(|g| !(g >= 0.0 && g.is_finite())) {
            crate::bail!(
                "trait gain must be a finite number of seconds >= 0, got {:?}",
                self.gain
            );
        }
        if !self.priority.is_finite() {
            crate::bail!("trait priority must be finite, got {}", self.priority);
        }
        match (self.pattern, self.stride) {
            (Some(Pattern::Strided), None) => {
                crate::bail!("trait pattern=strided needs a stride (bytes between accesses)")
            }
            (Some(Pattern::Strided), Some(0)) => {
                crate::bail!("trait stride must be at least 1 byte")
            }
            (p, Some(s)) if p != Some(Pattern::Strided) => crate::bail!(
                "trait stride={s} is given without pattern=strided (pattern {:?})",
                p.map_or("unset", |p| match p {
                    Pattern::Sequential => "sequential",
                    Pattern::Random => "random",
                    Pattern::Strided => "strided",
                })
            ),
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<Traits> {
        Traits::from_pairs(pairs)
    }

    #[test]
    fn the_slides_dgemm_traits_parse() {
        let b = parse(&[("preferred", "low_lat"), ("priority", "15")]).unwrap();
        assert_eq!(
            (b.preferred.clone(), b.priority),
            (vec![Space::LowLat], 15.0)
        );
        let t = parse(&[
            ("required", "hbw|low_lat"),
            ("sensitivity", "bandwidth|latency"),
            ("access", "read_write"),
            ("pattern", "strided"),
            ("stride", "64"),
            ("structure", "matrix"),
            ("fallback", "error"),
        ])
        .unwrap();
        assert_eq!(t.required, vec![Space::Hbw, Space::LowLat]);
        assert!(t.bandwidth_sensitive && t.latency_sensitive);
        assert_eq!((t.stride, t.fallback), (Some(64), Fallback::Error));
    }

    #[test]
    fn bad_traits_are_refused_by_name() {
        for (pairs, msg) in [
            (vec![("colour", "red")], "unknown trait \"colour\""),
            (
                vec![("required", "fast")],
                "trait required: unknown memory space \"fast\"",
            ),
            (
                vec![("access", "rw")],
                "trait access=\"rw\" is not one of read, write, read_write",
            ),
            (
                vec![("priority", "high")],
                "trait priority=\"high\" is not a finite number",
            ),
            (vec![("priority", "inf")], "is not a finite number"),
            (
                vec![("frequency", "-1")],
                "frequency must be a finite number >= 0",
            ),
            (
                vec![("gain", "-0.5")],
                "gain must be a finite number of seconds >= 0",
            ),
            (vec![("pattern", "strided")], "needs a stride"),
            (vec![("stride", "8")], "without pattern=strided"),
            (
                vec![("pattern", "strided"), ("stride", "0")],
                "at least 1 byte",
            ),
            (
                vec![("stride", "-8"), ("pattern", "strided")],
                "not a whole number",
            ),
            (
                vec![("space", "hbw"), ("preferred", "hbw")],
                "trait preferred given twice",
            ),
        ] {
            let e = parse(&pairs).unwrap_err().to_string();
            assert!(e.contains(msg), "{pairs:?}: {e}");
        }
    }
}
