//! The names the kernel gives things sluice creates or enters — interfaces and network
//! namespaces — checked the way the kernel and `ip` will, before any system call sees them.

/// Checks an interface name the way the kernel will (IFNAMSIZ is 16 with the NUL).
pub fn check_ifname(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() >= 16 {
        return Err(format!("interface name {name:?} must be 1 to 15 bytes long"));
    }
    if name == "." || name == ".." || name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace()) {
        return Err(format!("interface name {name:?} may not contain '/', ':' or spaces"));
    }
    Ok(())
}

/// The longest namespace name `ip netns` accepts (`NAME_MAX`).
const NETNS_NAME_MAX: usize = 255;

/// Checks a network namespace name (`netns`, `--netns`) as `ip netns` does: 1 to 255 bytes,
/// no `/` (nor a NUL byte), not `.` or `..` — a name in /run/netns, never a path out of it.
/// (A namespace named by its path, as container runtimes hand them out, would be a setting
/// of its own with checks of its own.)
pub fn check_netns_name(name: &str) -> Result<(), String> {
    let ok =
        !name.is_empty() && name.len() <= NETNS_NAME_MAX && name != "." && name != ".." && !name.contains(['/', '\0']);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "network namespace {name:?} is not a name `ip netns` accepts: give the name `ip netns list` shows (1 to {NETNS_NAME_MAX} bytes, no '/', not '.' or '..'), not a path"
        ))
    }
}
