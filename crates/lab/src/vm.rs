//! The lab's small VMs (`sluice lab up --vm N`): Debian's packaged kernel, an initramfs
//! the lab builds (busybox, the virtio-net modules, iperf3), QEMU attached to the switch
//! by a vhost-user port, and a console on the VM's serial port that runs one command at a
//! time for `sluice lab exec vmN -- CMD`.
//!
//! KVM where it works, TCG where not (`--accel auto`): on some machines /dev/kvm opens but
//! KVM guests hang at boot, so a small VM without a NIC is booted under KVM and KVM is used
//! if its console answers in time (the verdict is kept in the labs directory with the
//! host's boot id, until the last lab with VMs goes). TCG boots this kernel with this initramfs in seconds:
//! the kernel's compressed payload is unpacked once into an ELF `vmlinux` that QEMU loads
//! directly (PVH), which saves the guest seconds of decompressing under TCG.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use sluice_sys::bail;
use sluice_sys::error::{Context, Failure};

use sluice_sys::which;

/// The guest's init: mounts, modules, the address from the kernel command line, then the
/// console loop on the second serial port, ttyS1 (the kernel's messages go to ttyS0, a
/// file, so nothing interleaves with a command's output):
///   host  → `ID COMMAND\n`
///   guest → `\n@@SLUICE BEGIN ID@@\n` output `\n@@SLUICE END ID RC@@\n`
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox --install -s /bin
export PATH=/bin:/usr/bin:/sbin
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /tmp /run /dev/pts
mount -t devpts devpts /dev/pts
IP= IP6= MTU= HN= DEBUG= NONET=
for a in $(cat /proc/cmdline); do
  case "$a" in
    sluice.ip=*) IP=${a#*=} ;;
    sluice.ip6=*) IP6=${a#*=} ;;
    sluice.mtu=*) MTU=${a#*=} ;;
    sluice.hostname=*) HN=${a#*=} ;;
    sluice.debug=*) DEBUG=1 ;;
    sluice.nonet=*) NONET=1 ;;
  esac
done
[ -z "$DEBUG" ] && dmesg -n 1
[ -n "$HN" ] && hostname "$HN"
echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad
echo 0 > /proc/sys/net/ipv6/conf/default/router_solicitations
echo 0 > /proc/sys/net/ipv6/conf/default/accept_ra
for m in $(cat /lib/modules/order); do insmod /lib/modules/$m.ko; done
ip link set lo up
if [ -z "$NONET" ]; then
  i=0; while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 500 ]; do usleep 10000; i=$((i+1)); done
  [ -n "$MTU" ] && ip link set eth0 mtu "$MTU"
  ip link set eth0 up
  [ -n "$IP" ] && ip addr add "$IP" dev eth0
  [ -n "$IP6" ] && ip -6 addr add "$IP6" dev eth0
fi
console() {
  exec 0<>/dev/ttyS1 1>&0 2>&0
  stty raw -echo
  CR=$(printf '\r')
  printf '\n@@SLUICE READY@@\n'
  while :; do
    IFS= read -r line || { usleep 100000; continue; }
    line=${line%"$CR"}
    id=${line%% *}
    cmd=
    [ "$id" != "$line" ] && cmd=${line#* }
    printf '\n@@SLUICE BEGIN %s@@\n' "$id"
    sh -c "$cmd" </dev/null 2>&1
    rc=$?
    printf '\n@@SLUICE END %s %d@@\n' "$id" "$rc"
  done
}
# The console loop is not PID 1: a command's background processes are orphans when it
# returns, and their end signals PID 1; a signal that lands while `read` is part-way
# through a line makes busybox drop the part already read, and the host waits for an
# answer that never comes. PID 1 only reaps.
console &
while :; do wait; sleep 1; done
"#;

/// The modules virtio-net over PCI needs, in load order (those built into the kernel are
/// skipped).
const MODULES: &[&str] = &[
    "failover",
    "net_failover",
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "virtio_net",
];

/// Guest memory (shared with the switch through a memfd).
pub const VM_MEM_MB: u32 = 160;

/// A kernel and an initramfs to boot.
#[derive(Debug, Clone)]
pub struct Image {
    /// The kernel QEMU loads (`vmlinux`, or the distribution's `vmlinuz`).
    pub kernel: PathBuf,
    /// The initramfs (uncompressed newc cpio).
    pub initrd: PathBuf,
}

/// What the VMs need installed, said when a part is missing.
const VM_PACKAGES: &str = "VMs need qemu-system-x86, linux-image-amd64 and busybox-static";

/// The newest kernel of the distribution's packages (`/boot/vmlinuz-VERSION` with its
/// `/lib/modules/VERSION`).
fn kernel_version() -> Result<String> {
    let mut v: Vec<String> = fs::read_dir("/lib/modules")
        .context("reading /lib/modules: install a kernel package (apt-get install linux-image-amd64)")?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|v| Path::new(&format!("/boot/vmlinuz-{v}")).exists())
        .collect();
    v.sort_by_key(|a| version_key(a));
    Ok(v.pop().context(
        "no kernel for VMs: /boot/vmlinuz-VERSION with /lib/modules/VERSION is needed (apt-get install linux-image-amd64)",
    )?)
}

fn version_key(v: &str) -> Vec<u64> {
    v.split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse().ok()).collect()
}

/// Builds the VM image under `dir` once per kernel version (reused after; rebuilt only
/// when missing).
pub fn image(dir: &Path) -> Result<Image> {
    let kver = kernel_version()?;
    let at = dir.join(format!("vm-image-{kver}"));
    let img = Image { kernel: at.join("vmlinux"), initrd: at.join("initramfs.cpio") };
    if img.kernel.exists() && img.initrd.exists() {
        return Ok(img);
    }
    for (tool, package) in [("qemu-system-x86_64", "qemu-system-x86"), ("busybox", "busybox-static")] {
        if which(tool).is_none() {
            return Err(Error::ToolMissing { tool, package, needed_for: VM_PACKAGES });
        }
    }
    // Built beside, then renamed into place: labs built in parallel never see half an image.
    let tmp = dir.join(format!(".vm-image-{kver}.{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let vmlinuz = PathBuf::from(format!("/boot/vmlinuz-{kver}"));
    match unpack_kernel(&vmlinuz) {
        Ok(elf) => fs::write(tmp.join("vmlinux"), elf)?,
        Err(e) => {
            // QEMU boots the compressed kernel too, a few seconds slower under TCG.
            eprintln!("sluice: booting {} as it is ({})", vmlinuz.display(), e.chain());
            fs::copy(&vmlinuz, tmp.join("vmlinux"))?;
        }
    }
    let cpio = initramfs(&kver)?;
    fs::write(tmp.join("initramfs.cpio"), cpio)?;
    match fs::rename(&tmp, &at) {
        Ok(()) => {}
        Err(_) if at.join("initramfs.cpio").exists() => {
            let _ = fs::remove_dir_all(&tmp); // another lab built it meanwhile
        }
        Err(e) => return Err(Failure::new(format!("moving the VM image to {}", at.display()), e).into()),
    }
    Ok(img)
}

/// Removes what the VMs of every lab shared under `dir`: the images built there and the
/// KVM verdict.
pub fn remove_images(dir: &Path) {
    let Ok(d) = fs::read_dir(dir) else { return };
    for e in d.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("vm-image-") {
            let _ = fs::remove_dir_all(e.path());
        } else if name == "kvm-verdict" {
            let _ = fs::remove_file(e.path());
        }
    }
}

fn le32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The ELF kernel inside a bzImage (boot protocol 2.08+: the payload's offset and length
/// in the setup header), decompressed with the system's xz, gzip or zstd.
fn unpack_kernel(bz: &Path) -> Result<Vec<u8>> {
    let b = fs::read(bz).with_context(|| format!("reading {}", bz.display()))?;
    let setup = match b.get(0x1f1).copied() {
        Some(0) => 4,
        Some(n) => usize::from(n),
        None => bail!("not a bzImage"),
    };
    let off = (setup + 1) * 512 + le32(&b, 0x248).context("no payload offset")? as usize;
    let len = le32(&b, 0x24c).context("no payload length")? as usize;
    let payload = b.get(off..off + len).context("payload outside the file")?;
    let tool: &[&str] = match payload {
        [0xfd, b'7', b'z', b'X', b'Z', 0, ..] => &["xz", "-dcq", "--single-stream"],
        [0x1f, 0x8b, ..] => &["gzip", "-dcq"],
        [0x28, 0xb5, 0x2f, 0xfd, ..] => &["zstd", "-dcq"],
        _ => bail!("unknown kernel compression"),
    };
    let out = pipe_through(tool, payload)?;
    if !out.starts_with(b"\x7fELF") {
        bail!("the unpacked kernel is not an ELF file");
    }
    Ok(out)
}

/// Runs `cmd` with `input` on its stdin; its stdout (gzip's complaint about trailing bytes
/// is ignored: the output is whole).
fn pipe_through(cmd: &[&str], input: &[u8]) -> Result<Vec<u8>> {
    let mut c = Command::new(cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("running {}", cmd[0]))?;
    let mut stdin = c.stdin.take().expect("piped");
    let data = input.to_vec();
    let feeder = std::thread::spawn(move || stdin.write_all(&data));
    let mut out = Vec::new();
    c.stdout.take().expect("piped").read_to_end(&mut out)?;
    let _ = feeder.join();
    let _ = c.wait();
    Ok(out)
}

/// A newc cpio archive, written by hand: directories, files, all root-owned.
struct Cpio {
    out: Vec<u8>,
    ino: u32,
    dirs: std::collections::BTreeSet<String>,
}

impl Cpio {
    fn new() -> Cpio {
        Cpio { out: Vec::new(), ino: 1, dirs: Default::default() }
    }

    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        let name = name.trim_start_matches('/');
        let hdr = format!(
            "070701{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}",
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len(),
            0,
            0,
            0,
            0,
            name.len() + 1,
            0
        );
        self.ino += 1;
        self.out.extend_from_slice(hdr.as_bytes());
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn dir(&mut self, path: &str) {
        let path = path.trim_matches('/');
        if path.is_empty() || self.dirs.contains(path) {
            return;
        }
        if let Some((parent, _)) = path.rsplit_once('/') {
            self.dir(parent);
        }
        self.dirs.insert(path.to_string());
        self.entry(path, 0o040755, &[]);
    }

    fn file(&mut self, path: &str, mode: u32, data: &[u8]) {
        if let Some((parent, _)) = path.trim_start_matches('/').rsplit_once('/') {
            self.dir(parent);
        }
        self.entry(path, 0o100000 | mode, data);
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        self.out
    }
}

/// A module's file (decompressed) from `modules.dep`, or `None` when it is built in.
fn module(kver: &str, m: &str) -> Result<Option<Vec<u8>>> {
    let dir = format!("/lib/modules/{kver}");
    let builtin = fs::read_to_string(format!("{dir}/modules.builtin")).unwrap_or_default();
    if builtin.lines().any(|l| l.ends_with(&format!("/{m}.ko"))) {
        return Ok(None);
    }
    let dep = fs::read_to_string(format!("{dir}/modules.dep")).with_context(|| format!("reading {dir}/modules.dep"))?;
    let file = dep
        .lines()
        .filter_map(|l| l.split(':').next())
        .find(|f| {
            let base = f.rsplit('/').next().unwrap_or_default();
            base.strip_prefix(m).is_some_and(|rest| rest.starts_with(".ko"))
        })
        .with_context(|| format!("module {m} is not in {dir}"))?;
    let bytes = fs::read(format!("{dir}/{file}")).with_context(|| format!("reading {dir}/{file}"))?;
    Ok(Some(if file.ends_with(".xz") {
        pipe_through(&["xz", "-dcq"], &bytes)?
    } else if file.ends_with(".zst") {
        pipe_through(&["zstd", "-dcq"], &bytes)?
    } else if file.ends_with(".gz") {
        pipe_through(&["gzip", "-dcq"], &bytes)?
    } else {
        bytes
    }))
}

/// A program and the shared libraries `ldd` names for it, at their own paths.
fn with_libs(c: &mut Cpio, prog: &Path) -> Result<()> {
    let out = Command::new("ldd").arg(prog).output().context("running ldd")?;
    let mut files = vec![prog.to_path_buf()];
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(p) = l.split_whitespace().find(|w| w.starts_with('/')) {
            files.push(PathBuf::from(p));
        }
    }
    for f in files {
        let real = fs::canonicalize(&f).unwrap_or_else(|_| f.clone());
        let data = fs::read(&real).with_context(|| format!("reading {}", real.display()))?;
        c.file(&f.to_string_lossy(), 0o755, &data);
    }
    Ok(())
}

fn initramfs(kver: &str) -> Result<Vec<u8>> {
    let mut c = Cpio::new();
    for d in ["dev", "proc", "sys", "tmp", "run", "root", "etc"] {
        c.dir(d);
    }
    c.file("init", 0o755, INIT.as_bytes());
    let bb = which("busybox").ok_or(Error::ToolMissing {
        tool: "busybox",
        package: "busybox-static",
        needed_for: VM_PACKAGES,
    })?;
    let bytes = fs::read(&bb)?;
    c.file("bin/busybox", 0o755, &bytes);
    let mut order = String::new();
    for m in MODULES {
        if let Some(data) = module(kver, m)? {
            c.file(&format!("lib/modules/{m}.ko"), 0o644, &data);
            order.push_str(m);
            order.push('\n');
        }
    }
    c.file("lib/modules/order", 0o644, order.as_bytes());
    if let Some(iperf3) = which("iperf3") {
        with_libs(&mut c, &iperf3)?;
    }
    c.file("etc/hosts", 0o644, b"127.0.0.1 localhost\n");
    Ok(c.finish())
}

/// Where a lab's VM keeps its files.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct VmFiles {
    /// QEMU's pid.
    pub pid: u32,
    /// The console (QEMU's serial port, a unix socket QEMU listens on).
    pub serial: PathBuf,
    /// The vhost-user socket (the switch's port listens; QEMU connects and reconnects).
    pub socket: PathBuf,
    /// QEMU's stderr.
    pub log: PathBuf,
    /// The guest kernel's console (its first serial port), for when a VM does not boot.
    #[serde(default)]
    pub console: PathBuf,
    /// How it runs: "kvm" or "tcg".
    #[serde(default)]
    pub accel: String,
}

/// How the lab's VMs run (`sluice lab up --accel`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Accel {
    /// KVM if a probe VM boots under it, else TCG.
    #[default]
    Auto,
    /// The kernel's hardware virtualization (/dev/kvm).
    Kvm,
    /// QEMU's emulator: slower, works everywhere.
    Tcg,
}

impl Accel {
    fn as_str(self) -> &'static str {
        match self {
            Accel::Auto => "auto",
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// How long a probe VM under KVM gets to answer on its console (TCG boots the same VM in
/// 2–8 s on a machine of this kind; KVM in under one).
const KVM_PROBE: Duration = Duration::from_secs(20);

/// Whether /dev/kvm opens for reading and writing (the device exists and we may use it).
fn kvm_opens() -> bool {
    fs::OpenOptions::new().read(true).write(true).open("/dev/kvm").is_ok()
}

/// Resolves `--accel` to KVM or TCG. `auto` asks the verdict of this host boot, kept in
/// `dir`, or boots a probe VM under KVM to find it (and keeps it).
pub fn choose_accel(want: Accel, img: &Image, dir: &Path) -> Result<Accel> {
    match want {
        Accel::Tcg => return Ok(Accel::Tcg),
        Accel::Kvm if !kvm_opens() => {
            bail!("--accel kvm: /dev/kvm does not open (no KVM on this machine, or no access to it); use --accel tcg")
        }
        Accel::Kvm => return Ok(Accel::Kvm),
        Accel::Auto if !kvm_opens() => return Ok(Accel::Tcg),
        Accel::Auto => {}
    }
    let boot_id = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default().trim().to_string();
    let verdict = dir.join("kvm-verdict");
    if let Some(v) =
        fs::read_to_string(&verdict).ok().and_then(|t| t.strip_prefix(&format!("{boot_id} ")).map(str::to_string))
    {
        return Ok(if v.trim() == "kvm" { Accel::Kvm } else { Accel::Tcg });
    }
    eprintln!("checking whether KVM guests boot here (up to {} s)…", KVM_PROBE.as_secs());
    let name = format!("kvm-probe-{}", std::process::id());
    let probe = VmSpec {
        name: &name,
        dir,
        socket: None,
        tap: None,
        mac: "52:54:00:77:00:ff",
        ipv4: "",
        ipv6: "",
        mtu: 1500,
        accel: Accel::Kvm,
    };
    // Under KVM a guest may hang (no answer: 20 s) or QEMU may fail at once (e.g. "failed
    // to set MSR" with `-cpu host` on this machine class).
    let works = match boot(img, &probe) {
        Ok(f) => {
            let ok =
                Console::connect(&f.serial, Duration::from_secs(5)).and_then(|mut c| c.wait_ready(KVM_PROBE)).is_ok();
            stop(f.pid);
            ok
        }
        Err(_) => false,
    };
    for ext in ["serial", "log", "console", "pid"] {
        let _ = fs::remove_file(dir.join(format!("{name}.{ext}")));
    }
    let chosen = if works { Accel::Kvm } else { Accel::Tcg };
    if !works {
        eprintln!("KVM guests do not boot here: the VMs run under TCG (`--accel kvm` to insist)");
    }
    let tmp = dir.join(format!("kvm-verdict.{}", std::process::id()));
    if fs::write(&tmp, format!("{boot_id} {}\n", chosen.as_str())).is_ok() {
        let _ = fs::rename(&tmp, &verdict);
    }
    Ok(chosen)
}

/// The MAC address of the lab's VM with number `n` in the address table.
pub fn mac(n: u32) -> String {
    format!("52:54:00:77:00:{n:02x}")
}

/// What a VM is booted with.
pub struct VmSpec<'a> {
    /// Name (the QEMU process's and the guest's hostname).
    pub name: &'a str,
    /// Directory for its files.
    pub dir: &'a Path,
    /// The switch's vhost-user socket (none: a VM without a NIC, the KVM probe).
    pub socket: Option<&'a Path>,
    /// A TAP interface for QEMU's own TAP backend instead (in the namespace QEMU starts in).
    pub tap: Option<&'a str>,
    /// MAC address.
    pub mac: &'a str,
    /// IPv4 and IPv6 addresses with prefixes.
    pub ipv4: &'a str,
    /// IPv6 address with prefix.
    pub ipv6: &'a str,
    /// MTU.
    pub mtu: u16,
    /// KVM or TCG (not `Auto`: [`choose_accel`] resolves it).
    pub accel: Accel,
}

/// The kernel command line the image's init reads: the kernel's console on the first
/// serial port, hostname `name`, and the first NIC's IPv4 and IPv6 addresses (with
/// prefixes) and MTU, or no NIC (`None`). The console loop is on the second serial port.
pub fn cmdline(name: &str, net: Option<(&str, &str, u16)>) -> String {
    let net = match net {
        Some((ipv4, ipv6, mtu)) => format!("sluice.ip={ipv4} sluice.ip6={ipv6} sluice.mtu={mtu}"),
        None => "sluice.nonet=1".into(),
    };
    format!(
        "console=ttyS0 quiet panic=-1 cryptomgr.notests=1 rodata=off mitigations=off tsc=reliable no_timer_check \
         sluice.hostname={name} {net}"
    )
}

/// Boots a VM in the background (QEMU daemonizes); returns its files.
pub fn boot(img: &Image, v: &VmSpec<'_>) -> Result<VmFiles> {
    let serial = v.dir.join(format!("{}.serial", v.name));
    let console = v.dir.join(format!("{}.console", v.name));
    let pidfile = v.dir.join(format!("{}.pid", v.name));
    let log = v.dir.join(format!("{}.log", v.name));
    let _ = fs::remove_file(&serial);
    let _ = fs::remove_file(&pidfile);
    let mem = format!("{VM_MEM_MB}M");
    let net = v.socket.map(|_| ()).or(v.tap.map(|_| ())).map(|()| (v.ipv4, v.ipv6, v.mtu));
    let append = cmdline(v.name, net);
    let (accel, cpu) = if v.accel == Accel::Kvm { ("kvm", "host") } else { ("tcg", "qemu64") };
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(["-name", v.name, "-accel", accel, "-machine", "q35,memory-backend=mem"])
        .args(["-object", &format!("memory-backend-memfd,id=mem,size={mem},share=on")])
        .args(["-m", &mem, "-smp", "1", "-cpu", cpu])
        .args(["-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"]);
    if Path::new("/usr/share/qemu/qboot.rom").exists() {
        cmd.args(["-bios", "/usr/share/qemu/qboot.rom"]);
    }
    cmd.arg("-kernel").arg(&img.kernel).arg("-initrd").arg(&img.initrd).args(["-append", &append]);
    cmd.args(["-chardev", &format!("file,id=ser0,path={}", console.display())])
        .args(["-serial", "chardev:ser0"])
        .args(["-chardev", &format!("socket,id=ser1,path={},server=on,wait=off", serial.display())])
        .args(["-serial", "chardev:ser1"]);
    if let Some(socket) = v.socket {
        cmd.args(["-chardev", &format!("socket,id=vu0,path={},reconnect=1", socket.display())])
            .args(["-netdev", "vhost-user,id=n0,chardev=vu0"])
            // vectors=0: QEMU 7.2 under TCG crashes starting a vhost-user device with MSI-X
            // (in msix_set_vector_notifiers); legacy interrupts work.
            .args(["-device", &format!("virtio-net-pci,netdev=n0,mac={},mrg_rxbuf=on,vectors=0", v.mac)]);
    }
    if let Some(tap) = v.tap {
        cmd.args(["-netdev", &format!("tap,id=n0,ifname={tap},script=no,downscript=no")])
            .args(["-device", &format!("virtio-net-pci,netdev=n0,mac={},mrg_rxbuf=on", v.mac)]);
    }
    cmd.arg("-pidfile").arg(&pidfile).arg("-daemonize");
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .context("running qemu-system-x86_64 (apt-get install qemu-system-x86)")?;
    if !out.status.success() {
        for f in [&serial, &console, &pidfile] {
            let _ = fs::remove_file(f);
        }
        let hint = if v.accel == Accel::Kvm { " (KVM does not run guests here: use --accel tcg)" } else { "" };
        bail!("QEMU did not start VM {}{hint}: {}", v.name, String::from_utf8_lossy(&out.stderr).trim());
    }
    let _ = fs::write(&log, &out.stderr);
    let pid: u32 = fs::read_to_string(&pidfile)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .with_context(|| format!("QEMU wrote no pid to {}", pidfile.display()))?;
    let socket = v.socket.map(Path::to_path_buf).unwrap_or_default();
    Ok(VmFiles { pid, serial, socket, log, console, accel: accel.into() })
}

/// Stops a VM: SIGTERM, then SIGKILL after 5 s; true if its QEMU was running.
pub fn stop(pid: u32) -> bool {
    let alive = |p: u32| Path::new(&format!("/proc/{p}")).exists() && is_qemu(p);
    if pid == 0 || !alive(pid) {
        return false;
    }
    let _ = sluice_sys::kill(pid, libc::SIGTERM); // a pid this lab started, checked to be QEMU
    let until = Instant::now() + Duration::from_secs(5);
    while alive(pid) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    if alive(pid) {
        let _ = sluice_sys::kill(pid, libc::SIGKILL);
    }
    true
}

fn is_qemu(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.starts_with("qemu-system"))
}

/// A connection to a VM's console.
pub struct Console {
    s: UnixStream,
    buf: Vec<u8>,
    seq: u32,
}

impl Console {
    /// Connects to the console socket, waiting up to `wait` for QEMU to create it.
    pub fn connect(path: &Path, wait: Duration) -> Result<Console> {
        let until = Instant::now() + wait;
        loop {
            match UnixStream::connect(path) {
                Ok(s) => return Ok(Console { s, buf: Vec::new(), seq: 0 }),
                Err(e) if Instant::now() > until => {
                    return Err(Failure::new(format!("connecting to the VM's console {}", path.display()), e).into());
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    fn fill(&mut self, until: Instant) -> Result<bool> {
        let left = until.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        self.s.set_read_timeout(Some(left))?;
        let mut chunk = [0u8; 65536];
        match self.s.read(&mut chunk) {
            Ok(0) => bail!("the VM's console closed (did QEMU exit?)"),
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(true)
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Waits until the guest's console loop answers (it asks every half second).
    pub fn wait_ready(&mut self, wait: Duration) -> Result<()> {
        let until = Instant::now() + wait;
        while Instant::now() < until {
            match self.run_for("true", Duration::from_millis(500)) {
                Ok((0, _)) => return Ok(()),
                Err(e) if e.to_string().contains("closed") => return Err(e),
                _ => continue,
            }
        }
        bail!("the VM did not answer on its console within {} s", wait.as_secs())
    }

    /// Runs `cmd` with `sh -c` in the guest; its exit code and output (stdout and stderr).
    pub fn run(&mut self, cmd: &str, wait: Duration) -> Result<(i32, Vec<u8>)> {
        self.run_for(cmd, wait)
    }

    fn run_for(&mut self, cmd: &str, wait: Duration) -> Result<(i32, Vec<u8>)> {
        if cmd.contains('\n') {
            bail!("a console command is one line");
        }
        self.seq += 1;
        let id = format!("c{}x{}", std::process::id(), self.seq);
        self.s.write_all(format!("{id} {cmd}\n").as_bytes())?;
        let begin = format!("\n@@SLUICE BEGIN {id}@@\n");
        let end = format!("\n@@SLUICE END {id} ");
        let until = Instant::now() + wait;
        loop {
            if let Some(b) = find(&self.buf, begin.as_bytes()) {
                let from = b + begin.len() - 1;
                if let Some(e) = find(&self.buf[from..], end.as_bytes()).map(|e| e + from)
                    && let Some(close) = find(&self.buf[e + end.len()..], b"@@\n").map(|c| c + e + end.len())
                {
                    let rc = std::str::from_utf8(&self.buf[e + end.len()..close])
                        .ok()
                        .and_then(|s| s.trim().parse().ok())
                        .unwrap_or(-1);
                    let out = self.buf[b + begin.len()..e].to_vec();
                    self.buf.drain(..close + 3);
                    return Ok((rc, out));
                }
            }
            if Instant::now() >= until {
                if find(&self.buf, begin.as_bytes()).is_none() {
                    bail!(
                        "`{cmd}` did not start in the VM within {} s: its console loop never echoed the command's id (is the VM still running? its kernel log is the console file beside the socket)",
                        wait.as_secs()
                    );
                }
                bail!("`{cmd}` did not finish in the VM within {} s", wait.as_secs());
            }
            self.fill(until)?;
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpio_archive_lists_directories_before_their_files_and_ends_with_the_trailer() {
        let mut c = Cpio::new();
        c.file("lib/modules/x.ko", 0o644, b"abc");
        let out = c.finish();
        let text = String::from_utf8_lossy(&out);
        let (lib, mods, file) = (
            text.find("lib\0").unwrap(),
            text.find("lib/modules\0").unwrap(),
            text.find("lib/modules/x.ko\0").unwrap(),
        );
        assert!(lib < mods && mods < file);
        assert!(text.ends_with("TRAILER!!!\0\0\0\0") || text.contains("TRAILER!!!"));
        assert_eq!(out.len() % 4, 0);
        assert!(text.starts_with("070701"));
    }

    #[test]
    fn kernel_versions_sort_by_their_numbers() {
        assert!(version_key("6.1.0-56-amd64") > version_key("6.1.0-9-amd64"));
    }
}
