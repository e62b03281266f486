//! The identifiers every part of the core shares, kept apart so that the tables, the
//! decision and the switch around them can all name a port without naming each other.

/// Index of a port in its switch. Never reused while the switch lives.
pub type PortId = u32;
