//! Who may use the fast path, and the directories it lives in (docs/architecture.md, "The
//! fast path's trust boundary").
//!
//! The runtime directory's `smc/` holds the library (`lib/`, root's only) and five shared
//! directories. With a group they are mode 3770 owned by root and that group: members
//! create entries (setgid: each gets the group), and only an entry's owner can remove or
//! replace it (sticky). Without a group they are 0755 root: root only. The library and the
//! launcher read the policy back from the door directory's owner, group and mode, so both
//! follow what `sluice smc setup` made.

/// The directories every allowed user's programs write into.
pub const SHARED_DIRS: [&str; 4] = ["listen", "door", "conn", "stats"];
/// Mode of a shared directory when a group may use the fast path.
pub const GROUP_DIR_MODE: u32 = 0o3770;
/// Mode of `smc/`, `smc/lib/`, and of the shared directories without a group.
pub const ROOT_DIR_MODE: u32 = 0o755;
/// Mode of a side door when a group may use the fast path…
pub const DOOR_MODE_GROUP: u32 = 0o660;
/// …and without one.
pub const DOOR_MODE_OWNER: u32 = 0o600;
/// Mode of registry entries, connection tables and statistics files.
pub const ENTRY_MODE: u32 = 0o644;
/// The group that may use the fast path when `sluice smc setup` is not told another.
pub const DEFAULT_GROUP: &str = "sluice";

/// The name of process `pid`'s side door in `door/`.
pub fn door_name(pid: u32) -> String {
    format!("{pid}.sock")
}

/// The name of a listener entry in `listen/`: `ADDR_PORT.NETNS.PID`, where `ADDR_PORT`
/// names the address listened on and NETNS is its network namespace's inode.
pub fn listener_name(addr_port: &str, netns: u64, pid: u32) -> String {
    format!("{addr_port}.{netns}.{pid}")
}

/// A listener entry's name read back: (`ADDR_PORT`, netns, pid).
pub fn parse_listener_name(name: &str) -> Option<(&str, u64, u32)> {
    let (rest, pid) = name.rsplit_once('.')?;
    let (addr_port, netns) = rest.rsplit_once('.')?;
    Some((addr_port, netns.parse().ok()?, pid.parse().ok()?))
}

/// The process an entry of `door/`, `listen/` or `conn/` (`dir`) belongs to.
pub fn entry_pid(dir: &str, name: &str) -> Option<u32> {
    match dir {
        "door" => name.strip_suffix(".sock")?.parse().ok(),
        "listen" => parse_listener_name(name).map(|(_, _, pid)| pid),
        // A process's table of its connections: PID (PID-N before sluice 0.2's tables).
        "conn" => name.split('-').next()?.parse().ok(),
        _ => None,
    }
}

/// A user as the kernel reports it (`SO_PEERCRED` and `SO_PEERGROUPS`, or the process's own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cred {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

/// Why a runtime directory is not trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsafe {
    /// Owned by a user other than root or the caller.
    Owner(u32),
    /// Writable by every user.
    WorldWritable,
    /// Writable by users other than its owner, where only the owner may write
    /// (`smc/` and `smc/lib/`, whose library other users' programs load).
    Shared,
}

impl std::fmt::Display for Unsafe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unsafe::Owner(uid) => write!(f, "it belongs to uid {uid}, not to root"),
            Unsafe::WorldWritable => f.write_str("every user can write it"),
            Unsafe::Shared => f.write_str("users other than its owner can write it"),
        }
    }
}

impl std::error::Error for Unsafe {}

/// The policy a layout's door directory says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// The directory's owner: root, or the user of a private runtime directory.
    pub owner: u32,
    /// The group whose members may use the fast path, if any.
    pub group: Option<u32>,
}

impl Policy {
    /// The policy of a door directory with this owner, group and mode, as seen by user `me`.
    pub fn from_dir(owner: u32, gid: u32, mode: u32, me: u32) -> Result<Policy, Unsafe> {
        if owner != 0 && owner != me {
            return Err(Unsafe::Owner(owner));
        }
        if mode & 0o002 != 0 {
            return Err(Unsafe::WorldWritable);
        }
        Ok(Policy { owner, group: (mode & 0o020 != 0).then_some(gid) })
    }

    /// May `user` use the fast path here at all?
    pub fn allows(&self, user: &Cred) -> bool {
        user.uid == 0 || user.uid == self.owner || self.group.is_some_and(|g| user.gid == g || user.groups.contains(&g))
    }

    /// May `peer` share a connection with a program of user `me`? `exact`: the connection
    /// was proven to be the peer's by the kernel (both ends in one network namespace);
    /// otherwise a same-addresses socket in another namespace cannot be told apart, and
    /// only root or `me` itself, who could take the connection anyway, may.
    pub fn peer_allowed(&self, peer: &Cred, me: u32, exact: bool) -> bool {
        peer.uid == 0 || peer.uid == me || (exact && self.allows(peer))
    }

    /// Checks a directory only its owner may write (`smc/`, `smc/lib/`).
    pub fn check_private_dir(owner: u32, mode: u32, me: u32) -> Result<(), Unsafe> {
        if owner != 0 && owner != me {
            return Err(Unsafe::Owner(owner));
        }
        if mode & 0o022 != 0 {
            return Err(Unsafe::Shared);
        }
        Ok(())
    }

    /// Who may use the fast path, in words.
    pub fn describe(&self, group_name: Option<&str>) -> String {
        let owner = if self.owner == 0 { "root".to_string() } else { format!("uid {}", self.owner) };
        match (self.group, group_name) {
            (Some(_), Some(name)) => format!("{owner} and members of group {name}"),
            (Some(g), None) => format!("{owner} and members of group {g}"),
            (None, _) => format!("{owner} only"),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn entry_names_read_back() {
        let l = super::listener_name("10.77.0.1_5201", 4026531840, 42);
        assert_eq!(super::parse_listener_name(&l), Some(("10.77.0.1_5201", 4026531840, 42)));
        assert_eq!(super::entry_pid("listen", &l), Some(42));
        assert_eq!(super::entry_pid("conn", "42-7"), Some(42));
        assert_eq!(super::entry_pid("conn", "x-7"), None);
        assert_eq!(super::entry_pid("door", &super::door_name(7)), Some(7));
        assert_eq!(super::entry_pid("door", "x.sock"), None);
        assert_eq!(super::parse_listener_name("fd77--1_80"), None);
    }

    use super::*;

    fn user(uid: u32, gid: u32, groups: &[u32]) -> Cred {
        Cred { uid, gid, groups: groups.to_vec() }
    }

    #[test]
    fn a_group_directory_lets_its_members_in_and_nobody_else() {
        let p = Policy::from_dir(0, 990, 0o3770, 1000).unwrap();
        assert_eq!(p.group, Some(990));
        assert!(p.allows(&user(0, 0, &[])));
        assert!(p.allows(&user(1000, 1000, &[990])));
        assert!(p.allows(&user(1001, 990, &[])), "primary group counts");
        assert!(!p.allows(&user(65534, 65534, &[])));
        // Across namespaces, members of the group are not enough.
        assert!(p.peer_allowed(&user(1000, 1000, &[990]), 1001, true));
        assert!(!p.peer_allowed(&user(1000, 1000, &[990]), 1001, false));
        assert!(p.peer_allowed(&user(1001, 1001, &[]), 1001, false), "the same user");
        assert!(p.peer_allowed(&user(0, 0, &[]), 1001, false), "root");
        assert_eq!(p.describe(Some("sluice")), "root and members of group sluice");
    }

    #[test]
    fn without_a_group_root_only_and_unsafe_directories_are_refused() {
        let p = Policy::from_dir(0, 0, 0o755, 1000).unwrap();
        assert_eq!(p.group, None);
        assert!(!p.allows(&user(1000, 1000, &[0])));
        assert!(p.allows(&user(0, 0, &[])));
        assert_eq!(p.describe(None), "root only");
        assert_eq!(Policy::from_dir(1000, 1000, 0o755, 1001), Err(Unsafe::Owner(1000)));
        assert_eq!(Policy::from_dir(0, 0, 0o1777, 1000), Err(Unsafe::WorldWritable));
        assert_eq!(Policy::check_private_dir(0, 0o775, 1000), Err(Unsafe::Shared));
        assert_eq!(Policy::check_private_dir(0, 0o755, 1000), Ok(()));
        // A private runtime directory: its owner is allowed there.
        let mine = Policy::from_dir(1000, 1000, 0o700, 1000).unwrap();
        assert!(mine.allows(&user(1000, 1000, &[])));
    }
}
