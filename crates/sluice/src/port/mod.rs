//! Port kinds backed by operating-system devices. Each is a thin adapter: the forwarding
//! decisions are in `sluice_switch`.

pub mod tap;
