//! The sluice workload modeler.
//!
//! Runs request-response, connect-request-response, streaming and partition-aggregate
//! workloads the way the reference studies' tools (uperf, AWM) do, and reports what the
//! studies report: transactions per second, throughput, latency percentiles, and CPU per
//! transaction and per megabyte split into guest, switch and other-kernel time.
//!
//! - [`profile`]: uperf's profile.xml, parsed into a [`profile::Profile`].
//! - [`result`]: what a run measured, and the figures derived from it.
//! - [`cpu`]: CPU accounting from /proc; [`copy`]: the machine's copy bandwidth.
//! - [`report`]: tables, JSON and CSV.
//! - [`script`]: what each data connection does, and the rules for exact counts.
//! - [`control`], [`client`], [`server`]: the engine; `sys`: the socket calls it makes
//!   that std has not.
//! - [`builtin`]: the studies' workloads as profiles; [`pa`]: partition-aggregate.

pub mod buf;
pub mod builtin;
pub mod client;
pub mod control;
pub mod copy;
pub mod cpu;
pub mod pa;
pub mod profile;
pub mod report;
pub mod result;
pub mod script;
pub mod server;
mod sys;

/// `host:port`, with an IPv6 host in brackets.
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}
