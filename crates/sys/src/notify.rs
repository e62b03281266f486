//! Telling the service manager how the daemon is doing: systemd's `sd_notify` protocol,
//! without libsystemd. Each state is one datagram of `KEY=VALUE` lines sent to the unix
//! socket named by `$NOTIFY_SOCKET` (set by systemd for a `Type=notify` unit).
//!
//! The variable comes from outside and is checked: an absolute path or `@name` (an
//! abstract socket) is used; anything else is ignored with one warning. Without the
//! variable every call is a no-op, so a switch run by hand behaves as before. A send that
//! fails returns its error for the caller to log: it never stops the daemon.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The variable systemd names its notification socket in.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// A sender of readiness notifications; [`Notifier::from_env`] reads where they go.
#[derive(Debug)]
pub struct Notifier {
    to: Option<(SocketAddr, String)>,
}

impl Notifier {
    /// Where `$NOTIFY_SOCKET` says: nowhere when it is unset or empty, and nowhere with
    /// the reason to warn about when it is not a socket address this accepts.
    pub fn from_env() -> (Notifier, Option<String>) {
        let Some(v) = std::env::var_os(NOTIFY_SOCKET).filter(|v| !v.is_empty()) else {
            return (Notifier::none(), None);
        };
        let shown = v.to_string_lossy().into_owned();
        match address(v.as_encoded_bytes()) {
            Ok(a) => (Notifier { to: Some((a, shown)) }, None),
            Err(why) => (
                Notifier::none(),
                Some(format!(
                    "ignoring {NOTIFY_SOCKET}={shown:?}: {why}; the service manager is not told of readiness"
                )),
            ),
        }
    }

    /// A notifier that sends nothing.
    pub fn none() -> Notifier {
        Notifier { to: None }
    }

    /// True when notifications go somewhere.
    pub fn active(&self) -> bool {
        self.to.is_some()
    }

    /// Sends `state`: newline-separated `KEY=VALUE` assignments such as `READY=1`. The
    /// error names the socket.
    pub fn notify(&self, state: &str) -> Result<(), String> {
        let Some((addr, shown)) = &self.to else { return Ok(()) };
        // (std makes every socket close-on-exec: SOCK_DGRAM|SOCK_CLOEXEC.)
        let sent = UnixDatagram::unbound().and_then(|s| s.send_to_addr(state.as_bytes(), addr));
        sent.map(|_| ()).map_err(|e| format!("cannot tell the service manager {state:?} on {shown}: {e}"))
    }

    /// `READY=1`, with a status line.
    pub fn ready(&self, status: &str) -> Result<(), String> {
        self.notify(&format!("READY=1\nSTATUS={}", one_line(status)))
    }

    /// `RELOADING=1` with the monotonic time it starts at, as systemd asks of a reload.
    pub fn reloading(&self, status: &str) -> Result<(), String> {
        self.notify(&format!("RELOADING=1\nMONOTONIC_USEC={}\nSTATUS={}", monotonic_usec(), one_line(status)))
    }

    /// `STOPPING=1`, with a status line.
    pub fn stopping(&self, status: &str) -> Result<(), String> {
        self.notify(&format!("STOPPING=1\nSTATUS={}", one_line(status)))
    }

    /// A `STATUS=` line only.
    pub fn status(&self, status: &str) -> Result<(), String> {
        self.notify(&format!("STATUS={}", one_line(status)))
    }
}

/// A status as one line (a newline would start another assignment).
fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

/// The socket address `$NOTIFY_SOCKET`'s bytes name: an absolute path, or `@name` for
/// the abstract namespace.
fn address(v: &[u8]) -> Result<SocketAddr, String> {
    match v.first() {
        Some(b'/') => {
            let p = std::path::Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(v));
            SocketAddr::from_pathname(p).map_err(|e| format!("not a usable socket path ({e})"))
        }
        Some(b'@') if v.len() > 1 => {
            SocketAddr::from_abstract_name(&v[1..]).map_err(|e| format!("not a usable abstract name ({e})"))
        }
        _ => Err("it is neither an absolute path nor @name (an abstract socket)".into()),
    }
}

/// `CLOCK_MONOTONIC` in microseconds (what systemd compares `MONOTONIC_USEC` with).
pub fn monotonic_usec() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000 + t.tv_nsec as u64 / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_absolute_paths_and_abstract_names_are_taken() {
        assert!(address(b"/run/systemd/notify").is_ok());
        assert!(address(b"@sluice-test").is_ok());
        for bad in [&b"relative/sock"[..], b"@", b"", b"~/x"] {
            assert!(address(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let long = [b"/".as_slice(), &[b'a'; 200]].concat();
        assert!(address(&long).is_err());
    }

    #[test]
    fn states_arrive_as_one_datagram_each_on_a_socket_we_listen_on() {
        let d = crate::fs::TempDir::new("sluice-notify").unwrap();
        let path = d.path().join("notify.sock");
        let listener = UnixDatagram::bind(&path).unwrap();
        listener.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let n = Notifier { to: Some((SocketAddr::from_pathname(&path).unwrap(), path.display().to_string())) };
        let before = monotonic_usec();
        n.ready("2 ports\nattached").unwrap();
        n.reloading("reloading").unwrap();
        let mut buf = [0u8; 512];
        let got = |buf: &mut [u8]| {
            let k = listener.recv(buf).unwrap();
            String::from_utf8(buf[..k].to_vec()).unwrap()
        };
        assert_eq!(got(&mut buf), "READY=1\nSTATUS=2 ports attached");
        let r = got(&mut buf);
        let usec: u64 = r.lines().find_map(|l| l.strip_prefix("MONOTONIC_USEC=")).unwrap().parse().unwrap();
        assert!(r.starts_with("RELOADING=1\n") && usec >= before, "{r}");
        // An abstract socket too.
        let name = format!("sluice-notify-test-{}", std::process::id());
        let abs = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
        abs.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let n = Notifier { to: Some((address(format!("@{name}").as_bytes()).unwrap(), name)) };
        n.stopping("bye").unwrap();
        let k = abs.recv(&mut buf).unwrap();
        assert_eq!(&buf[..k], b"STOPPING=1\nSTATUS=bye");
        // Nowhere: nothing happens.
        Notifier::none().ready("x").unwrap();
    }
}
