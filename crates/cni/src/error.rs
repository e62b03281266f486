//! The plugin's one error: a CNI error result (`code`, `msg`, `details`), printed on stdout
//! with a non-zero exit, as the CNI specification asks. Codes below 100 are the
//! specification's; 100 and above are sluice's own (docs/cni.md lists them).

use serde::Serialize;

/// Incompatible CNI version.
pub const INCOMPATIBLE_VERSION: u32 = 1;
/// Invalid necessary environment variables (`CNI_COMMAND`, `CNI_CONTAINERID`, …).
pub const INVALID_ENV: u32 = 4;
/// I/O failure.
pub const IO_FAILURE: u32 = 5;
/// Failed to decode content (stdin, a delegated plugin's result).
pub const DECODE: u32 = 6;
/// Invalid network config.
pub const INVALID_CONFIG: u32 = 7;
/// Try again later: the switch does not answer on its control socket.
pub const TRY_AGAIN: u32 = 11;
/// The switch refused the container's port.
pub const PORT_REFUSED: u32 = 100;
/// The IPAM plugin failed (its own error is in `details`).
pub const IPAM_FAILED: u32 = 101;
/// Setting addresses or routes inside the container's namespace failed.
pub const NETNS_SETUP: u32 = 102;
/// The host's gateway address could not be set.
pub const GATEWAY: u32 = 103;
/// nftables refused the masquerading rule.
pub const MASQUERADE: u32 = 104;
/// CHECK found the container's network not as ADD left it.
pub const CHECK_FAILED: u32 = 105;

/// A CNI error result.
#[derive(Debug, Serialize)]
pub struct CniError {
    /// The CNI version the result is written in.
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    /// The error code.
    pub code: u32,
    /// What went wrong, in a sentence.
    pub msg: String,
    /// The cause, as the failing part said it.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl CniError {
    /// An error with `code`, message `msg` and `details`.
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> Self {
        CniError { cni_version: crate::SPEC_VERSION.into(), code, msg: msg.into(), details: details.into() }
    }
}

/// The plugin's results.
pub type Result<T> = std::result::Result<T, CniError>;
