//! What both ends of sluice's shared-memory fast path agree on, and what the `sluice`
//! binary and the preload library share: the ring buffer laid out in shared memory
//! ([`ring`]) and the arenas of slots that hold them ([`slot`]), the side-door messages
//! ([`msg`]), SMC's buffer-size rule
//! ([`size`]), the statistics layout ([`stats`]), who may use the fast path
//! ([`access`]), and which connections stay on TCP ([`rules`], [`auto`]).
//!
//! The crate depends on `std` only: the `sluice` binary's build script compiles it with
//! plain `rustc` for the preload library, which loads into arbitrary programs.

#![warn(missing_docs)]

pub mod access;
pub mod auto;
pub mod msg;
pub mod ring;
pub mod rules;
pub mod size;
pub mod slot;
pub mod stats;
