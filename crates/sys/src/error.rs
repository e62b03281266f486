//! What every sluice library crate's error is built on: a [`Failure`] says, in a sentence,
//! what sluice was doing when something went wrong, and carries the error underneath (the
//! system call's, the parser's) as its source. Each crate's own `Error` (a `thiserror`
//! enum) names the cases its callers or users act on differently and wraps a `Failure` for
//! the rest; the command line prints the whole chain, outermost first.
//!
//! [`Context`] adds the sentence to a `Result` or an `Option`; [`bail!`](crate::bail) and
//! [`failure!`](crate::failure) make one from a format string. [`Error`] is this crate's
//! own.

use std::error::Error as StdError;
use std::fmt;
use std::io;

use crate::fs::FileError;

/// What the system-call wrappers refuse or fail at.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An interface name the kernel would refuse.
    #[error("interface name {name:?} {rule}")]
    Ifname {
        /// The name.
        name: String,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// A network namespace name `ip netns` would refuse.
    #[error(
        "network namespace {name:?} is not a name `ip netns` accepts: give the name `ip netns list` shows (1 to {max} bytes, no '/', not '.' or '..'), not a path"
    )]
    NetnsName {
        /// The name.
        name: String,
        /// The longest name accepted.
        max: usize,
    },
    /// A path someone else could swap or change.
    #[error(transparent)]
    File(#[from] FileError),
    /// Anything else, said in a sentence.
    #[error(transparent)]
    Failed(#[from] Failure),
    /// A system call failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A result whose error is this crate's [`Error`] unless said otherwise.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The error underneath a [`Failure`].
pub type Source = Box<dyn StdError + Send + Sync + 'static>;

/// Something failed: what sluice was doing, and why (the source, if any).
#[derive(Debug)]
pub struct Failure {
    what: String,
    source: Option<Source>,
}

impl Failure {
    /// A failure said in one sentence, with nothing underneath.
    pub fn msg(what: impl fmt::Display) -> Failure {
        Failure { what: what.to_string(), source: None }
    }

    /// A failure while doing `what`, caused by `source`.
    pub fn new(what: impl fmt::Display, source: impl Into<Source>) -> Failure {
        Failure { what: what.to_string(), source: Some(source.into()) }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

impl StdError for Failure {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source.as_deref().map(|s| s as &(dyn StdError + 'static))
    }
}

/// Shows an error with the errors underneath it, outermost first and `: `-separated, as the
/// command line prints a chain: `format!("{}", Report(&e))`.
pub struct Report<'a>(pub &'a (dyn StdError + 'static));

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            write!(f, ": {e}")?;
            next = e.source();
        }
        Ok(())
    }
}

/// Says what was being done when a `Result` failed or an `Option` was empty.
pub trait Context<T> {
    /// The failure `what`, with the error underneath as its source.
    fn context<C: fmt::Display>(self, what: C) -> Result<T, Failure>;

    /// [`Context::context`], with the sentence made only on failure.
    fn with_context<C: fmt::Display, F: FnOnce() -> C>(self, what: F) -> Result<T, Failure>;
}

impl<T, E: StdError + Send + Sync + 'static> Context<T> for Result<T, E> {
    fn context<C: fmt::Display>(self, what: C) -> Result<T, Failure> {
        self.map_err(|e| Failure::new(what, e))
    }

    fn with_context<C: fmt::Display, F: FnOnce() -> C>(self, what: F) -> Result<T, Failure> {
        self.map_err(|e| Failure::new(what(), e))
    }
}

impl<T> Context<T> for Option<T> {
    fn context<C: fmt::Display>(self, what: C) -> Result<T, Failure> {
        self.ok_or_else(|| Failure::msg(what))
    }

    fn with_context<C: fmt::Display, F: FnOnce() -> C>(self, what: F) -> Result<T, Failure> {
        self.ok_or_else(|| Failure::msg(what()))
    }
}

/// A [`Failure`] from a format string: `failure!("no switch named {name:?}")`.
#[macro_export]
macro_rules! failure {
    ($($arg:tt)*) => {
        $crate::error::Failure::msg(format!($($arg)*))
    };
}

/// Returns a [`Failure`] from a format string, converted into the function's error type.
#[macro_export]
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::error::Failure::msg(format!($($arg)*)).into())
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_reads_outermost_first() {
        let io = std::io::Error::from_raw_os_error(libc::ENOENT);
        let r: Result<(), _> = Err(io);
        let e = r.context("opening /run/sluice/s.sock").unwrap_err();
        assert_eq!(e.to_string(), "opening /run/sluice/s.sock");
        assert!(e.source().unwrap().to_string().contains("No such file"));
        let none: Option<u8> = None;
        assert_eq!(none.with_context(|| format!("no port {:?}", "g1")).unwrap_err().to_string(), "no port \"g1\"");
        assert!(Report(&e).to_string().starts_with("opening /run/sluice/s.sock: No such file"), "{}", Report(&e));
    }

    #[test]
    fn bail_converts_into_the_callers_error() {
        #[derive(Debug, thiserror::Error)]
        enum E {
            #[error(transparent)]
            Failed(#[from] Failure),
        }
        fn f(n: u8) -> Result<(), E> {
            if n > 1 {
                crate::bail!("{n} is too many: use 0 or 1");
            }
            Ok(())
        }
        assert_eq!(f(2).unwrap_err().to_string(), "2 is too many: use 0 or 1");
    }
}
