//! What talking to a switch, or reading what users wrote for one, can fail at: each case a
//! sentence saying what to do.

use std::io;
use std::path::PathBuf;

use sluice_sys::error::Failure;

pub use crate::config::ConfigError;

/// The cases a caller of this crate acts on differently.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration file is wrong at a line of it.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A port description that cannot be attached as it is.
    #[error("{0}")]
    Port(String),
    /// Nothing answers on the switch's control socket.
    #[error("cannot reach the switch at {}: {cause}. {hint}", path.display())]
    Unreachable {
        /// The control socket.
        path: PathBuf,
        /// Why the connection failed.
        cause: io::Error,
        /// What to do about it.
        hint: &'static str,
    },
    /// No switch runs, so none can be chosen by default.
    #[error(
        "no switch is running (no live socket in {}); start one with `sluice switch run --config FILE` or `sluice lab up`",
        dir.display()
    )]
    NoSwitch {
        /// Where the switches' sockets are.
        dir: PathBuf,
    },
    /// More than one switch runs, so none can be chosen by default.
    #[error("{} switches are running ({}); choose one with --switch NAME", names.len(), names.join(", "))]
    SeveralSwitches {
        /// Their names.
        names: Vec<String>,
    },
    /// The switch speaks another version of the control protocol.
    #[error(
        "the switch at {} speaks control protocol {theirs} and this sluice speaks {ours}: use the sluice binary that started it ({version})",
        path.display()
    )]
    Protocol {
        /// The control socket.
        path: PathBuf,
        /// The switch's protocol.
        theirs: u32,
        /// This sluice's protocol.
        ours: u32,
        /// The switch's version.
        version: String,
    },
    /// The switch closed the connection without answering (it may have been stopping).
    #[error("the switch at {} closed the connection without answering", .0.display())]
    ClosedWithoutAnswer(PathBuf),
    /// The switch refused the request, for the reason it gives.
    #[error("{0}")]
    Refused(String),
    /// Anything else, said in a sentence.
    #[error(transparent)]
    Failed(#[from] Failure),
    /// A system call failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A result whose error is this crate's [`Error`] unless said otherwise.
pub type Result<T, E = Error> = std::result::Result<T, E>;
