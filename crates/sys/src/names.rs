//! The names the kernel gives things sluice creates or enters — interfaces and network
//! namespaces — checked the way the kernel and `ip` will, before any system call sees them.

use crate::error::{Error, Result};

/// Checks an interface name the way the kernel will (IFNAMSIZ is 16 with the NUL).
pub fn check_ifname(name: &str) -> Result<()> {
    let refuse = |rule| Err(Error::Ifname { name: name.to_string(), rule });
    if name.is_empty() || name.len() >= 16 {
        return refuse("must be 1 to 15 bytes long");
    }
    if name == "." || name == ".." || name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace()) {
        return refuse("may not contain '/', ':' or spaces");
    }
    Ok(())
}

/// The longest namespace name `ip netns` accepts (`NAME_MAX`).
const NETNS_NAME_MAX: usize = 255;

/// Checks a network namespace name (`netns`, `--netns`) as `ip netns` does: 1 to 255 bytes,
/// no `/` (nor a NUL byte), not `.` or `..` — a name in /run/netns, never a path out of it.
/// (A namespace named by its path, as container runtimes hand them out, would be a setting
/// of its own with checks of its own.)
pub fn check_netns_name(name: &str) -> Result<()> {
    let ok =
        !name.is_empty() && name.len() <= NETNS_NAME_MAX && name != "." && name != ".." && !name.contains(['/', '\0']);
    if ok { Ok(()) } else { Err(Error::NetnsName { name: name.to_string(), max: NETNS_NAME_MAX }) }
}
