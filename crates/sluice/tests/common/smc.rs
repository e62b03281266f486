//! Helpers for the tests of `sluice smc`: peers (tests/smc_peer.py) under the launcher or
//! not, each test in a runtime directory of its own; and running them as an unprivileged
//! user, for the tests of the fast path's trust boundary.

use super::children::end_tree;
use super::*;

/// Peers of one test: their own runtime directory (registry and statistics), so tests
/// running in parallel do not see each other.
pub struct Peers {
    pub dir: std::path::PathBuf,
}

impl Peers {
    /// Peers in a new runtime directory `tag`; fails saying what to do without root (only
    /// root's launcher sets the fast path up there) or python3 (the peers are
    /// tests/smc_peer.py).
    pub fn new(tag: &str) -> Peers {
        root_for("`sluice smc run` sets the fast path up only as root");
        have("python3");
        let dir = run_dir().join(format!("smc-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Peers { dir }
    }

    pub fn cmd(&self, launcher: bool, args: &[&str]) -> std::process::Command {
        self.cmd_in(None, launcher, args)
    }

    /// A peer in network namespace `ns` (as root), under the launcher or not.
    pub fn cmd_in(&self, ns: Option<&str>, launcher: bool, args: &[&str]) -> std::process::Command {
        self.cmd_with(ns, launcher.then_some(&[]), args)
    }

    /// A peer in network namespace `ns`, under the launcher with `flags` (`None`: not).
    pub fn cmd_with(&self, ns: Option<&str>, flags: Option<&[&str]>, args: &[&str]) -> std::process::Command {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/smc_peer.py");
        let mut argv: Vec<&str> = Vec::new();
        if let Some(ns) = ns {
            argv.extend(["ip", "netns", "exec", ns]);
        }
        if let Some(flags) = flags {
            argv.extend([BIN, "smc", "run"]);
            argv.extend(flags);
            argv.push("--");
        }
        argv.extend(["python3", script]);
        argv.extend(args);
        let mut c = std::process::Command::new(argv[0]);
        c.args(&argv[1..]).env("SLUICE_RUN_DIR", &self.dir).stdin(std::process::Stdio::null());
        c
    }

    /// Starts a server and waits until it listens; returns it and a reader of its output.
    pub fn serve(&self, launcher: bool, args: &[&str]) -> (std::process::Child, Out) {
        self.serve_cmd(self.cmd(launcher, args))
    }

    pub fn serve_cmd(&self, mut cmd: std::process::Command) -> (std::process::Child, Out) {
        use std::io::BufRead;
        let mut c = cmd.stdout(std::process::Stdio::piped()).spawn().unwrap();
        let mut out = std::io::BufReader::new(c.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "listening", "server did not start");
        (c, out)
    }

    /// Runs a client to completion (at most 120 s) and returns its output.
    pub fn run(&self, launcher: bool, args: &[&str]) -> String {
        self.run_cmd(self.cmd(launcher, args))
    }

    pub fn run_cmd(&self, cmd: std::process::Command) -> String {
        Peers::run_cmd_static(cmd)
    }

    /// [`Peers::run_cmd`] without the peers (for a client on a thread of its own).
    pub fn run_cmd_static(mut cmd: std::process::Command) -> String {
        let mut c = cmd.stdout(std::process::Stdio::piped()).spawn().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while c.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = c.kill();
                panic!("client {cmd:?} hung");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "client {cmd:?} failed: {}", String::from_utf8_lossy(&o.stdout));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    pub fn stats(&self) -> serde_json::Value {
        let o = std::process::Command::new(BIN)
            .args(["smc", "stats", "--json"])
            .env("SLUICE_RUN_DIR", &self.dir)
            .output()
            .unwrap();
        assert!(o.status.success());
        serde_json::from_slice(&o.stdout).unwrap()
    }
}

/// The rest of a server's output.
pub type Out = std::io::BufReader<std::process::ChildStdout>;

pub fn rest(out: Out) -> String {
    use std::io::Read;
    let mut s = String::new();
    let mut out = out;
    out.read_to_string(&mut s).unwrap();
    s.trim().to_string()
}

/// Port `n` (0–99) of this test process, from the kernel: the first time a test asks for
/// `n`, a socket bound to 127.0.0.1 port 0 gets one, which is kept for `n` (the server and
/// its clients ask for the same `n`) and never given to another `n`; the socket closes at
/// once, so the test's server can bind it. Tests of one process run in parallel, so each
/// `n` belongs to one test (tests/smc.rs: 0–9, 13–14, 20–21 and 25–49 fixed; 10–11,
/// 15–17 and 22–24 in loops; 12 the MSG_TRUNC case; 18 the many declines; 19 the
/// inetd-style hand-over; 50–53 the programs that close every other descriptor, the echo,
/// sshd).
pub fn port(n: u16) -> String {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    static GIVEN: Mutex<BTreeMap<u16, u16>> = Mutex::new(BTreeMap::new());
    assert!(n < 100);
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = given.get(&n) {
        return p.to_string();
    }
    // Bounded: the kernel hands out ports at random, rarely one already given.
    for _ in 0..100 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a port from the kernel");
        let p = l.local_addr().unwrap().port();
        if !given.values().any(|&v| v == p) {
            given.insert(n, p);
            return p.to_string();
        }
    }
    panic!("the kernel gave only ports already given");
}

/// A background process killed when the test ends, even on failure.
pub struct Killed(pub std::process::Child);

impl Killed {
    /// The process, no longer to be killed: the test waits for it to end by itself.
    pub fn take(self) -> std::process::Child {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped, so the child is moved out exactly once.
        unsafe { std::ptr::read(&me.0) }
    }
}

impl Drop for Killed {
    /// Kills the process and everything it started ([`end_tree`]); when it leads a process
    /// group of its own (spawned with `process_group(0)`), the group is asked to stop
    /// first: nginx's master then stops its workers (which run as `nobody`, and would
    /// otherwise outlive the test holding its listening socket).
    fn drop(&mut self) {
        let Ok(pid) = i32::try_from(self.0.id()) else { return };
        // A process group of its own: asked to stop first (nginx's master then stops and
        // reaps its workers), at most 5 s, then killed whole.
        // SAFETY: a signal to the process group our child leads, if it leads one (else no
        // such group exists and the call fails harmlessly).
        if unsafe { libc::kill(-pid, libc::SIGTERM) } == 0 {
            let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while std::time::Instant::now() < end && matches!(self.0.try_wait(), Ok(None)) {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            // SAFETY: as above.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        end_tree(pid);
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn sluice_ok_in(p: &Peers, args: &[&str]) {
    let o = std::process::Command::new(BIN).args(args).env("SLUICE_RUN_DIR", &p.dir).output().unwrap();
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
}

pub fn fallbacks(st: &serde_json::Value, side: &str) -> u64 {
    st[side].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum()
}

/// The path of `file` as user nobody can reach it: hard-linked (or copied) into this test
/// process's runtime directory, which is world-readable — a checkout under a private home
/// directory is not.
pub fn reachable(file: &str) -> String {
    let dir = run_dir().join("bin");
    std::fs::create_dir_all(&dir).unwrap();
    let name = std::path::Path::new(file).file_name().unwrap();
    let to = dir.join(name);
    if !to.exists() {
        let tmp = dir.join(format!(".{}-{:?}", name.to_string_lossy(), std::thread::current().id()));
        let _ = std::fs::remove_file(&tmp);
        if std::fs::hard_link(file, &tmp).is_err() {
            std::fs::copy(file, &tmp).unwrap();
        }
        let _ = std::fs::rename(&tmp, &to);
    }
    to.to_string_lossy().into_owned()
}

/// The tests' hostile peer (tests/smc_hostile.py).
pub const HOSTILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/smc_hostile.py");
/// The tests' peers (tests/smc_peer.py).
pub const PEER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/smc_peer.py");

/// The uid the unprivileged tests run as.
pub const NOBODY: u32 = 65534;

/// `argv` run as user nobody (uid 65534) with supplementary groups `groups` (none: no
/// group at all), through setpriv; `python3` is the system's, which that user can run.
pub fn as_nobody(groups: &[u32], argv: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new("setpriv");
    c.args([format!("--reuid={NOBODY}"), format!("--regid={NOBODY}")]);
    if groups.is_empty() {
        c.arg("--clear-groups");
    } else {
        let g: Vec<String> = groups.iter().map(u32::to_string).collect();
        c.arg(format!("--groups={}", g.join(",")));
    }
    c.args(argv.iter().map(|a| if *a == "python3" { "/usr/bin/python3" } else { a }));
    c.stdin(std::process::Stdio::null());
    c
}

/// A network namespace of the test's own, with loopback up, deleted on drop.
pub struct Netns(pub String);

impl Netns {
    pub fn new(tag: &str) -> Netns {
        let name = format!("sluice-{}-{tag}", unique("smc"));
        sh_ok(&format!("ip netns add {name} && ip -n {name} link set lo up"));
        Netns(name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// A group of the test's own, deleted on drop.
pub struct Group(pub String);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = std::process::Command::new("groupdel").arg(&self.0).status();
    }
}

impl Group {
    /// A new group named after this process and `tag`; the runtime directory `p` set up
    /// for it with `sluice smc setup`.
    pub fn new(p: &Peers, tag: &str) -> (Group, u32) {
        let name = format!("sluicet{}{tag}", std::process::id() % 100_000);
        sh_ok(&format!("groupadd {name}"));
        let g = Group(name);
        let gid: u32 = sh_ok(&format!("getent group {} | cut -d: -f3", g.0)).trim().parse().unwrap();
        let said = std::process::Command::new(BIN)
            .args(["smc", "setup", "--group", &g.0])
            .env("SLUICE_RUN_DIR", &p.dir)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&said.stdout);
        assert!(said.contains(&format!("open to root and members of group {}", g.0)), "{said}");
        (g, gid)
    }
}
