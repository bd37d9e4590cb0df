//! Allocation by traits (H2M, `../shared/papers/terboven-h2m-ppam22-slides.txt`): a program
//! says how each allocation is used ([`Traits`]: required or preferred memory space,
//! sensitivity, access mode, frequency, priority, pattern, stride, structure, measured
//! gain, fallback); tiermem maps the spaces to the manager's devices ([`DeviceSpaces`]),
//! places a set of allocations in a commit [`Strategy`]'s order, and moves them when their
//! traits change ([`Traited::apply_migration`]).

mod choose;
mod commit;
pub mod nodes;
mod set;

pub use choose::DeviceSpaces;
pub use commit::{Migration, Strategy, Traited};
pub use set::{Access, Fallback, Partition, Pattern, Structure, Traits, KEYS};
