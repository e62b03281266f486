//! What can go wrong making, using and removing labs: the cases a caller or user acts on
//! differently, and a [`Failure`] for the rest.

use sluice_sys::error::Failure;

/// An error of sluice-lab.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A lab command that changes namespaces and interfaces was run without root.
    #[error(
        "`sluice lab {verb}` needs root: it creates and removes network namespaces and interfaces, and enters them; run it with sudo"
    )]
    NotRoot {
        /// The lab command: up, down, exec or reboot.
        verb: &'static str,
    },
    /// A program the lab runs is not installed.
    #[error("`{tool}` is not installed (apt-get install {package}): {needed_for}")]
    ToolMissing {
        /// The program.
        tool: &'static str,
        /// The Debian package that has it.
        package: &'static str,
        /// What needs it.
        needed_for: &'static str,
    },
    /// A lab of that name is already up (or left its state behind).
    #[error("lab {name} is already up; remove it with `sluice lab down --name {name}` or pick another --name")]
    LabExists {
        /// The lab.
        name: String,
    },
    /// No lab of that name is up.
    #[error("no lab named {name:?}{}", if up.is_empty() { " (no lab is up)".to_string() } else { format!(" (labs: {})", up.join(", ")) })]
    NoSuchLab {
        /// The name asked for.
        name: String,
        /// The labs that are up.
        up: Vec<String>,
    },
    /// The switch the lab started exited at once because the kernel datapath could not
    /// start here (the lab then tries the user-space datapath).
    #[error("the switch daemon exited at start:\n{log}")]
    KernelDatapathRefused {
        /// The daemon's log.
        log: String,
    },
    /// Something else failed.
    #[error(transparent)]
    Failed(#[from] Failure),
    /// An error of the switch's control client or configuration.
    #[error(transparent)]
    Api(#[from] sluice_api::Error),
    /// An error of the switch daemon's code the lab runs (the kernel datapath's leftovers).
    #[error(transparent)]
    Daemon(#[from] sluice_daemon::Error),
    /// An error of the shared-memory fast path's launcher (a path run under `sluice smc run`).
    #[error(transparent)]
    Smc(#[from] sluice_smc_launch::Error),
    /// An address the lab derived from its own plan did not parse (a defect of the lab).
    #[error("the lab made an address that does not parse: {0}")]
    Address(#[from] std::net::AddrParseError),
    /// A file or process operation failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl Error {
    /// The error and what caused it, outermost first, joined by ": " (a line for a warning
    /// or a list of problems).
    pub fn chain(&self) -> String {
        sluice_sys::error::Report(self).to_string()
    }
}

/// A `Result` of sluice-lab.
pub type Result<T, E = Error> = std::result::Result<T, E>;
