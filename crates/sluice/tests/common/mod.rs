//! Helpers for sluice's integration tests: labs built by the real binary, commands run in
//! guest namespaces, counters read back as JSON. Everything a test creates has a name
//! unique to the test process and is removed when the guard drops, even on failure.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod children;
pub mod smc;

pub const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// The system tier's tests call this first: it returns true when the test runs as root
/// (namespaces and TAPs need it) and otherwise fails the test saying what to do. A test
/// that cannot do what it is for never passes: these tests are `#[ignore]`d, and run only
/// when asked for (`--include-ignored`, as scripts/test.sh does).
pub fn root() -> bool {
    root_for("network namespaces and TAP devices")
}

/// [`root`], for `what` (said in the failure).
pub fn root_for(what: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let ok = unsafe { libc::geteuid() } == 0;
    assert!(ok, "needs root ({what}): run scripts/test.sh as root, or leave out --include-ignored");
    children::end_at_exit();
    ok
}

static INIT: Once = Once::new();
/// The runtime directory [`init`] made for this process.
static RUN_DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// A new directory `$TMPDIR/PREFIX.XXXXXX` (mode 0700) made by `mkdtemp`: never one that
/// exists, so nothing another user planted under a predictable name is used.
pub fn mkdtemp(prefix: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let mut t = std::env::temp_dir().join(format!("{prefix}.XXXXXX")).into_os_string().into_vec();
    t.push(0);
    // SAFETY: `t` is NUL-terminated and writable; mkdtemp fills in the Xs in place.
    let p = unsafe { libc::mkdtemp(t.as_mut_ptr().cast()) };
    assert!(!p.is_null(), "mkdtemp: {}", std::io::Error::last_os_error());
    t.pop();
    PathBuf::from(std::ffi::OsString::from_vec(t))
}

/// Isolates this test process's switches and labs in their own runtime directory, a new
/// one of its own (`mkdtemp`).
pub fn init() {
    INIT.call_once(|| {
        let dir = mkdtemp("sluice-test");
        // The labs' guests and the SMC tests' programs run as other users: they may pass
        // through, as through /run/sluice, but not write.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let _ = RUN_DIR.set(dir.clone());
        // SAFETY: set once, before any test thread reads the environment concurrently
        // through a child process spawn of ours (Once serializes the first callers).
        unsafe { std::env::set_var("SLUICE_RUN_DIR", &dir) };
        children::end_at_exit();
    });
}

/// At the test process's exit ([`children::end_at_exit`]): removes its runtime directory
/// (switch sockets, lab state, the SMC tests' copies of the binary), so a suite run leaves
/// nothing in the temporary directory. The kernel datapath's bpffs there is unmounted
/// first when no switch has pins in it; when one still has (a switch a failed test left
/// running), everything stays.
fn remove_run_dir() {
    // Only the directory `init` made for this process.
    let Some(dir) = RUN_DIR.get() else { return };
    let bpf = dir.join("bpf");
    let pinned = std::fs::read_dir(&bpf).map(|rd| rd.flatten().any(|e| e.file_type().is_ok_and(|t| t.is_dir())));
    if pinned.unwrap_or(false) {
        return;
    }
    if let Ok(c) = std::ffi::CString::new(bpf.as_os_str().as_encoded_bytes()) {
        // SAFETY: umount of a NUL-terminated path; fails harmlessly when nothing is mounted.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
    let _ = std::fs::remove_dir_all(dir);
}

pub fn run_dir() -> PathBuf {
    init();
    PathBuf::from(std::env::var_os("SLUICE_RUN_DIR").unwrap())
}

/// A directory `tag` of the test's own for its files (configs, logs, captures), inside the
/// runtime directory [`init`] made: nobody else can have put anything there, and it goes
/// with the rest at exit.
pub fn scratch(tag: &str) -> PathBuf {
    let d = run_dir().join(format!("scratch-{tag}"));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A unique lab name for `tag` (at most 10 characters).
pub fn unique(tag: &str) -> String {
    format!("{}{}", &tag[..tag.len().min(5)], std::process::id() % 100_000)
}

/// Which datapath a test runs against: the suites of switching, VLANs, Layer 3, uplinks,
/// security and mirrors run once per datapath ([`both_datapaths!`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dp {
    /// One user-space thread; guests on TAPs.
    User,
    /// TC programs; guests on veth pairs.
    Kernel,
}

impl Dp {
    /// `sluice lab up` arguments selecting it.
    pub fn args(self) -> &'static [&'static str] {
        match self {
            Dp::User => &["--datapath", "user"],
            Dp::Kernel => &["--datapath", "kernel"],
        }
    }

    /// A lab-name tag distinct per datapath, so both variants of a test run side by side.
    fn tag(self, tag: &str) -> String {
        match self {
            Dp::User => tag.to_string(),
            Dp::Kernel => format!("{}k", &tag[..tag.len().min(4)]),
        }
    }
}

/// Defines a test once and runs it against both datapaths: `name::user` and
/// `name::kernel`, each calling the body with its [`Dp`]. The attributes given (its doc,
/// `#[ignore = "…"]`) go on both tests.
#[macro_export]
macro_rules! both_datapaths {
    ($(#[$m:meta])* fn $name:ident($dp:ident: Dp) $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            fn run($dp: Dp) $body
            #[test]
            $(#[$m])*
            fn user() {
                run(Dp::User)
            }
            #[test]
            $(#[$m])*
            fn kernel() {
                run(Dp::Kernel)
            }
        }
    };
}

pub fn sluice(args: &[&str]) -> Output {
    init();
    Command::new(BIN).args(args).stdin(Stdio::null()).output().expect("run sluice")
}

pub fn sluice_ok(args: &[&str]) -> String {
    let o = sluice(args);
    assert!(
        o.status.success(),
        "sluice {args:?} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs a shell command in namespace `ns` (`""`: the test's own, where the kernel
/// datapath's uplink devices are).
pub fn ns_sh(ns: &str, cmd: &str) -> Output {
    if ns.is_empty() {
        return Command::new("sh").args(["-c", cmd]).stdin(Stdio::null()).output().expect("sh");
    }
    Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-c", cmd])
        .stdin(Stdio::null())
        .output()
        .expect("ip netns exec")
}

pub fn ns_ok(ns: &str, cmd: &str) -> String {
    let o = ns_sh(ns, cmd);
    assert!(
        o.status.success(),
        "in {ns}: `{cmd}` failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn ns_spawn(ns: &str, cmd: &str) -> Child {
    Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-c", cmd])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn in namespace")
}

pub fn sh_ok(cmd: &str) -> String {
    let o = Command::new("sh").args(["-c", cmd]).output().expect("sh");
    assert!(o.status.success(), "`{cmd}` failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// True when `tool` is installed; otherwise fails the test saying what to do (the system
/// tier's tests call it beside [`root`]).
pub fn have(tool: &str) -> bool {
    let ok = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "needs {tool}: install it (scripts/test.sh installs every tool the tests drive), or leave out --include-ignored"
    );
    ok
}

/// A switch of a test's own, run from a configuration file (`sluice switch run --config`)
/// — for settings `lab up` does not take — with a guest namespace `SWITCHgI` per entry of
/// `ports` (that port's settings): a TAP `SWITCHtI` on the user-space datapath, a veth pair
/// `SWITCHtI` (both ends) on the kernel one. Stopped, and its namespaces and files removed,
/// on drop.
pub struct FileSwitch {
    pub name: String,
    pub namespaces: Vec<String>,
    child: Child,
    /// Its scratch directory (configuration, log), removed on drop.
    pub dir: PathBuf,
}

impl FileSwitch {
    /// Starts switch `name` on datapath `dp` with switch settings `extra`; `ns_setup` runs
    /// in each guest namespace before its port is made (empty: nothing). Waits (at most
    /// 10 s) until the switch answers; the guests' interfaces ([`FileSwitch::iface`]) are
    /// the caller's to address and bring up.
    pub fn start(name: String, dp: Dp, extra: &str, ports: &[&str], ns_setup: &str) -> FileSwitch {
        init();
        let dir = scratch(&name);
        let datapath = if dp == Dp::Kernel { "kernel" } else { "user" };
        let mut cfg = format!("name = \"{name}\"\ndatapath = \"{datapath}\"\n{extra}\n");
        let mut namespaces = vec![];
        for (i, settings) in ports.iter().enumerate().map(|(i, s)| (i + 1, s)) {
            let ns = format!("{name}g{i}");
            sh_ok(&format!("ip netns add {ns} && ip -n {ns} link set lo up"));
            namespaces.push(ns.clone());
            if !ns_setup.is_empty() {
                ns_ok(&ns, ns_setup);
            }
            let at = if dp == Dp::Kernel {
                sh_ok(&format!("ip link add {name}t{i} type veth peer name {name}t{i} netns {ns}"));
                "type = \"veth\"".to_string()
            } else {
                format!("netns = \"{ns}\"")
            };
            cfg.push_str(&format!("[[port]]\nname = \"{name}t{i}\"\n{at}\n{settings}\n"));
        }
        let f = dir.join("sw.toml");
        std::fs::write(&f, cfg).unwrap();
        let log = std::fs::File::create(dir.join("sw.log")).unwrap();
        let child = Command::new(BIN)
            .args(["switch", "run", "--config", f.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let sw = FileSwitch { name, namespaces, child, dir };
        assert!(
            wait_for(10, || sluice(&["port", "list", "--switch", &sw.name]).status.success()),
            "switch did not start: {}",
            std::fs::read_to_string(sw.dir.join("sw.log")).unwrap_or_default()
        );
        sw
    }

    /// Guest `i`'s interface (and its port's name), `SWITCHtI`.
    pub fn iface(&self, i: usize) -> String {
        format!("{}t{i}", self.name)
    }
}

impl Drop for FileSwitch {
    fn drop(&mut self) {
        // A clean stop removes a kernel datapath's upcall TAP and pins; the kill is for a
        // switch that hangs.
        let _ = sluice(&["switch", "stop", "--switch", &self.name]);
        wait_for(10, || self.child.try_wait().is_ok_and(|s| s.is_some()));
        let _ = self.child.kill();
        let _ = self.child.wait();
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A lab made by `sluice lab up`, removed by `sluice lab down` on drop.
pub struct Lab {
    pub name: String,
    pub state: Value,
    pub dp: Dp,
    extra_ns: Vec<String>,
}

impl Lab {
    /// A lab on the user-space datapath.
    pub fn up(tag: &str, args: &[&str]) -> Lab {
        Lab::on(Dp::User, tag, args)
    }

    /// A lab on datapath `dp`.
    pub fn on(dp: Dp, tag: &str, args: &[&str]) -> Lab {
        let name = unique(&dp.tag(tag));
        let mut a = vec!["lab", "up", "--json", "--name", &name];
        a.extend_from_slice(dp.args());
        a.extend_from_slice(args);
        let out = sluice_ok(&a);
        let state: Value = serde_json::from_str(&out).expect("lab up --json");
        Lab { name, state, dp, extra_ns: vec![] }
    }

    pub fn ns(&self, guest: usize) -> String {
        self.state["guests"][guest - 1]["netns"].as_str().unwrap().to_string()
    }

    pub fn tap(&self, guest: usize) -> String {
        self.state["guests"][guest - 1]["tap"].as_str().unwrap().to_string()
    }

    pub fn ip4(&self, guest: usize) -> String {
        format!("10.77.0.{guest}")
    }

    pub fn ip6(&self, guest: usize) -> String {
        format!("fd77::{guest:x}")
    }

    /// Adds a guest by hand: a namespace of our own and `sluice port add` with `port_args`
    /// (on the kernel datapath: a veth pair, the switch's end attached).
    pub fn add_guest(&mut self, short: &str, port_args: &[&str], ip4: Option<&str>) -> (String, String) {
        let ns = format!("sluice-{}-{short}", self.name);
        let tap = format!("{}-{short}", self.name);
        sh_ok(&format!("ip netns add {ns}"));
        self.extra_ns.push(ns.clone());
        let mut a = vec!["port", "add", &tap, "--switch", &self.name];
        match self.dp {
            Dp::User => a.extend(["--netns", &ns]),
            Dp::Kernel => {
                sh_ok(&format!(
                    "ip link add {tap} type veth peer name {tap} netns {ns} && ip -n {ns} link set {tap} up"
                ));
                a.extend(["--type", "veth"]);
            }
        }
        a.extend_from_slice(port_args);
        sluice_ok(&a);
        ns_ok(&ns, "ip link set lo up");
        if let Some(ip) = ip4 {
            ns_ok(&ns, &format!("ip addr add {ip}/24 dev {tap}"));
        }
        (ns, tap)
    }

    pub fn stats(&self) -> Value {
        serde_json::from_str(&sluice_ok(&["stats", "--json", "--switch", &self.name])).unwrap()
    }

    /// The switch's counters once they are at rest: read until two readings 200 ms apart
    /// agree on every port's frames in and out (up to 10 s; then the last reading). A
    /// reading taken while a frame is being counted can be off by that frame — the
    /// kernel's per-CPU counters are copied word by word while its programs run — so the
    /// accounting rules are checked on a reading at rest.
    pub fn settled_stats(&self) -> Value {
        let moving = |s: &Value| -> Vec<(u64, u64, u64)> {
            let ports = s["ports"].as_array().cloned().unwrap_or_default();
            let n = |c: &Value, k: &str| c[k].as_u64().unwrap_or(0);
            ports
                .iter()
                .map(|p| {
                    (n(&p["counters"], "rx_frames"), n(&p["counters"], "tx_offered"), n(&p["counters"], "tx_frames"))
                })
                .collect()
        };
        let mut last = self.stats();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            let now = self.stats();
            if moving(&now) == moving(&last) {
                return now;
            }
            last = now;
        }
        eprintln!("the counters of {} did not come to rest in 10 s; checking the last reading", self.name);
        last
    }

    pub fn port(&self, name: &str) -> Value {
        self.stats()["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no port {name}"))
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let o = sluice(&["lab", "down", "--name", &self.name]);
        if !o.status.success() {
            eprintln!("lab down {}: {}", self.name, String::from_utf8_lossy(&o.stderr));
        }
        for ns in &self.extra_ns {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// On the kernel datapath: the kernel itself forwarded nearly every frame port `p` (a
/// `stats --json` port) received, sending no more than 1% up to the core.
pub fn assert_mostly_in_kernel(p: &Value) {
    let k = &p["kernel"];
    let (fwd, up) = (k["forwarded"].as_u64().unwrap(), k["upcalls"].as_u64().unwrap());
    assert!(fwd > 0 && up * 100 <= fwd + up, "the kernel forwarded {fwd} and sent {up} up: {p}");
}

/// Checks the accounting rules of sluice's counters on every port.
pub fn assert_conserved(stats: &Value) {
    let mut copies = stats["departed"]["copies"].as_u64().unwrap() + stats["departed"]["generated"].as_u64().unwrap();
    let mut offered = stats["departed"]["tx_offered"].as_u64().unwrap();
    for p in stats["ports"].as_array().unwrap() {
        let c = &p["counters"];
        let n = |k: &str| c[k].as_u64().unwrap();
        let sum = |k: &str| c[k].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum::<u64>();
        assert_eq!(
            n("rx_frames"),
            n("forwarded")
                + n("flooded")
                + n("consumed")
                + sum("rx_drops")
                + p["held"].as_u64().unwrap()
                + p["resolving"].as_u64().unwrap()
                + p["upcall"].as_u64().unwrap_or(0),
            "ingress accounting of {}: {c}",
            p["name"]
        );
        assert_eq!(
            n("tx_offered"),
            n("tx_frames") + sum("tx_drops") + p["queued"].as_u64().unwrap(),
            "egress accounting of {}: {c}",
            p["name"]
        );
        copies += n("copies") + n("generated");
        offered += n("tx_offered");
    }
    assert_eq!(copies, offered);
}

/// Path of the raw-frame helper.
pub fn rawframe() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rawframe.py")
}

/// `python3` in namespace `ns` (`""`: the test's own).
fn python_in(ns: &str) -> Command {
    if ns.is_empty() {
        return Command::new("python3");
    }
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, "python3"]);
    c
}

/// Starts a raw-frame listener in `ns` (`""`: the test's own) on `iface` and waits until
/// it is bound.
pub fn listen_raw(ns: &str, iface: &str, ethertype: u16, seconds: f64) -> Child {
    let mut c = python_in(ns);
    c.arg(rawframe()).args(["recv", iface, &ethertype.to_string(), &seconds.to_string()]);
    spawn_ready(&mut c, "rawframe listener")
}

/// Spawns `cmd` (a helper that prints `ready` on its standard error once it is set up)
/// with its standard streams piped, and waits for that line; `what` names it if it fails.
pub fn spawn_ready(cmd: &mut Command, what: &str) -> Child {
    use std::io::BufRead;
    let mut c = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect(what);
    let mut line = String::new();
    std::io::BufReader::new(c.stderr.as_mut().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "{what} did not start");
    c
}

/// Frames a listener received: (vlan or None, frame bytes). Tells the listener the test has
/// sent (its window of `seconds` starts now), then waits for it.
pub fn received(mut c: Child) -> Vec<(Option<u16>, Vec<u8>)> {
    drop(c.stdin.take());
    let out = c.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (tci, hex) = l.split_once(' ')?;
            let bytes = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
            Some((tci.parse().ok(), bytes))
        })
        .collect()
}

pub fn send_raw(ns: &str, iface: &str, frames: &[Vec<u8>]) {
    let hex: Vec<String> = frames.iter().map(|f| f.iter().map(|b| format!("{b:02x}")).collect()).collect();
    let o = python_in(ns).arg(rawframe()).args(["send", iface]).args(&hex).output().unwrap();
    assert!(o.status.success(), "rawframe send: {}", String::from_utf8_lossy(&o.stderr));
}

/// The MAC address of `iface` in `ns`.
pub fn mac_of(ns: &str, iface: &str) -> [u8; 6] {
    let s = ns_ok(ns, &format!("cat /sys/class/net/{iface}/address"));
    let v: Vec<u8> = s.trim().split(':').map(|x| u8::from_str_radix(x, 16).unwrap()).collect();
    v.try_into().unwrap()
}

pub fn frame(dst: [u8; 6], src: [u8; 6], vlan: Option<u16>, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&src);
    if let Some(v) = vlan {
        f.extend_from_slice(&[0x81, 0x00]);
        f.extend_from_slice(&v.to_be_bytes());
    }
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Waits until `f` holds, up to `secs` (a bound, not an assertion on timing).
pub fn wait_for(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// The LAN side of a lab made with `--lan`: the external host's namespace (10.77.0.200,
/// fd77::c8 on `eth0`), and the uplink port with the namespace its interface is in (on the
/// kernel datapath the switch's own: `""`). The lab removes them.
pub struct Lan {
    pub lan_ns: String,
    pub up_ns: String,
    pub port: String,
}

impl Lan {
    pub fn of(lab: &Lab) -> Lan {
        Lan {
            lan_ns: format!("sluice-{}-lan", lab.name),
            up_ns: if lab.dp == Dp::Kernel { String::new() } else { format!("sluice-{}-up", lab.name) },
            port: format!("{}-up", lab.name),
        }
    }

    /// Attaches the uplink again with other settings.
    pub fn reattach(&self, lab: &Lab, extra: &[&str]) {
        sluice_ok(&["port", "del", &self.port, "--switch", &lab.name]);
        let mut a = vec!["port", "add", &self.port, "--type", "uplink", "--switch", &lab.name];
        if !self.up_ns.is_empty() {
            a.extend(["--netns", &self.up_ns]);
        }
        a.extend_from_slice(extra);
        sluice_ok(&a);
    }
}

/// With the uplink's offloads off: 100 MB from guest 1 to the LAN (TCP `port`), the
/// guest's GSO frames cut by the switch for the uplink, and the counters conserving.
pub fn transfer_cut_for_the_uplink(lab: &Lab, lan: &Lan, port: u16) {
    sluice_ok(&["stats", "reset", "--switch", &lab.name]);
    transfer_100mb(lab, lan, port);
    let up = lab.port(&lan.port);
    assert!(up["counters"]["tx_segmented"].as_u64().unwrap() > 0, "segmented in software: {up}");
    assert_eq!(up["counters"]["tx_gso"], 0, "{up}");
    assert_conserved(&lab.stats());
}

/// Sends 100 MB of random bytes from guest g1 to the LAN host with nc and checks their
/// sha256 there.
pub fn transfer_100mb(lab: &Lab, lan: &Lan, port: u16) {
    let dir = mkdtemp(&format!("sluice-uplink-{}-{port}", lab.name));
    let src = dir.join("src");
    sh_ok(&format!("head -c 100000000 /dev/urandom > {}", src.display()));
    let want = sh_ok(&format!("sha256sum < {}", src.display()));
    let sink = ns_spawn(&lan.lan_ns, &format!("timeout 120 nc -l -N {port} | sha256sum"));
    assert!(wait_for(10, || ns_sh(&lan.lan_ns, &format!("ss -ltn | grep -q :{port}")).status.success()));
    ns_ok(&lab.ns(1), &format!("timeout 120 nc -N 10.77.0.200 {port} < {}", src.display()));
    let out = sink.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), want, "sha256 of what arrived on the LAN");
    let _ = std::fs::remove_dir_all(dir);
}

/// Moves two TCP transfers from guest 1 to guest 2 across a restart of the switch in place
/// and a `kill -9` followed by a start from the lab's configuration — iperf3 at 400 Mbit/s
/// for twelve seconds (a reset ends it with an error), and a 300 MB file paced over six
/// seconds over nc, whose bytes are checked (iperf3 -F is no file-transfer tool: over a
/// bare veth pair with its server stopped twice it reported done with 89% of a file) — and
/// asserts that no end saw a reset and every byte arrived in order. `while_down` runs while
/// no switch runs. Returns the switch started again, for the caller to stop; `dir` holds
/// the files and its log.
pub fn transfers_cross_a_restart_and_a_kill(lab: &Lab, dir: &Path, while_down: impl FnOnce()) -> smc::Killed {
    let (src, dst) = (dir.join("src"), dir.join("dst"));
    sh_ok(&format!("head -c 300000000 /dev/urandom > {}", src.display()));
    let iperf_server = ns_spawn(&lab.ns(2), "timeout 60 iperf3 -s -1 -p 5212");
    let server = ns_spawn(&lab.ns(2), &format!("timeout 60 nc -l -N 5211 > {}", dst.display()));
    assert!(wait_for(10, || {
        let ss = String::from_utf8_lossy(&ns_sh(&lab.ns(2), "ss -ltn").stdout).into_owned();
        ss.contains(":5211") && ss.contains(":5212")
    }));
    let iperf_client = ns_spawn(&lab.ns(1), &format!("timeout 60 iperf3 -c {} -p 5212 -t 12 -b 400M", lab.ip4(2)));
    let sender = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/paced_send.py");
    let client =
        ns_spawn(&lab.ns(1), &format!("timeout 60 python3 {sender} {} 5211 {} 50e6", lab.ip4(2), src.display()));
    let arrived = || std::fs::metadata(&dst).map(|m| m.len()).unwrap_or(0);
    assert!(wait_for(20, || arrived() > 30_000_000), "the transfer did not start");
    // A restart in place: the same process, started anew.
    let pid = || lab.stats()["switch"]["pid"].as_u64().unwrap();
    let p = pid();
    sluice_ok(&["switch", "restart", "--switch", &lab.name]);
    assert_eq!(pid(), p);
    let at_restart = arrived();
    assert!(wait_for(20, || arrived() > at_restart + 30_000_000), "the transfer stalled after the restart");
    // A crash: kill -9, dead once its socket stops answering (its threads go after the
    // first one does); then start it again from its configuration.
    let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
    assert!(wait_for(10, || !sluice(&["stats", "--switch", &lab.name]).status.success()));
    while_down();
    let conf = run_dir().join("labs").join(format!("{}.toml", lab.name));
    let log = std::fs::File::create(dir.join("again.log")).unwrap();
    let again = smc::Killed(
        Command::new(BIN)
            .args(["switch", "run", "--config", conf.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    assert!(
        wait_for(10, || sluice(&["stats", "--switch", &lab.name]).status.success()),
        "the switch did not start again: {}",
        std::fs::read_to_string(dir.join("again.log")).unwrap_or_default()
    );
    let said = |o: &Output| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let c = client.wait_with_output().unwrap();
    let _ = server.wait_with_output();
    assert!(c.status.success(), "the file's sender saw no reset: {}", said(&c));
    let ic = iperf_client.wait_with_output().unwrap();
    let is = iperf_server.wait_with_output().unwrap();
    assert!(ic.status.success(), "the iperf3 client saw no reset: {}", said(&ic));
    assert!(is.status.success(), "the iperf3 server saw no reset: {}", said(&is));
    assert_eq!(arrived(), 300_000_000, "every byte arrived");
    let sum = |f: &Path| sh_ok(&format!("sha256sum < {}", f.display()));
    assert_eq!(sum(&dst), sum(&src), "every byte arrived, in order");
    again
}

/// True when QEMU, busybox and a kernel for VMs are installed; otherwise fails the test
/// saying what to do.
pub fn have_vm_tools() -> bool {
    let kernel = std::fs::read_dir("/boot")
        .map(|d| d.flatten().any(|e| e.file_name().to_string_lossy().starts_with("vmlinuz-")))
        .unwrap_or(false);
    assert!(
        kernel,
        "needs a kernel in /boot (vmlinuz-*): apt-get install linux-image-amd64 (scripts/test.sh installs it), or leave out --include-ignored"
    );
    have("qemu-system-x86_64") && have("busybox")
}
