//! What opening a port's device, or running a relay, can fail at: each case a sentence
//! saying what to do.

use std::io;
use std::path::PathBuf;

use sluice_sys::error::Failure;

/// The cases a caller of this crate acts on differently.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A TAP's name is taken by an interface sluice did not make.
    #[error("an interface named {name:?} already exists; pick another name")]
    TapNameTaken {
        /// The name.
        name: String,
    },
    /// A tunnel's kernel device name is taken by an interface that is not sluice's.
    #[error(
        "making the kernel device {name} of vxlan port {port:?}: an interface named {name} (index {index}) exists already in the switch's namespace and is not a tunnel device of sluice's; give the port another name"
    )]
    TunnelNameTaken {
        /// The port.
        port: String,
        /// The device name.
        name: String,
        /// The interface's index.
        index: u32,
    },
    /// A relay's listening path holds something other than a socket a relay left.
    #[error(
        "{} is {what}, not a socket a relay left; sluice removes only such a socket: choose another --listen path, or move that file away",
        path.display()
    )]
    NotASocket {
        /// The path.
        path: PathBuf,
        /// What is there.
        what: &'static str,
    },
    /// A relay's listening path is a socket someone answers on.
    #[error("something answers on {} (another relay?); stop it, or choose another --listen path", path.display())]
    Answering {
        /// The path.
        path: PathBuf,
    },
    /// No switch connected to a relay in time.
    #[error(
        "no switch connected to {} within {secs} s (attach it with `sluice port add NAME --type stream --path {}`)",
        path.display(),
        path.display()
    )]
    NoSwitch {
        /// The relay's socket.
        path: PathBuf,
        /// How long the relay waited.
        secs: u64,
    },
    /// Anything else, said in a sentence.
    #[error(transparent)]
    Failed(#[from] Failure),
    /// A system call failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A result whose error is this crate's [`Error`] unless said otherwise.
pub type Result<T, E = Error> = std::result::Result<T, E>;
