//! A lab of one host: a switch (started if needed) and its guests — namespaces on TAP,
//! veth or stream ports, QEMU VMs on vhost-user ports, the LAN behind an uplink — made and
//! removed as its state file records.

use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use sluice_sys::bail;
use sluice_sys::error::Context;

use crate::args::{AttachArg, ModeArg, UpArgs};
use crate::shell::{add_bridge, sh};
use crate::state::{Guest, LabState, check_name, list_names, state_path};
use sluice_api::client::Client;
use sluice_api::config::PortSpec;
use sluice_api::proto::Request;
use sluice_sys::netns;
use sluice_sys::paths;

/// Creates a lab of one host; on failure removes what it had made. Without `--datapath`
/// the kernel datapath is tried first (see [`UpArgs::datapath`]).
pub fn up(a: &UpArgs) -> Result<LabState> {
    if a.datapath.is_some() {
        return up_on(a);
    }
    let running = a.switch.as_ref().and_then(|sw| {
        Client::connect(&paths::socket_for(sw)).ok()?.call::<sluice_api::proto::SwitchSummary>(&Request::Hello).ok()
    });
    let auto = match running {
        Some(r) if r.datapath == "kernel" => sluice_api::config::DatapathArg::Kernel,
        Some(_) => sluice_api::config::DatapathArg::User,
        None if a.lossless || a.attach == AttachArg::Stream || a.vms > 0 || !sluice_ebpf::available() => {
            sluice_api::config::DatapathArg::User
        }
        None => sluice_api::config::DatapathArg::Kernel,
    };
    let first = UpArgs { datapath: Some(auto), ..a.clone() };
    match up_on(&first) {
        Err(Error::KernelDatapathRefused { log })
            if auto == sluice_api::config::DatapathArg::Kernel && a.switch.is_none() =>
        {
            eprintln!(
                "sluice: the kernel datapath is not available here ({}); the lab uses the user-space datapath",
                log.lines().last().unwrap_or_default().trim()
            );
            up_on(&UpArgs { datapath: Some(sluice_api::config::DatapathArg::User), ..a.clone() })
        }
        other => other,
    }
}

fn up_on(a: &UpArgs) -> Result<LabState> {
    let datapath = a.datapath.unwrap_or_default();
    check_name(&a.name)?;
    if a.attach == AttachArg::Stream && datapath == sluice_api::config::DatapathArg::Kernel {
        bail!(
            "--attach stream needs the user-space datapath (--datapath user): the kernel datapath forwards between veth ports"
        );
    }
    if a.switch.is_none() {
        sluice_api::config::check_lossless(datapath.kind(), a.lossless)
            .map_err(|e| sluice_sys::failure!("--lossless: {e}"))?;
    }
    if !(1..=99).contains(&a.guests) {
        bail!("--guests must be 1 to 99");
    }
    if a.gateway && a.switch.is_some() {
        bail!(
            "--gateway is a setting of the switch the lab starts; leave out --switch (or give the running switch `gateway =` in its file)"
        );
    }
    if a.gateway && !Path::new("/usr/sbin/dnsmasq").is_file() {
        bail!("--gateway runs dnsmasq, which is not installed: `apt-get install dnsmasq-base`");
    }
    if a.vms > 8 || a.guests + a.vms > 99 {
        bail!("--vm must be 0 to 8 (and with --guests at most 99 in all)");
    }
    if !sluice_switch::switch_mtu_range().contains(&a.mtu) {
        bail!("--mtu {} is out of range: use 68 to 9000", a.mtu);
    }
    if let Ok(old) = LabState::load(&a.name) {
        let alive = old.switch_alive() || old.guests.iter().any(|g| g.created_netns && netns::exists(&g.netns));
        if alive {
            return Err(Error::LabExists { name: a.name.clone() });
        }
        let _ = fs::remove_file(state_path(&a.name));
    }
    let switch = a.switch.clone().unwrap_or_else(|| a.name.clone());
    let mut s = LabState {
        name: a.name.clone(),
        socket: paths::socket_for(&switch),
        switch,
        started_switch: false,
        switch_pid: None,
        mtu: a.mtu,
        guests: Vec::new(),
        extra_netns: Vec::new(),
        mode: a.mode.as_str().into(),
        datapath: datapath.kind().as_str().into(),
        links: Vec::new(),
        sublabs: Vec::new(),
        exe: a.exe.clone(),
        gateway: a.gateway.then(|| GATEWAY.to_string()),
        daemons: Vec::new(),
    };
    s.save()?;
    match build(&mut s, a) {
        Ok(()) => Ok(s),
        Err(e) => {
            let _ = down(&s.name);
            Err(e)
        }
    }
}

fn build(s: &mut LabState, a: &UpArgs) -> Result<()> {
    if !s.switch_alive() {
        if a.switch.is_some() {
            bail!("switch {:?} is not running", s.switch);
        }
        start_switch(s, a)?;
    }
    let mut client = Client::connect(&s.socket)?;
    let running: sluice_api::proto::SwitchSummary = client.call(&Request::Hello)?;
    if running.mode != a.mode.as_str() {
        bail!(
            "switch {:?} runs in {} mode, not {}; use --mode {} with it, or another switch",
            s.switch,
            running.mode,
            a.mode.as_str(),
            running.mode
        );
    }
    let datapath = a.datapath.unwrap_or_default();
    let kernel = datapath == sluice_api::config::DatapathArg::Kernel;
    if running.datapath != datapath.kind().as_str() {
        bail!(
            "switch {:?} runs the {} datapath, not {}; use --datapath {} with it, or another switch",
            s.switch,
            running.datapath,
            datapath.kind().as_str(),
            running.datapath
        );
    }
    for i in 1..=a.guests {
        // Host K of a multi-host lab: guests hKgJ, numbered on from the hosts before it.
        let (label, n) = match a.host {
            0 => (format!("g{i}"), i),
            k => (format!("h{k}g{i}"), (k - 1) * a.guests + i),
        };
        let g = Guest::numbered(n, label, format!("sluice-{}-g{i}", s.name), format!("{}-g{i}", s.name));
        if netns::exists(&g.netns) {
            bail!(
                "network namespace {} already exists and is not this lab's; remove it or pick another lab --name",
                g.netns
            );
        }
        s.guests.push(g.clone());
        let idx = s.guests.len() - 1;
        s.guests[idx].created_netns = true;
        s.save()?;
        sh(&["ip", "netns", "add", &g.netns])?;
        netns::run_in(Some(&g.netns), || {
            for k in ["default", "all"] {
                fs::write(format!("/proc/sys/net/ipv6/conf/{k}/accept_dad"), "0")?;
            }
            Ok(())
        })?;
        sh(&["ip", "-n", &g.netns, "link", "set", "lo", "up"])?;
        s.guests[idx].added_port = true;
        s.save()?;
        let mut spec = PortSpec::tap(&g.tap);
        if kernel {
            // A veth pair: the switch's end here, the guest's (same name) in its namespace;
            // deleting the namespace deletes both.
            let m = a.mtu.to_string();
            sh(&[
                "ip", "link", "add", &g.tap, "mtu", &m, "type", "veth", "peer", "name", &g.tap, "mtu", &m, "netns",
                &g.netns,
            ])?;
            sh(&["ip", "-n", &g.netns, "link", "set", &g.tap, "up"])?;
            spec.kind = sluice_api::config::PortKind::Veth;
        } else if a.attach == AttachArg::Stream {
            let pid = start_relay(s, idx, a.mtu)?;
            s.guests[idx].relay_pid = Some(pid);
            s.save()?;
            spec.kind = sluice_api::config::PortKind::Stream;
            spec.path = Some(relay_socket(&s.name, &g.guest));
        } else {
            spec.netns = Some(g.netns.clone());
        }
        spec.mtu = Some(a.mtu);
        spec.offload = !a.no_offload;
        if a.mode == ModeArg::L3 {
            // The addresses the guest is reached at, before it has said anything.
            spec.ips = g.addresses();
        }
        client.call_value(&Request::PortAdd { port: Box::new(spec), may_exist: false })?;
        if a.attach == AttachArg::Stream {
            sh(&["ip", "-n", &g.netns, "link", "set", &g.tap, "up"])?;
        }
        if a.gateway {
            s.guests[idx].ipv4 = dhcp(&s.name, &g.netns, &g.tap)?;
            s.save()?;
        } else {
            sh(&["ip", "-n", &g.netns, "addr", "add", &g.ipv4, "dev", &g.tap])?;
        }
        sh(&["ip", "-n", &g.netns, "addr", "add", &g.ipv6, "dev", &g.tap, "nodad"])?;
    }
    if a.vms > 0 {
        add_vms(s, &mut client, a)?;
    }
    if a.lan {
        add_lan(s, &mut client, a.mtu, a.uplinks, kernel)?;
    }
    Ok(())
}

/// The VMs of `--vm`: a vhost-user port each (its socket in the labs directory), QEMU
/// booted in the background, then each console waited for (all boot at once).
fn add_vms(s: &mut LabState, client: &mut Client, a: &UpArgs) -> Result<()> {
    let dir = paths::labs_dir();
    // The VMs are in the lab's state before their image is built: a lab going down
    // meanwhile keeps the image for them.
    let first = s.guests.len();
    for k in 1..=a.vms {
        let n = a.guests + k;
        s.guests.push(Guest {
            added_port: true,
            ..Guest::numbered(n, format!("vm{k}"), String::new(), format!("{}-vm{k}", s.name))
        });
    }
    s.save()?;
    let img = crate::vm::image(&dir).context("building the VMs' image")?;
    let accel = crate::vm::choose_accel(a.accel, &img, &dir)?;
    eprintln!("booting {} VM(s) under {}", a.vms, if accel == crate::vm::Accel::Kvm { "KVM" } else { "TCG" });
    for k in 1..=a.vms {
        let n = a.guests + k;
        let idx = first + k as usize - 1;
        let mut g = s.guests[idx].clone();
        let socket = dir.join(format!("{}-vm{k}.vhost.sock", s.name));
        let spec = PortSpec {
            kind: sluice_api::config::PortKind::VhostUser,
            socket: Some(socket.clone()),
            mtu: Some(a.mtu),
            offload: !a.no_offload,
            ips: if a.mode == ModeArg::L3 { g.addresses() } else { vec![] },
            ..PortSpec::tap(&g.tap)
        };
        client.call_value(&Request::PortAdd { port: Box::new(spec), may_exist: false })?;
        let mac = crate::vm::mac(n);
        let files = crate::vm::boot(
            &img,
            &crate::vm::VmSpec {
                name: &format!("{}-vm{k}", s.name),
                dir: &dir,
                socket: Some(&socket),
                tap: None,
                mac: &mac,
                ipv4: &g.ipv4,
                ipv6: &g.ipv6,
                mtu: a.mtu,
                accel,
            },
        )?;
        g.vm = Some(files);
        s.guests[idx] = g;
        s.save()?;
    }
    for g in s.guests.iter().filter(|g| g.vm.is_some()) {
        let vm = g.vm.as_ref().expect("filtered");
        let mut c = crate::vm::Console::connect(&vm.serial, Duration::from_secs(10))?;
        c.wait_ready(Duration::from_secs(120)).with_context(|| {
            format!(
                "VM {} (QEMU pid {}; its stderr: {}, its kernel's console: {})",
                g.guest,
                vm.pid,
                vm.log.display(),
                vm.console.display()
            )
        })?;
    }
    Ok(())
}

/// Stops VM `guest`'s QEMU and boots it again with the same port, address and files;
/// waits for its console.
pub fn reboot_vm(s: &mut LabState, guest: &str) -> Result<()> {
    let idx = s
        .guests
        .iter()
        .position(|g| g.guest == guest)
        .with_context(|| format!("lab {} has no VM {guest:?}", s.name))?;
    let g = s.guests[idx].clone();
    let vm = g.vm.clone().with_context(|| format!("{guest} is not a VM"))?;
    crate::vm::stop(vm.pid);
    let dir = paths::labs_dir();
    let img = crate::vm::image(&dir)?;
    let accel = if vm.accel == "kvm" { crate::vm::Accel::Kvm } else { crate::vm::Accel::Tcg };
    let files = crate::vm::boot(
        &img,
        &crate::vm::VmSpec {
            name: &g.tap,
            dir: &dir,
            socket: Some(&vm.socket),
            tap: None,
            mac: &crate::vm::mac(g.number()),
            ipv4: &g.ipv4,
            ipv6: &g.ipv6,
            mtu: s.mtu,
            accel,
        },
    )?;
    let serial = files.serial.clone();
    s.guests[idx].vm = Some(files);
    s.save()?;
    crate::vm::Console::connect(&serial, Duration::from_secs(10))?.wait_ready(Duration::from_secs(120))
}

/// Runs `cmd` on VM guest `g`'s console, its output to ours; returns its exit code.
pub fn vm_exec(g: &Guest, cmd: &[String], wait: Duration) -> Result<i32> {
    let vm = g.vm.as_ref().context("not a VM")?;
    let line = cmd.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" ");
    let mut c = crate::vm::Console::connect(&vm.serial, Duration::from_secs(5))?;
    let (rc, out) = c.run(&line, wait)?;
    std::io::stdout().write_all(&out)?;
    Ok(rc)
}

/// One argument as `sh` reads it back.
fn shell_quote(a: &str) -> String {
    if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c)) {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

/// The external host `lan` behind the uplink: namespace `sluice-LAB-lan` with `eth0`,
/// whose veth peer `LAB-up` sits in namespace `sluice-LAB-up` and is the switch's uplink
/// (on the kernel datapath: in the switch's own namespace, where the kernel can send to it).
/// With `uplinks` > 1, `eth0`, `eth1`… are joined by a bridge `br0` that holds the host's
/// addresses, and `LAB-up2`, `LAB-up3` are the uplink's backups.
fn add_lan(s: &mut LabState, client: &mut Client, mtu: u16, uplinks: u8, kernel: bool) -> Result<()> {
    let (up_ns, lan_ns, port) =
        (format!("sluice-{}-up", s.name), format!("sluice-{}-lan", s.name), format!("{}-up", s.name));
    for ns in [&up_ns, &lan_ns] {
        if netns::exists(ns) {
            bail!("network namespace {ns} already exists and is not this lab's; remove it or pick another lab --name");
        }
    }
    if !kernel {
        s.extra_netns.push(up_ns.clone());
        s.save()?;
        sh(&["ip", "netns", "add", &up_ns])?;
    }
    let g = Guest {
        guest: "lan".into(),
        netns: lan_ns.clone(),
        tap: port.clone(),
        ipv4: "10.77.0.200/24".into(),
        ipv6: "fd77::c8/64".into(),
        created_netns: true,
        added_port: false,
        relay_pid: None,
        vm: None,
    };
    s.guests.push(g.clone());
    s.save()?;
    sh(&["ip", "netns", "add", &lan_ns])?;
    netns::run_in(Some(&lan_ns), || {
        for k in ["default", "all"] {
            fs::write(format!("/proc/sys/net/ipv6/conf/{k}/accept_dad"), "0")?;
        }
        Ok(())
    })?;
    let m = mtu.to_string();
    let mut backups = Vec::new();
    sh(&["ip", "-n", &lan_ns, "link", "set", "lo", "up"])?;
    let host_dev = if uplinks > 1 { "br0" } else { "eth0" };
    if uplinks > 1 {
        add_bridge(&lan_ns, mtu)?;
    }
    for i in 0..uplinks {
        let up_dev = if i == 0 { port.clone() } else { format!("{port}{}", i + 1) };
        let lan_dev = format!("eth{i}");
        let mut add = vec!["ip"];
        let mut set = vec!["ip"];
        if !kernel {
            add.extend(["-n", &up_ns]);
            set.extend(["-n", &up_ns]);
        } else {
            s.links.push(up_dev.clone());
            s.save()?;
        }
        add.extend(["link", "add", &up_dev, "mtu", &m, "type", "veth", "peer", "name", &lan_dev, "mtu", &m]);
        add.extend(["netns", &lan_ns]);
        sh(&add)?;
        set.extend(["link", "set", &up_dev, "up"]);
        sh(&set)?;
        if uplinks > 1 {
            sh(&["ip", "-n", &lan_ns, "link", "set", &lan_dev, "master", "br0"])?;
        }
        sh(&["ip", "-n", &lan_ns, "link", "set", &lan_dev, "up"])?;
        if i > 0 {
            backups.push(up_dev);
        }
    }
    sh(&["ip", "-n", &lan_ns, "link", "set", host_dev, "up"])?;
    sh(&["ip", "-n", &lan_ns, "addr", "add", &g.ipv4, "dev", host_dev])?;
    sh(&["ip", "-n", &lan_ns, "addr", "add", &g.ipv6, "dev", host_dev, "nodad"])?;
    let idx = s.guests.len() - 1;
    s.guests[idx].added_port = true;
    s.save()?;
    let mut spec = PortSpec::tap(&port);
    spec.kind = sluice_api::config::PortKind::Uplink;
    spec.netns = (!kernel).then_some(up_ns);
    spec.backups = backups;
    client.call_value(&Request::PortAdd { port: Box::new(spec), may_exist: false })?;
    Ok(())
}

fn start_switch(s: &mut LabState, a: &UpArgs) -> Result<()> {
    let dir = paths::labs_dir();
    let conf = dir.join(format!("{}.toml", s.name));
    let log = dir.join(format!("{}.log", s.name));
    let mut f = fs::File::create(&conf)?;
    writeln!(f, "# written by `sluice lab up --name {}`", s.name)?;
    writeln!(
        f,
        "name = {:?}\nmode = {:?}\ndatapath = {:?}\nmtu = {}\nlossless = {}\npoll = {}",
        s.switch,
        a.mode.as_str(),
        a.datapath.unwrap_or_default().kind().as_str(),
        a.mtu,
        a.lossless,
        a.poll
    )?;
    writeln!(f, "socket = {:?}", s.socket.display().to_string())?;
    if a.gateway {
        writeln!(f, "gateway = {GATEWAY:?}\ngateway_dhcp_range = \"10.77.0.100-10.77.0.199\"")?;
    }
    if a.evpn && a.host > 0 {
        // Host K of an EVPN lab: its tunnel, whose stations come from routes, and its speaker.
        let k = a.host;
        let parent = s.name.strip_suffix(&format!("h{k}")).unwrap_or(&s.name);
        writeln!(
            f,
            "\n[[port]]\nname = \"vx0\"\ntype = \"vxlan\"\nnetns = \"sluice-{parent}-h{k}\"\nlocal = \"192.168.77.{k}\"\nvni = {}\nevpn = true\n\n[evpn]\nasn = {}\npeers = [{:?}]",
            crate::hosts::LAB_VNI,
            crate::frr::LAB_ASN,
            crate::frr::RR_ADDRESS
        )?;
    }
    drop(f);
    let logf = fs::File::create(&log)?;
    let pid = spawn_detached(
        s.exe.as_deref(),
        ["switch".as_ref(), "run".as_ref(), "--config".as_ref(), conf.as_os_str()],
        logf,
    )
    .context("starting the switch daemon")?;
    s.started_switch = true;
    s.switch_pid = Some(pid);
    s.save()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if s.switch_alive() {
            return Ok(());
        }
        if !Path::new(&format!("/proc/{pid}")).exists() || is_zombie(pid) {
            let log = fs::read_to_string(&log).unwrap_or_default().trim().to_string();
            if a.datapath == Some(sluice_api::config::DatapathArg::Kernel) && log.contains("kernel datapath") {
                return Err(Error::KernelDatapathRefused { log });
            }
            bail!("the switch daemon exited at start:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("the switch daemon did not open its socket within 10 s (log: {})", log.display())
}

/// Starts `exe` (else this sluice executable) with `args` in a process group of its own,
/// its output appended to `log`; it outlives this command (init reaps it). Returns its pid.
fn spawn_detached<'a>(exe: Option<&Path>, args: impl IntoIterator<Item = &'a OsStr>, log: fs::File) -> Result<u32> {
    let exe = match exe {
        Some(e) => e.to_path_buf(),
        None => std::env::current_exe().context("finding the sluice executable")?,
    };
    let child = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()?;
    let pid = child.id();
    std::mem::forget(child);
    Ok(pid)
}

/// Where guest `guest`'s relay listens.
fn relay_socket(lab: &str, guest: &str) -> PathBuf {
    paths::labs_dir().join(format!("{lab}-{guest}.sock"))
}

/// Starts the relay for guest `idx` (its TAP in the guest's namespace, listening on
/// [`relay_socket`]) and waits until it listens; returns its pid.
fn start_relay(s: &LabState, idx: usize, mtu: u16) -> Result<u32> {
    let g = &s.guests[idx];
    let sock = relay_socket(&s.name, &g.guest);
    let log =
        fs::OpenOptions::new().create(true).append(true).open(paths::labs_dir().join(format!("{}.log", s.name)))?;
    // A socket left by an earlier lab of this name would look like this relay's.
    let _ = fs::remove_file(&sock);
    let mtu = mtu.to_string();
    let args = ["port", "relay", &g.tap, "--netns", &g.netns, "--mtu", &mtu, "--listen"];
    let pid = spawn_detached(s.exe.as_deref(), args.iter().map(OsStr::new).chain([sock.as_os_str()]), log)
        .context("starting a relay")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if sock.exists() {
            return Ok(pid);
        }
        if is_zombie(pid) {
            bail!(
                "the relay for {} exited at start (see {})",
                g.guest,
                paths::labs_dir().join(format!("{}.log", s.name)).display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("the relay for {} did not listen on {} within 10 s", g.guest, sock.display())
}

fn is_zombie(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.trim_start().starts_with('Z')))
        .unwrap_or(true)
}

/// The switch's gateway with `--gateway` (the guests' router; the LAN host keeps .200).
const GATEWAY: &str = "10.77.0.254/24";

/// The script busybox's udhcpc runs (Debian's busybox ships none): applies the lease.
pub const UDHCPC_SCRIPT: &str = "#!/bin/sh\n\
case \"$1\" in\n\
deconfig) ip link set \"$interface\" up; ip addr flush dev \"$interface\" ;;\n\
bound|renew) ip addr flush dev \"$interface\"; ip addr add \"$ip/${mask:-24}\" dev \"$interface\";\n\
  [ -n \"$router\" ] && ip route replace default via \"${router%% *}\" dev \"$interface\" ;;\n\
esac\n\
exit 0\n";

/// Asks the gateway's dnsmasq for an address for interface `ifname` in namespace `ns`
/// (busybox udhcpc, its script written fresh into the labs directory and removed after);
/// returns the address with its prefix.
fn dhcp(lab: &str, ns: &str, ifname: &str) -> Result<String> {
    use std::os::unix::fs::OpenOptionsExt;
    let script = paths::labs_dir().join(format!("{lab}.udhcpc.sh"));
    let _ = fs::remove_file(&script);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&script)
        .with_context(|| format!("writing {}", script.display()))?;
    f.write_all(UDHCPC_SCRIPT.as_bytes())?;
    drop(f);
    let s = script.display().to_string();
    let got = sh(&[
        "ip", "netns", "exec", ns, "busybox", "udhcpc", "-i", ifname, "-q", "-n", "-t", "10", "-T", "1", "-s", &s,
    ]);
    let _ = fs::remove_file(&script);
    got.with_context(|| {
        format!("{ns} got no address by DHCP from the gateway (busybox udhcpc; `apt-get install busybox`)")
    })?;
    let out = Command::new("ip").args(["-n", ns, "-4", "-o", "addr", "show", "dev", ifname]).output()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    match text.split_whitespace().skip_while(|w| *w != "inet").nth(1) {
        Some(a) => Ok(a.to_string()),
        None => bail!("{ns}: udhcpc ended but {ifname} has no IPv4 address"),
    }
}

/// Removes lab `name`: ports, namespaces, and the switch if the lab started it.
pub fn down(name: &str) -> Result<()> {
    let s = LabState::load(name)?;
    let mut problems = Vec::new();
    for sub in &s.sublabs {
        if state_path(sub).exists()
            && let Err(e) = down(sub)
        {
            problems.push(format!("host lab {sub}: {}", e.chain()));
        }
    }
    let mut client = if s.switch_alive() { Client::connect(&s.socket).ok() } else { None };
    for g in s.guests.iter().rev() {
        if g.added_port
            && !s.started_switch
            && let Some(c) = client.as_mut()
            && let Err(e) = c.call_value(&Request::PortDel { name: g.tap.clone(), if_exists: false })
            && !e.to_string().contains("no port named")
        {
            problems.push(format!("port {}: {e}", g.tap));
        }
        if let Some(vm) = &g.vm {
            crate::vm::stop(vm.pid);
            for f in [&vm.serial, &vm.log, &vm.console] {
                let _ = fs::remove_file(f);
            }
            let _ = fs::remove_file(vm.serial.with_extension("pid"));
        }
        // A relay ends when its port goes; one the switch never took is stopped here.
        if let Some(pid) = g.relay_pid {
            stop_relay(pid, &g.tap);
            let _ = fs::remove_file(relay_socket(&s.name, &g.guest));
        }
        // The switch's end of a guest's veth pair (kernel datapath): deleted here, so the
        // pair is gone at once, even while something keeps the guest's namespace alive.
        if s.datapath == "kernel" && g.created_netns && g.guest != "lan" {
            let _ = sh(&["ip", "link", "del", &g.tap]);
        }
        if g.created_netns
            && netns::exists(&g.netns)
            && let Err(e) = sh(&["ip", "netns", "del", &g.netns])
        {
            problems.push(e.to_string());
        }
    }
    for l in s.links.iter().rev() {
        let _ = sh(&["ip", "link", "del", l]);
    }
    for ns in s.extra_netns.iter().rev() {
        if netns::exists(ns)
            && let Err(e) = sh(&["ip", "netns", "del", ns])
        {
            problems.push(e.to_string());
        }
    }
    crate::frr::stop(&s.daemons);
    if s.started_switch {
        if let Some(c) = client.as_mut() {
            let _ = c.call_value(&Request::Shutdown);
        }
        if let Some(pid) = s.switch_pid {
            stop_pid(pid, &s.name);
        }
    }
    for ext in ["json", "toml", "log"] {
        let _ = fs::remove_file(paths::labs_dir().join(format!("{}.{ext}", s.name)));
    }
    // The VMs' image (tens of MB, under /run: memory) and the KVM verdict go with the last
    // lab that has VMs.
    let is_vm = |g: &Guest| g.vm.is_some() || (g.netns.is_empty() && g.guest.starts_with("vm"));
    if s.guests.iter().any(is_vm)
        && !list_names().iter().filter_map(|n| LabState::load(n).ok()).any(|l| l.guests.iter().any(is_vm))
    {
        crate::vm::remove_images(&paths::labs_dir());
    }
    if s.started_switch {
        // What a daemon that died (rather than stopped) left for its next run: its state
        // file, its socket, and on the kernel datapath its programs and upcall TAP.
        let _ = fs::remove_file(paths::run_dir().join(format!("{}.state.json", s.switch)));
        // (A lab's ports are its own: none is kept for a later switch of the name.)
        let _ = fs::remove_file(paths::ports_file(&s.switch));
        if !s.switch_alive() {
            let _ = fs::remove_file(&s.socket);
            if s.datapath == "kernel" {
                sluice_daemon::kernel::remove_leftovers(&s.switch);
            }
        }
    }
    if problems.is_empty() { Ok(()) } else { bail!("lab {name} removed with problems: {}", problems.join("; ")) }
}

/// Stops relay `pid` if it is still the relay of TAP `tap`.
fn stop_relay(pid: u32, tap: &str) {
    let ours = || {
        fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| {
                let args: Vec<&[u8]> = c.split(|&b| b == 0).collect();
                args.contains(&b"relay".as_slice()) && args.contains(&tap.as_bytes())
            })
            .unwrap_or(false)
            && !is_zombie(pid)
    };
    if ours() {
        let _ = sluice_sys::kill(pid, libc::SIGKILL);
    }
}

/// Waits for the lab's daemon to exit; terminates it if it does not (only if the process
/// is still the sluice daemon started for this lab).
fn stop_pid(pid: u32, lab: &str) {
    let ours = || {
        fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("switch") && c.contains(&format!("labs/{lab}.toml"))
            })
            .unwrap_or(false)
            && !is_zombie(pid)
    };
    for sig in [0, libc::SIGTERM, libc::SIGKILL] {
        if sig != 0 && ours() {
            let _ = sluice_sys::kill(pid, sig);
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if !ours() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
