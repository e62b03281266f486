//! The CNI plugin driven as runtimes drive it: the network configuration on stdin, the
//! `CNI_*` environment, host-local from /usr/lib/cni for addresses, namespaces made by the
//! test — and then by podman itself, on a network whose conflist names the plugin.
//!
//! System tier: needs root, a switch on the kernel datapath, iproute2, nftables, ping, the
//! CNI plugins (containernetworking-plugins), podman and busybox-static. Everything made
//! has a name of this test process's own and goes when the guard drops, on failure too.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_sys::fs::TempDir;

const PLUGIN: &str = env!("CARGO_BIN_EXE_sluice-cni");
const CNI_PLUGINS: &str = "/usr/lib/cni";

/// The `sluice` binary, built beside the plugin (`cargo test --workspace` and
/// scripts/test.sh build it).
fn sluice_bin() -> PathBuf {
    let p = Path::new(PLUGIN).with_file_name("sluice");
    assert!(p.exists(), "needs {} (build it with `cargo build --release -p sluice`)", p.display());
    p
}

/// Fails the test (never skips it) when not root or a tool is missing.
fn needs(tools: &[&str]) {
    // SAFETY: geteuid has no preconditions.
    assert!(
        unsafe { libc::geteuid() } == 0,
        "needs root (namespaces, veth pairs, nftables): run scripts/test.sh as root, or leave out --include-ignored"
    );
    for t in tools {
        let ok = Command::new("sh").args(["-c", &format!("command -v {t}")]).output().is_ok_and(|o| o.status.success());
        assert!(
            ok,
            "needs {t}: install it (scripts/test.sh installs every tool the tests drive), or leave out --include-ignored"
        );
    }
    assert!(
        Path::new(CNI_PLUGINS).join("host-local").exists(),
        "needs the CNI plugins in {CNI_PLUGINS} (apt-get install containernetworking-plugins), or leave out --include-ignored"
    );
}

fn sh(cmd: &str) -> Output {
    Command::new("sh").args(["-c", cmd]).stdin(Stdio::null()).output().expect("sh")
}

fn sh_ok(cmd: &str) -> String {
    let o = sh(cmd);
    assert!(o.status.success(), "`{cmd}` failed: {}{}", text(&o.stdout), text(&o.stderr));
    text(&o.stdout)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Waits until `f` holds, up to `secs` (a bound, not an assertion on timing).
fn wait_for(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// A switch on the kernel datapath in a runtime directory of its own, and what the test
/// made around it; all of it removed on drop.
struct World {
    /// The tests of this file one at a time: they share the plugin's nftables table.
    _serial: std::sync::MutexGuard<'static, ()>,
    /// The plugin's nftables table was not there before: it goes when its chain is empty.
    made_table: bool,
    dir: PathBuf,
    /// `dir`'s owner: removed with it, last.
    _tmp: TempDir,
    name: String,
    daemon: Child,
    netns: Vec<String>,
    links: Vec<String>,
    nft_tags: Vec<String>,
}

impl World {
    fn start(tag: &str) -> World {
        static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let made_table = !sh("nft list table inet sluice-cni").status.success();
        let tmp = TempDir::new(&format!("sluice-cni-{tag}")).expect("a temporary directory");
        let dir = tmp.path().to_path_buf();
        let name = format!("{tag}{}", std::process::id() % 100_000);
        std::fs::write(dir.join("sw.toml"), format!("name = \"{name}\"\ndatapath = \"kernel\"\n")).unwrap();
        let log = std::fs::File::create(dir.join("switch.log")).unwrap();
        let daemon = Command::new(sluice_bin())
            .args(["switch", "run", "--config"])
            .arg(dir.join("sw.toml"))
            .env("SLUICE_RUN_DIR", &dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the switch");
        let w = World {
            _serial: serial,
            made_table,
            dir,
            _tmp: tmp,
            name,
            daemon,
            netns: vec![],
            links: vec![],
            nft_tags: vec![],
        };
        let sock = w.socket();
        assert!(
            wait_for(30, || std::os::unix::net::UnixStream::connect(&sock).is_ok()),
            "waited 30 s for the switch's socket {}: {}",
            sock.display(),
            std::fs::read_to_string(w.dir.join("switch.log")).unwrap_or_default()
        );
        w
    }

    fn socket(&self) -> PathBuf {
        self.dir.join(format!("{}.sock", self.name))
    }

    fn sluice(&self, args: &[&str]) -> Output {
        Command::new(sluice_bin()).args(args).env("SLUICE_RUN_DIR", &self.dir).stdin(Stdio::null()).output().unwrap()
    }

    /// The switch's ports.
    fn ports(&self) -> Vec<String> {
        let o = self.sluice(&["port", "list", "--json", "--switch", &self.name]);
        assert!(o.status.success(), "port list: {}", text(&o.stderr));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        v["ports"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap().to_string()).collect()
    }

    /// A new namespace, deleted on drop.
    fn netns(&mut self, short: &str) -> String {
        let ns = format!("sluice-cni-{short}-{}", std::process::id());
        sh_ok(&format!("ip netns add {ns}"));
        self.netns.push(ns.clone());
        ns
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = self.sluice(&["switch", "stop", "--switch", &self.name]);
        if !wait_for(20, || self.daemon.try_wait().is_ok_and(|s| s.is_some())) {
            let _ = self.daemon.kill();
            let _ = self.daemon.wait();
        }
        for ns in &self.netns {
            let _ = sh(&format!("ip netns delete {ns}"));
        }
        for l in &self.links {
            let _ = sh(&format!("ip link del dev {l} 2>/dev/null"));
        }
        for t in &self.nft_tags {
            let _ = sh(&format!(
                "nft -a list chain inet sluice-cni postrouting 2>/dev/null | sed -n 's/.*comment \"{t}\" # handle \\([0-9]*\\)/\\1/p' | xargs -r -n1 nft delete rule inet sluice-cni postrouting handle"
            ));
        }
        if self.made_table && !text(&sh("nft list chain inet sluice-cni postrouting").stdout).contains("masquerade") {
            let _ = sh("nft delete table inet sluice-cni");
        }
    }
}

/// The plugin's port for a container and interface (as the plugin names it: `c` + 12 hex
/// digits of FNV-1a 64 of `ID NUL IFNAME`, its top 48 bits).
fn port_of(id: &str, ifname: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes().chain([0]).chain(ifname.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    format!("c{:012x}", h >> 16)
}

/// Runs the plugin: `command` with `conf` on stdin; (exit status ok, stdout as JSON).
fn plugin(command: &str, conf: &Value, id: &str, netns: Option<&str>, ifname: &str) -> (bool, Value) {
    let mut cmd = Command::new(PLUGIN);
    cmd.env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", id)
        .env("CNI_IFNAME", ifname)
        .env("CNI_PATH", CNI_PLUGINS)
        .env_remove("CNI_NETNS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(ns) = netns {
        cmd.env("CNI_NETNS", ns);
    }
    let mut child = cmd.spawn().unwrap();
    // (VERSION reads no stdin: a write it does not take is not an error.)
    let _ = std::io::Write::write_all(child.stdin.as_mut().unwrap(), conf.to_string().as_bytes());
    drop(child.stdin.take());
    // (The plugin bounds its own waits: at most a minute for IPAM and 20 s per tool.)
    let o = child.wait_with_output().unwrap();
    let v = if o.stdout.is_empty() { Value::Null } else { serde_json::from_slice(&o.stdout).unwrap_or(Value::Null) };
    (o.status.success(), v)
}

fn conf(w: &World, net: &str, subnet: &str, data: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": net,
        "type": "sluice-cni",
        "socket": w.socket(),
        "ipMasq": true,
        "ipam": { "type": "host-local", "subnet": subnet, "dataDir": data, "routes": [{ "dst": "0.0.0.0/0" }] },
    })
}

fn host_link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

fn masq_rules(tag: &str) -> usize {
    let o = sh("nft list chain inet sluice-cni postrouting 2>/dev/null");
    text(&o.stdout).matches(&format!("comment \"{tag}\"")).count()
}

/// Two containers (namespaces) through ADD, CHECK and DEL — each twice, and the whole
/// round twice — ping each other and the host (the network's gateway); a failed ADD and a
/// DEL of what is gone leave nothing and succeed as the specification says.
#[test]
#[ignore = "system tier: needs root, iproute2, nftables, the CNI plugins; scripts/test.sh runs it"]
fn add_check_del_connect_two_namespaces_and_the_host_and_leave_nothing() {
    needs(&["ip", "nft", "ping"]);
    let mut w = World::start("cni");
    let data = w.dir.join("ipam");
    let net = format!("sluice-test-{}", std::process::id());
    let c = conf(&w, &net, "10.88.251.0/24", &data);
    let (a, b) = (w.netns("a"), w.netns("b"));
    let (pa, pb) = (format!("/run/netns/{a}"), format!("/run/netns/{b}"));
    let (ok, v) = plugin("VERSION", &json!({"cniVersion": "1.0.0"}), "x", None, "eth0");
    assert!(ok && v["supportedVersions"].as_array().unwrap().contains(&json!("1.0.0")), "{v}");
    // The first ADD fails (an IPAM configuration host-local refuses): nothing stays, not
    // even the network's gateway port it made.
    let mut bad = c.clone();
    bad["ipam"]["subnet"] = json!("10.88.251.0/33");
    let (ok, e) = plugin("ADD", &bad, &format!("ctr-first-{net}"), Some(&pa), "eth0");
    assert!(!ok && e["code"] == json!(101), "{e}");
    assert_eq!(w.ports(), Vec::<String>::new(), "a failed first ADD left ports");
    for round in 0..2 {
        let mut results = vec![];
        for (id, ns) in [("ctr-a", &pa), ("ctr-b", &pb)] {
            let port = port_of(&format!("{id}-{net}"), "eth0");
            w.nft_tags.push(port.clone());
            let (ok, r) = plugin("ADD", &c, &format!("{id}-{net}"), Some(ns), "eth0");
            assert!(ok, "round {round}: ADD {id}: {r}");
            assert_eq!(r["interfaces"][0]["name"], json!(port), "{r}");
            assert_eq!(r["interfaces"][1]["sandbox"], json!(ns), "{r}");
            assert_eq!(r["ips"][0]["interface"], json!(1), "{r}");
            assert_eq!(r["ips"][0]["gateway"], json!("10.88.251.1"), "{r}");
            assert_eq!(masq_rules(&port), 1, "round {round}: one masquerading rule for {id}");
            // CHECK twice, with the result as prevResult.
            let mut checked = c.clone();
            checked["prevResult"] = r.clone();
            for _ in 0..2 {
                let (ok, e) = plugin("CHECK", &checked, &format!("{id}-{net}"), Some(ns), "eth0");
                assert!(ok, "round {round}: CHECK {id}: {e}");
            }
            results.push(r);
        }
        if round == 0 {
            let gw = w.ports().into_iter().find(|p| p.starts_with('g')).expect("the network's gateway port");
            // The gateway pair is the network's: it stays; the test removes its host end.
            w.links.push(gw);
        }
        let addr = |r: &Value| r["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
        let (ia, ib) = (addr(&results[0]), addr(&results[1]));
        for (ns, to) in [(&a, &ib), (&b, &ia), (&a, &"10.88.251.1".to_string()), (&b, &"10.88.251.1".to_string())] {
            sh_ok(&format!("ip netns exec {ns} ping -c 1 -W 5 {to}"));
        }
        if round == 0 {
            // A restart in place adopts the pairs it made: the containers keep their
            // interfaces and addresses, CHECK still passes, traffic still flows.
            let o = w.sluice(&["switch", "restart", "--switch", &w.name]);
            assert!(o.status.success(), "switch restart: {}", text(&o.stderr));
            let sock = w.socket();
            assert!(
                wait_for(30, || {
                    std::os::unix::net::UnixStream::connect(&sock).is_ok()
                        && w.sluice(&["port", "list", "--switch", &w.name]).status.success()
                }),
                "waited 30 s for the switch to answer after its restart"
            );
            for (id, ns, r) in [("ctr-a", &pa, &results[0]), ("ctr-b", &pb, &results[1])] {
                let mut checked = c.clone();
                checked["prevResult"] = r.clone();
                let (ok, e) = plugin("CHECK", &checked, &format!("{id}-{net}"), Some(ns), "eth0");
                assert!(ok, "CHECK {id} after the restart: {e}");
            }
            sh_ok(&format!("ip netns exec {a} ping -c 1 -W 5 {ib}"));
            sh_ok(&format!("ip netns exec {b} ping -c 1 -W 5 10.88.251.1"));
        }
        // CHECK of an address the container does not have fails.
        let mut wrong = c.clone();
        wrong["prevResult"] = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.88.251.250/24"}]});
        let (ok, e) = plugin("CHECK", &wrong, &format!("ctr-a-{net}"), Some(&pa), "eth0");
        assert!(!ok && e["code"] == json!(105), "{e}");
        for (id, ns) in [("ctr-a", &a), ("ctr-b", &b)] {
            let port = port_of(&format!("{id}-{net}"), "eth0");
            for n in 0..2 {
                let (ok, e) = plugin("DEL", &c, &format!("{id}-{net}"), Some(&format!("/run/netns/{ns}")), "eth0");
                assert!(ok, "round {round}: DEL {id} ({n}): {e}");
            }
            assert!(!w.ports().contains(&port), "port {port} left after DEL");
            assert!(!host_link_exists(&port), "link {port} left after DEL");
            assert_eq!(masq_rules(&port), 0, "masquerading rule of {port} left after DEL");
            assert!(!sh(&format!("ip -n {ns} link show eth0")).status.success(), "eth0 left in {ns}");
        }
    }
    // DEL without a namespace (the container is gone) succeeds.
    let (ok, e) = plugin("DEL", &c, &format!("ctr-a-{net}"), None, "eth0");
    assert!(ok, "DEL without CNI_NETNS: {e}");

    // A failed ADD (an IPAM configuration host-local refuses) leaves no port, link or rule.
    let mut bad = c.clone();
    bad["ipam"]["subnet"] = json!("10.88.251.0/33");
    let port = port_of(&format!("ctr-bad-{net}"), "eth0");
    w.nft_tags.push(port.clone());
    let (ok, e) = plugin("ADD", &bad, &format!("ctr-bad-{net}"), Some(&pa), "eth0");
    assert!(!ok && e["code"] == json!(101) && e["msg"].as_str().unwrap().contains("IPAM"), "{e}");
    assert!(!w.ports().contains(&port) && !host_link_exists(&port) && masq_rules(&port) == 0);
    assert!(!sh(&format!("ip -n {a} link show eth0")).status.success(), "a failed ADD left eth0 in {a}");

    // Errors are the specification's: a bad environment, a bad config, no switch.
    let (ok, e) = plugin("ADD", &c, &format!("ctr-a-{net}"), None, "eth0");
    assert!(!ok && e["code"] == json!(4), "{e}");
    let (ok, e) = plugin("ADD", &json!({"cniVersion": "1.0.0", "name": ""}), "x", Some(&pa), "eth0");
    assert!(!ok && e["code"] == json!(7), "{e}");
    let mut gone = c.clone();
    gone["socket"] = json!(w.dir.join("no-such-switch.sock"));
    let (ok, e) = plugin("ADD", &gone, &format!("ctr-a-{net}"), Some(&pa), "eth0");
    assert!(!ok && e["code"] == json!(11), "{e}");
}

/// podman runs two containers on a CNI network whose conflist names the plugin (installed
/// in a plugin directory of the test's own): they ping each other and the host, and
/// `podman rm -f` takes their ports off the switch.
#[test]
#[ignore = "system tier: needs root, podman (CNI backend), busybox-static, the CNI plugins; scripts/test.sh runs it"]
fn podman_containers_on_a_sluice_network_reach_each_other_and_the_host() {
    needs(&["ip", "nft", "podman", "busybox", "unshare", "tar"]);
    let mut w = World::start("pod");
    // (/run/netns a shared mount point, as `ip netns add` leaves it: podman's namespaces,
    // bound there, are then seen by the switch.)
    let _anchor = w.netns("anchor");
    let tmp = TempDir::new("sluice-cni-podman").expect("a temporary directory");
    let root = tmp.path().to_path_buf();
    let id = std::process::id();
    let (net, image) = (format!("sluice-test-{id}"), format!("localhost/sluice-test-busybox-{id}"));
    let plugins = root.join("plugins");
    let confdir = root.join("net.d");
    for d in [&plugins, &confdir, &root.join("rootfs/bin"), &root.join("ipam")] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::copy(PLUGIN, plugins.join("sluice-cni")).unwrap();
    std::fs::write(
        confdir.join(format!("{net}.conflist")),
        serde_json::to_string_pretty(&json!({
            "cniVersion": "1.0.0",
            "name": net,
            "plugins": [{
                "type": "sluice-cni",
                "socket": w.socket(),
                "ipMasq": true,
                "ipam": {
                    "type": "host-local",
                    "subnet": "10.88.252.0/24",
                    "dataDir": root.join("ipam"),
                    "routes": [{ "dst": "0.0.0.0/0" }],
                },
            }],
        }))
        .unwrap(),
    )
    .unwrap();
    std::fs::write(
        root.join("containers.conf"),
        format!(
            "[network]\nnetwork_backend = \"cni\"\ncni_plugin_dirs = [{:?}, {CNI_PLUGINS:?}]\nnetwork_config_dir = {:?}\n\
             [engine]\nevents_logger = \"file\"\ncgroup_manager = \"cgroupfs\"\n",
            plugins.display(),
            confdir.display()
        ),
    )
    .unwrap();
    let podman = Podman { root: root.clone(), _tmp: tmp, made: vec![], image: image.clone() };
    // A busybox image of the test's own, from a tar of a root file system (no registry).
    let rootfs = root.join("rootfs");
    std::fs::copy(sh_ok("command -v busybox").trim(), rootfs.join("bin/busybox")).unwrap();
    for t in ["sh", "ping", "ip", "sleep"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(t)).unwrap();
    }
    podman.ok(&["import", &format!("{}/rootfs.tar", root.display()), &image], Some(&rootfs));
    let names: Vec<String> = ["a", "b"].iter().map(|s| format!("sluice-test-{id}-{s}")).collect();
    let mut podman = podman;
    for n in &names {
        podman.made.push(n.clone());
        podman.ok(
            &[
                "run",
                "-d",
                "--name",
                n,
                "--network",
                &net,
                "--cgroups",
                "disabled",
                "--cap-add",
                "NET_RAW",
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1000:1000",
                &image,
                "/bin/sleep",
                "600",
            ],
            None,
        );
    }
    let gw = w.ports().into_iter().find(|p| p.starts_with('g')).expect("the network's gateway port");
    w.links.push(gw);
    let ports: Vec<String> = w.ports().into_iter().filter(|p| p.starts_with('c')).collect();
    assert_eq!(ports.len(), 2, "a port per container: {ports:?}");
    w.nft_tags.extend(ports.iter().cloned());
    let ip_of = |n: &str| {
        let f = format!("{{{{(index .NetworkSettings.Networks \"{net}\").IPAddress}}}}");
        podman.ok(&["inspect", "--format", &f, n], None).trim().to_string()
    };
    let (ia, ib) = (ip_of(&names[0]), ip_of(&names[1]));
    assert!(ia.starts_with("10.88.252.") && ib.starts_with("10.88.252.") && ia != ib, "{ia} {ib}");
    for (n, to) in [(&names[0], &ib), (&names[1], &ia), (&names[0], &"10.88.252.1".to_string())] {
        podman.ok(&["exec", n, "ping", "-c", "1", "-W", "5", to], None);
    }
    podman.ok(&["rm", "-f", "-t", "0", &names[0], &names[1]], None);
    let left: Vec<String> = w.ports().into_iter().filter(|p| p.starts_with('c')).collect();
    assert!(left.is_empty(), "podman rm -f left ports on the switch: {left:?}");
    for p in &ports {
        assert!(!host_link_exists(p) && masq_rules(p) == 0, "podman rm -f left {p}'s link or rule");
    }
}

/// podman with the test's own storage (vfs), network configuration and plugin directory;
/// what it made (containers, the image) removed on drop.
struct Podman {
    root: PathBuf,
    /// `root`'s owner: removed with it once the containers and the image are.
    _tmp: TempDir,
    made: Vec<String>,
    image: String,
}

impl Podman {
    /// `podman ARGS`, bounded to two minutes; with `tar_of`, a tar of that directory is
    /// written first to the path the arguments name. On a host whose cgroup v2 hierarchy
    /// holds controllers beside v1 ones ("hybrid" with, say, hugetlb), crun refuses to run:
    /// podman then runs in a mount namespace of its own without the v2 mount (the host's
    /// mounts unchanged; /run/netns stays shared with the host).
    fn run(&self, args: &[&str], tar_of: Option<&Path>) -> Output {
        if let Some(d) = tar_of {
            sh_ok(&format!("tar -C {} -cf {}/rootfs.tar .", d.display(), self.root.display()));
        }
        let hybrid =
            std::fs::read_to_string("/sys/fs/cgroup/unified/cgroup.controllers").is_ok_and(|c| !c.trim().is_empty());
        let mut cmd = Command::new("timeout");
        cmd.arg("120");
        if hybrid {
            cmd.args([
                "unshare",
                "--mount",
                "--propagation",
                "unchanged",
                "sh",
                "-c",
                "mount --make-rprivate /sys/fs/cgroup && umount /sys/fs/cgroup/unified && exec \"$@\"",
                "sh",
            ]);
        }
        cmd.arg("podman")
            .arg("--root")
            .arg(self.root.join("storage"))
            .arg("--runroot")
            .arg(self.root.join("run"))
            .args(["--storage-driver", "vfs"])
            .args(args)
            .env("CONTAINERS_CONF", self.root.join("containers.conf"))
            .stdin(Stdio::null());
        cmd.output().expect("run podman")
    }

    fn ok(&self, args: &[&str], tar_of: Option<&Path>) -> String {
        let o = self.run(args, tar_of);
        assert!(o.status.success(), "podman {args:?} failed: {}{}", text(&o.stdout), text(&o.stderr));
        text(&o.stdout)
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        for n in &self.made {
            let _ = self.run(&["rm", "-f", "-t", "0", n], None);
        }
        let _ = self.run(&["rmi", "-f", &self.image], None);
    }
}

/// What the plugin rests on, from the command line: a veth port the switch makes in a
/// namespace given by path, its guest end named apart from the port; `--may-exist` and
/// `--if-exists` make adding and deleting idempotent; the exit status says what happened.
#[test]
#[ignore = "system tier: needs root and iproute2; scripts/test.sh runs it"]
fn port_add_and_del_are_idempotent_on_request_and_exit_with_documented_codes() {
    needs(&["ip"]);
    let mut w = World::start("idem");
    let ns = w.netns("idem");
    let path = format!("/run/netns/{ns}");
    let port = format!("ci{}", std::process::id() % 100_000);
    w.links.push(port.clone());
    let add = |extra: &[&str]| {
        let mut a = vec!["port", "add", &port, "--type", "veth", "--netns", &path, "--switch", &w.name];
        a.extend_from_slice(extra);
        w.sluice(&a)
    };
    let code = |o: &Output| o.status.code();
    assert_eq!(code(&add(&["--ifname", "eth0"])), Some(0));
    assert!(sh(&format!("ip -n {ns} link show eth0")).status.success(), "the guest end is eth0 in {ns}");
    let again = add(&["--ifname", "eth0"]);
    assert_eq!(code(&again), Some(1), "a second add without --may-exist is refused");
    assert!(text(&again.stderr).contains("already attached"), "{}", text(&again.stderr));
    let same = add(&["--ifname", "eth0", "--may-exist"]);
    assert_eq!(code(&same), Some(0), "{}", text(&same.stderr));
    assert!(text(&same.stdout).contains("attached already"), "{}", text(&same.stdout));
    let other = add(&["--ifname", "eth1", "--may-exist"]);
    assert_eq!(code(&other), Some(1));
    assert!(text(&other.stderr).contains("ifname"), "the refusal names what differs: {}", text(&other.stderr));
    let del = |extra: &[&str]| {
        let mut a = vec!["port", "del", &port, "--switch", &w.name];
        a.extend_from_slice(extra);
        w.sluice(&a)
    };
    assert_eq!(code(&del(&[])), Some(0));
    assert!(!host_link_exists(&port), "the pair the switch made goes with its port");
    assert!(!sh(&format!("ip -n {ns} link show eth0")).status.success());
    assert_eq!(code(&del(&[])), Some(1), "deleting what is not there is refused");
    let absent = del(&["--if-exists"]);
    assert_eq!(code(&absent), Some(0), "{}", text(&absent.stderr));
    // An interface of the port's name the switch did not make is never taken over.
    sh_ok(&format!("ip link add {port} type veth peer name {port}p"));
    let taken = add(&["--ifname", "eth0"]);
    assert_eq!(code(&taken), Some(1));
    assert!(text(&taken.stderr).contains("did not make it"), "{}", text(&taken.stderr));
    // A TAP is made in a namespace given by its path too.
    let tap = format!("ct{}", std::process::id() % 100_000);
    let made = w.sluice(&["port", "add", &tap, "--netns", &path, "--switch", &w.name]);
    assert_eq!(code(&made), Some(0), "{}", text(&made.stderr));
    assert!(sh(&format!("ip -n {ns} link show {tap}")).status.success(), "TAP {tap} in {ns}");
    assert_eq!(code(&w.sluice(&["port", "del", &tap, "--switch", &w.name])), Some(0));
    // Usage, and no switch answering.
    assert_eq!(code(&w.sluice(&["port", "add"])), Some(2));
    let gone = w.sluice(&["port", "del", &port, "--if-exists", "--switch", "sluice-no-such-switch"]);
    assert_eq!(code(&gone), Some(3), "{}", text(&gone.stderr));
}
