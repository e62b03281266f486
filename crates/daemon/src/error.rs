//! What running a switch, or a request to it, can fail at: each case a sentence saying
//! what to do.

use std::io;
use std::path::PathBuf;

use sluice_sys::error::Failure;

/// The cases a caller of the daemon (or a user, through the control socket) acts on
/// differently.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A switch of that name already runs.
    #[error(
        "switch {name:?} is already running (its socket {} answers); stop it first or choose another name",
        socket.display()
    )]
    AlreadyRunning {
        /// The switch.
        name: String,
        /// Its control socket.
        socket: PathBuf,
    },
    /// Something other than a socket a switch left is where the control socket goes.
    #[error(
        "{} is {what}, not a control socket; sluice removes only a socket a switch left behind: set `socket =` in the config to another path, or move that file away",
        path.display()
    )]
    NotASocket {
        /// The path.
        path: PathBuf,
        /// What is there.
        what: &'static str,
    },
    /// The kernel datapath could not start; the user-space one may.
    #[error("starting the kernel datapath (or run the switch with `datapath = \"user\"`)")]
    KernelStart(#[source] Box<Error>),
    /// The datapath did not take a job in time.
    #[error(
        "the datapath is busy: it did not take the request within {secs} s (it still runs it when it gets to it); try again, and if this lasts see the switch's log"
    )]
    Busy {
        /// How long the job waited.
        secs: u64,
    },
    /// The datapath has stopped (the switch is going away).
    #[error("the datapath has stopped")]
    Stopped,
    /// The datapath stopped while a job waited for it.
    #[error("the datapath stopped before answering")]
    StoppedBeforeAnswering,
    /// A port of that name is attached already.
    #[error("a port named {0:?} is already attached; choose another name or delete it first")]
    PortExists(String),
    /// No port of that name is attached.
    #[error("no port named {0:?} is attached (see `sluice port list`)")]
    NoPort(String),
    /// What the client said is not what the switch can do (its reason says why).
    #[error("{0}")]
    Refused(String),
    /// The switch's core refused.
    #[error(transparent)]
    Switch(#[from] sluice_switch::SwitchError),
    /// A port's device could not be opened.
    #[error(transparent)]
    Port(#[from] sluice_ports::Error),
    /// What the switch was told is wrong.
    #[error(transparent)]
    Api(#[from] sluice_api::Error),
    /// The kernel datapath refused.
    #[error(transparent)]
    Kernel(#[from] sluice_ebpf::Error),
    /// Anything else, said in a sentence.
    #[error(transparent)]
    Failed(#[from] Failure),
    /// A system call failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A result whose error is this crate's [`Error`] unless said otherwise.
pub type Result<T, E = Error> = std::result::Result<T, E>;
