//! sluice's client of a GoBGP speaker (docs/architecture.md, "EVPN: many hosts, one
//! LAN"): the API messages it uses ([`api`]), a gRPC client over the speaker's Unix socket
//! ([`client`]), and the translation between the core's EVPN routes and GoBGP paths
//! ([`paths`]).

pub mod api;
pub mod client;
pub mod paths;

pub use client::{Client, Error};
