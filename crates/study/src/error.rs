//! What can go wrong running and reporting studies: the cases a caller or user acts on
//! differently, and a [`Failure`] for the rest.

use sluice_sys::error::Failure;

/// An error of sluice-study.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A study was run without root (it builds network namespaces).
    #[error("sluice study builds network namespaces: run it as root")]
    NotRoot,
    /// None of the study's paths can run on this host (each skipped, with the reason).
    #[error("none of the study's paths can run here")]
    NoPathRuns {
        /// Each path, and why it cannot run here.
        skipped: Vec<(String, String)>,
    },
    /// A study file is wrong (its file and line say where).
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A workload's profile is wrong (its file and line say where).
    #[error(transparent)]
    Profile(#[from] sluice_bench::profile::ProfileError),
    /// Something else failed.
    #[error(transparent)]
    Failed(#[from] Failure),
    /// An error of the switch's control client or configuration.
    #[error(transparent)]
    Api(#[from] sluice_api::Error),
    /// A file or process operation failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// An error of sluice-lab.
    #[error(transparent)]
    Lab(#[from] sluice_lab::error::Error),
}

impl Error {
    /// The error and what caused it, outermost first, joined by ": " (a line for a warning
    /// or a list of problems).
    pub fn chain(&self) -> String {
        sluice_sys::error::Report(self).to_string()
    }
}

/// A `Result` of sluice-study.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A study file that cannot be used, with where and why.
#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct SpecError {
    /// The file (or built-in name).
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// What is wrong and what to do.
    pub message: String,
}
