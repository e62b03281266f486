//! What users and programs say to a sluice switch: the configuration file ([`config`]),
//! the control protocol's messages ([`proto`]) and a client that speaks it ([`client`]).
//!
//! Everything here reads what the outside writes, so it is a library of its own: the
//! daemon, the command line and the fuzz targets (`fuzz/`) run the very same parsers.

pub mod client;
pub mod config;
pub mod error;
pub mod proto;

pub use error::{Error, Result};
