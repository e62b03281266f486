//! What setting up or launching the shared-memory fast path can fail at: each case a
//! sentence saying what to do.

use std::io;
use std::path::PathBuf;

use sluice_sys::error::Failure;

/// The cases a caller of the launcher acts on differently.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Setting up the shared runtime directory is root's job.
    #[error(
        "setting up the fast path in {} needs root (it decides which users may share memory); run `sudo sluice smc setup`",
        run.display()
    )]
    NeedsRoot {
        /// The runtime directory.
        run: PathBuf,
    },
    /// The group named to open the fast path to does not exist.
    #[error("no group {0} on this host: create it with `groupadd --system {0}`")]
    NoGroup(String),
    /// A private directory's path is taken by something not the user's.
    #[error("{} exists and is not a directory of yours: remove it, or set XDG_RUNTIME_DIR", .0.display())]
    NotYours(PathBuf),
    /// The library written is not safe to preload.
    #[error("{} is not safe to preload (another user can write it or its directory)", .0.display())]
    NotSafe(PathBuf),
    /// The program could not be started.
    #[error("cannot run {program}: {cause}")]
    CannotRun {
        /// The program.
        program: String,
        /// Why.
        cause: io::Error,
    },
    /// A rule or a threshold of the launcher's file or command line is wrong.
    #[error("{0}")]
    Config(String),
    /// Anything else, said in a sentence.
    #[error(transparent)]
    Failed(#[from] Failure),
    /// A system call failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A result whose error is this crate's [`Error`] unless said otherwise.
pub type Result<T, E = Error> = std::result::Result<T, E>;
