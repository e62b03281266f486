//! The parts of `sluice` that read what the outside writes — the configuration file and the
//! control protocol — as a library beside the binary, so that the fuzz targets (`fuzz/`)
//! drive the very code the daemon runs. Everything else lives in the binary (`main.rs`).

pub mod config;
pub mod paths;
pub mod proto;
