//! VMs that Debian's libvirt runs, on vhost-user ports (docs/libvirt.md): libvirtd and
//! virtlogd started by the test (this host has no init system to start them), a TCG domain
//! defined with `virsh` whose `<interface type='vhostuser'>` connects to a port of a
//! lab's switch, and QEMU running as libvirt's user `libvirt-qemu` let in by the switch's
//! default `vhost_allow_groups`. The guest pings a namespace guest and back, and again
//! after its port was deleted and added (QEMU reconnects). A second test: a peer whose user
//! and groups are not allowed is refused, logged with its ids and the settings to change.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use sluice_lab::vm::Console;

/// True when libvirt, QEMU, busybox and a kernel for VMs are installed; otherwise fails
/// the test saying what to do.
fn have_libvirt() -> bool {
    if !have_vm_tools() {
        return false;
    }
    let user = Command::new("id").arg(sluice_api::config::LIBVIRT_QEMU_USER).output().is_ok_and(|o| o.status.success());
    assert!(
        user,
        "needs the user libvirt-qemu: apt-get install libvirt-daemon-system (scripts/test.sh installs it), or leave out --include-ignored"
    );
    have("libvirtd") && have("virtlogd") && have("virsh")
}

/// Runs `virsh -c URI ARGS`, bounded to 120 s.
fn virsh(uri: &str, args: &[&str]) -> std::process::Output {
    Command::new("timeout")
        .args(["120", "virsh", "-q", "-c", uri])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running virsh")
}

fn virsh_ok(uri: &str, args: &[&str]) -> String {
    let o = virsh(uri, args);
    assert!(
        o.status.success(),
        "virsh {args:?}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Whether a daemon answers on unix socket `path`.
fn answers(path: &Path) -> bool {
    UnixStream::connect(path).is_ok()
}

/// The libvirt daemons the test uses: the host's own when they run, else ones it starts
/// (and stops, with the runtime directory they made).
struct Libvirt {
    /// The connection URI for virsh.
    uri: String,
    /// Pid files of the daemons this test started.
    started: Vec<PathBuf>,
    /// /run/libvirt, when the daemons started here made it.
    made_run_dir: bool,
}

const SYSTEM_LIBVIRTD: &str = "/run/libvirt/libvirt-sock";
const SYSTEM_VIRTLOGD: &str = "/run/libvirt/virtlogd-sock";

impl Libvirt {
    /// Uses the host's libvirtd, or starts one (with virtlogd, which it sends QEMU's
    /// output to) listening in `dir` only: its clients connect with
    /// `qemu:///system?socket=DIR/libvirt-sock`.
    fn start(dir: &Path) -> Libvirt {
        if answers(Path::new(SYSTEM_LIBVIRTD)) {
            return Libvirt { uri: "qemu:///system".into(), started: vec![], made_run_dir: false };
        }
        let made_run_dir = !Path::new("/run/libvirt").exists();
        let mut lv = Libvirt { uri: String::new(), started: vec![], made_run_dir };
        if !answers(Path::new(SYSTEM_VIRTLOGD)) {
            let pid = dir.join("virtlogd.pid");
            let o = Command::new("virtlogd").arg("--daemon").arg("--pid-file").arg(&pid).output().unwrap();
            assert!(o.status.success(), "virtlogd did not start: {}", String::from_utf8_lossy(&o.stderr));
            lv.started.push(pid);
            assert!(wait_for(30, || answers(Path::new(SYSTEM_VIRTLOGD))), "virtlogd did not answer within 30 s");
        }
        let conf = dir.join("libvirtd.conf");
        std::fs::write(
            &conf,
            format!(
                "unix_sock_dir = \"{}\"\nunix_sock_rw_perms = \"0700\"\nauth_unix_rw = \"none\"\nauth_unix_ro = \"none\"\n",
                dir.display()
            ),
        )
        .unwrap();
        let pid = dir.join("libvirtd.pid");
        let o =
            Command::new("libvirtd").arg("--daemon").arg("-f").arg(&conf).arg("--pid-file").arg(&pid).output().unwrap();
        assert!(o.status.success(), "libvirtd did not start: {}", String::from_utf8_lossy(&o.stderr));
        lv.started.push(pid);
        lv.uri = format!("qemu:///system?socket={}", dir.join("libvirt-sock").display());
        assert!(
            wait_for(60, || virsh(&lv.uri, &["version"]).status.success()),
            "libvirtd did not answer on {} within 60 s",
            dir.display()
        );
        lv
    }
}

impl Drop for Libvirt {
    fn drop(&mut self) {
        // libvirtd first: it holds virtlogd's connections.
        for pidfile in self.started.iter().rev() {
            let Some(pid) = std::fs::read_to_string(pidfile).ok().and_then(|p| p.trim().parse::<i32>().ok()) else {
                continue;
            };
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if !["libvirtd", "virtlogd"].contains(&comm.trim()) {
                continue;
            }
            // SAFETY: a signal to a daemon this test started, checked by name.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            if !wait_for(30, || !Path::new(&format!("/proc/{pid}")).exists()) {
                eprintln!("{} did not stop within 30 s of SIGTERM: killed", comm.trim());
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        if self.made_run_dir && !self.started.is_empty() {
            let _ = std::fs::remove_dir_all("/run/libvirt");
        }
    }
}

/// A domain defined and started, destroyed and undefined on drop (with its log).
struct Domain<'a> {
    lv: &'a Libvirt,
    name: String,
}

impl Drop for Domain<'_> {
    fn drop(&mut self) {
        let _ = virsh(&self.lv.uri, &["destroy", &self.name]);
        let _ = virsh(&self.lv.uri, &["undefine", &self.name]);
        let _ = std::fs::remove_file(format!("/var/log/libvirt/qemu/{}.log", self.name));
    }
}

/// The domain of docs/libvirt.md for the lab's kernel and initramfs: TCG, guest memory a
/// shared memfd, the NIC on sluice's vhost-user socket `socket` (QEMU connects and
/// reconnects every second), the kernel's console to `dir/console.log`, the console loop
/// on `dir/serial.sock`.
fn domain_xml(name: &str, dir: &Path, kernel: &Path, initrd: &Path, socket: &Path) -> String {
    let cmdline = sluice_lab::vm::cmdline(name, Some(("10.77.0.9/24", "fd77::9/64", 1500)));
    format!(
        r#"<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>{name}</name>
  <memory unit='MiB'>{mem}</memory>
  <memoryBacking>
    <source type='memfd'/>
    <access mode='shared'/>
  </memoryBacking>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>{kernel}</kernel>
    <initrd>{initrd}</initrd>
    <cmdline>{cmdline}</cmdline>
  </os>
  <cpu mode='custom'><model>qemu64</model></cpu>
  <on_reboot>destroy</on_reboot>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <interface type='vhostuser'>
      <mac address='52:54:00:77:00:09'/>
      <source type='unix' path='{socket}' mode='client'>
        <reconnect enabled='yes' timeout='1'/>
      </source>
      <model type='virtio'/>
      <alias name='ua-net0'/>
    </interface>
    <serial type='file'><source path='{dir}/console.log'/><target port='0'/></serial>
    <serial type='unix'><source mode='bind' path='{dir}/serial.sock'/><target port='1'/></serial>
    <memballoon model='none'/>
  </devices>
  <qemu:override>
    <qemu:device alias='ua-net0'>
      <qemu:frontend>
        <qemu:property name='vectors' type='unsigned' value='0'/>
      </qemu:frontend>
    </qemu:device>
  </qemu:override>
</domain>
"#,
        mem = sluice_lab::vm::VM_MEM_MB,
        kernel = kernel.display(),
        initrd = initrd.display(),
        socket = socket.display(),
        dir = dir.display(),
    )
}

fn port_state(lab: &str, port: &str) -> String {
    let list = sluice_ok(&["port", "list", "--switch", lab]);
    list.lines().find(|l| l.split_whitespace().next() == Some(port)).unwrap_or_default().to_string()
}

#[test]
#[ignore = "system tier: needs root, libvirt (libvirt-daemon-system, libvirt-clients), QEMU (qemu-system-x86), busybox and a kernel in /boot; scripts/test.sh runs it"]
fn a_libvirt_domain_on_a_vhost_user_port_pings_a_namespace_guest_and_reconnects() {
    if !root() || !have_libvirt() {
        return;
    }
    let lab = Lab::up("lvirt", &["--guests", "1"]);
    // The domain's files (its kernel and initramfs, which libvirt gives to libvirt-qemu
    // while the domain runs) in a directory QEMU may pass through (the run directory is
    // 0755 too).
    let dir = scratch(&format!("libvirt-{}", lab.name));
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let img = sluice_lab::vm::image(&dir).expect("building the VM image");
    let socket = dir.join("vm.sock");
    let port = format!("{}-lv", lab.name);
    let add =
        ["port", "add", &port, "--switch", &lab.name, "--type", "vhost-user", "--socket", socket.to_str().unwrap()];
    sluice_ok(&add);

    // The default lets libvirt's QEMU in: the socket is its group's, mode 0660.
    let group = sluice_api::config::libvirt_qemu_group().expect("libvirt's QEMU group");
    let m = std::fs::symlink_metadata(&socket).unwrap();
    assert_eq!((m.mode() & 0o777, m.gid()), (0o660, group), "the socket's mode and group");

    let lv = Libvirt::start(&dir);
    let dom = Domain { lv: &lv, name: format!("sluice-{}", lab.name) };
    let xml = dir.join("domain.xml");
    std::fs::write(&xml, domain_xml(&dom.name, &dir, &img.kernel, &img.initrd, &socket)).unwrap();
    virsh_ok(&lv.uri, &["define", xml.to_str().unwrap()]);
    virsh_ok(&lv.uri, &["start", &dom.name]);

    let mut console =
        Console::connect(&dir.join("serial.sock"), Duration::from_secs(60)).expect("the domain's console");
    let booted = console.wait_ready(Duration::from_secs(300));
    let kernel_log = || std::fs::read_to_string(dir.join("console.log")).unwrap_or_default();
    assert!(booted.is_ok(), "the domain did not boot: {booted:?}; its console:\n{}", kernel_log());
    let uid = Command::new("id").args(["-u", sluice_api::config::LIBVIRT_QEMU_USER]).output().unwrap();
    let uid = String::from_utf8_lossy(&uid.stdout).trim().to_string();
    assert!(
        wait_for(60, || port_state(&lab.name, &port).contains(&format!("(uid {uid}); guest driver up"))),
        "libvirt's QEMU (uid {uid}) did not bring the port up: {}",
        port_state(&lab.name, &port)
    );
    let ping = |console: &mut Console| {
        let (rc, out) = console.run("ping -c 2 -w 30 10.77.0.1", Duration::from_secs(60)).expect("the console");
        assert_eq!(rc, 0, "the domain's ping of the namespace guest: {}", String::from_utf8_lossy(&out));
        ns_ok(&lab.ns(1), "ping -c 2 -W 10 10.77.0.9");
    };
    ping(&mut console);

    // QEMU reconnects (`<reconnect enabled='yes' timeout='1'/>`) to a port made again.
    sluice_ok(&["port", "del", &port, "--switch", &lab.name]);
    sluice_ok(&add);
    assert!(
        wait_for(60, || port_state(&lab.name, &port).contains("guest driver up")),
        "QEMU did not reconnect to the port made again: {}",
        port_state(&lab.name, &port)
    );
    ping(&mut console);
    drop(console);
    drop(dom);
    drop(lv);
}

#[test]
#[ignore = "system tier: needs root, setpriv and python3; scripts/test.sh runs it"]
fn a_vhost_user_peer_not_allowed_is_refused_naming_its_ids_and_the_settings() {
    if !root() || !have("setpriv") || !have("python3") {
        return;
    }
    init();
    let name = unique("vhdeny");
    let dir = scratch(&format!("vhdeny-{name}"));
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.join("vm1.sock");
    let conf = dir.join("sw.toml");
    std::fs::write(
        &conf,
        format!(
            "name = \"{name}\"\nvhost_allow_users = [\"nobody\"]\nvhost_allow_groups = []\n[[port]]\nname = \"vm1\"\ntype = \"vhost-user\"\nsocket = \"{}\"\n",
            socket.display()
        ),
    )
    .unwrap();
    let log = dir.join("sw.log");
    let mut child = Command::new(BIN)
        .args(["switch", "run", "--config", conf.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let started = wait_for(15, || sluice(&["port", "list", "--switch", &name]).status.success());
    let result = std::panic::catch_unwind(|| {
        assert!(started, "the switch did not start within 15 s: {}", read_log());
        // Only nobody is allowed: the socket is its primary group's (nogroup), mode 0660.
        let (uid, gid) = (65534, 65534);
        let m = std::fs::symlink_metadata(&socket).unwrap();
        assert_eq!((m.mode() & 0o777, m.gid()), (0o660, gid), "the socket's mode and group");
        // Connects as `uid`:`gid` (no other group) and holds the connection 2 s.
        let connect_as = |u: u32, g: u32| {
            let py = format!(
                "import socket, time\ns = socket.socket(socket.AF_UNIX)\ns.connect({:?})\ntime.sleep(2)\n",
                socket.to_str().unwrap()
            );
            Command::new("timeout")
                .args(["20", "setpriv", &format!("--reuid={u}"), &format!("--regid={g}"), "--clear-groups"])
                .args(["/usr/bin/python3", "-c", &py])
                .output()
                .unwrap()
        };
        // A user outside the group cannot even connect: the file is not open to everyone.
        let o = connect_as(65532, 65532);
        assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("PermissionError"), "{o:?}");
        // In the group but neither the user nor the group allowed: refused, said, counted.
        let o = connect_as(65533, gid);
        assert!(o.status.success(), "{o:?}");
        let said = "vhost-user peer uid 65533 gid 65534";
        assert!(wait_for(10, || read_log().contains(said)), "no refusal logged: {}", read_log());
        let line = read_log().lines().find(|l| l.contains(said)).unwrap().to_string();
        assert!(line.contains("is not allowed: add it to vhost_allow_users or vhost_allow_groups"), "{line}");
        let state = port_state(&name, "vm1");
        assert!(state.contains("refused 1 connections"), "{state}");
        // The user allowed by name is let in.
        std::thread::scope(|s| {
            let held = s.spawn(|| connect_as(uid, gid));
            assert!(
                wait_for(10, || port_state(&name, "vm1").contains(&format!("(uid {uid})"))),
                "nobody was not let in: {}",
                port_state(&name, "vm1")
            );
            assert!(held.join().unwrap().status.success());
        });
    });
    let _ = sluice(&["switch", "stop", "--switch", &name]);
    wait_for(10, || child.try_wait().is_ok_and(|s| s.is_some()));
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
