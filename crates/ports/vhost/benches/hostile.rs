//! What each abuse of the rings costs the switch, without a VM: `cargo bench -p
//! sluice-vhost --bench hostile` (as root or not; it makes nothing outside its own
//! temporary directory).
//!
//! A switch (`sluice_switch::Switch`, the daemon's core) with two vhost-user ports, driven
//! by an epoll loop on one thread as the daemon's datapath drives it (read and write
//! interest, batches, room doorbells); on one port the feeder of the study's `rings`
//! condition sends the other guest up to 20,000 frames of 200 bytes a second; on the other
//! a guest plays, for the whole window, either a well-behaved receiver (`vm-feed`, the
//! control) or one abuse of [`sluice_vhost::abuse`] in its 200 ms phases with the rings
//! reset after each (as the study's hostile guest does), or all of them in turn (`rings`).
//!
//! Printed per scenario: the CPU the switch spent a second — its datapath thread, and its
//! vhost-user serving threads (the protocol's messages: the resets) — and the guests'
//! own; frames the feeder sent and the switch wrote into the guest, and what the switch
//! dropped. Compare the rows of one run: the machine is shared.
//!
//! `SLUICE_BENCH_SECS` sets each scenario's window (default 3 s); `SLUICE_BENCH_ONLY` a
//! comma-separated list of scenarios to run.

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sluice_switch::{PortConfig, PortId, Switch, SwitchConfig, VlanMode};
use sluice_vhost::abuse::{self, Abuse, FEED_FRAME_LEN, FEED_PER_S, PHASE};
use sluice_vhost::driver::Driver;
use sluice_vhost::{Role, open};

const ROOM: u64 = 1 << 32;
const FEEDER: [u8; 6] = [0x02, 0x5E, 0, 0, 0, 2];
const GUEST: [u8; 6] = [0x02, 0x5E, 0, 0, 0, 1];

/// What the guest on the second port does.
#[derive(Clone, Copy)]
enum Play {
    /// Receives its frames as a virtio-net driver does.
    Receive,
    /// One abuse, phase after phase.
    One(Abuse),
    /// Every abuse in turn, as the study's `rings`.
    All,
}

impl Play {
    fn name(self) -> &'static str {
        match self {
            Play::Receive => "vm-feed",
            Play::One(a) => a.name(),
            Play::All => "rings",
        }
    }
}

/// CPU seconds of the calling thread (`CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, valid for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// CPU seconds of the whole process (user and system).
fn process_cpu() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, valid for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// A fresh directory of this process's own (`mkdtemp`).
fn mkdtemp(prefix: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let mut t = std::env::temp_dir().join(format!("{prefix}.XXXXXX")).into_os_string().into_vec();
    t.push(0);
    // SAFETY: `t` is a NUL-terminated template that mkdtemp rewrites in place.
    let p = unsafe { libc::mkdtemp(t.as_mut_ptr().cast()) };
    assert!(!p.is_null(), "mkdtemp: {}", std::io::Error::last_os_error());
    t.pop();
    PathBuf::from(std::ffi::OsString::from_vec(t))
}

fn epoll_ctl(ep: RawFd, op: i32, fd: RawFd, token: u64, on: bool) {
    let mut ev = libc::epoll_event { events: if on { libc::EPOLLIN as u32 } else { 0 }, u64: token };
    // SAFETY: `ev` is a valid epoll_event for the duration of the call.
    let r = unsafe { libc::epoll_ctl(ep, op, fd, &mut ev) };
    assert!(r == 0, "epoll_ctl: {}", std::io::Error::last_os_error());
}

/// The datapath: the daemon's loop over the two ports until `stop`; returns the thread's
/// CPU seconds and the wall seconds it ran, and the switch.
fn datapath(mut sw: Switch, ports: Vec<(PortId, RawFd, RawFd)>, stop: Arc<AtomicBool>) -> (f64, f64, Switch) {
    // SAFETY: plain syscall; the descriptor is closed below.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(ep >= 0, "epoll_create1: {}", std::io::Error::last_os_error());
    for &(id, frames, room) in &ports {
        let i = sw.interest(id);
        epoll_ctl(ep, libc::EPOLL_CTL_ADD, frames, u64::from(id), i.read);
        epoll_ctl(ep, libc::EPOLL_CTL_ADD, room, ROOM + u64::from(id), i.write);
    }
    let started = Instant::now();
    let cpu0 = thread_cpu();
    let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 16];
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: `evs` is valid for writes of its length.
        let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), evs.len() as i32, 10) };
        let now = started.elapsed().as_millis() as u64;
        for ev in evs.iter().take(n.max(0) as usize) {
            let token = ev.u64;
            if token >= ROOM {
                sw.on_writable((token - ROOM) as PortId);
            } else {
                sw.on_readable(token as PortId, now);
            }
        }
        sw.take_interest_changes(|id, i| {
            if let Some(&(_, frames, room)) = ports.iter().find(|p| p.0 == id) {
                epoll_ctl(ep, libc::EPOLL_CTL_MOD, frames, u64::from(id), i.read);
                epoll_ctl(ep, libc::EPOLL_CTL_MOD, room, ROOM + u64::from(id), i.write);
            }
        });
    }
    let cpu = thread_cpu() - cpu0;
    // SAFETY: `ep` is ours and closed once.
    unsafe { libc::close(ep) };
    (cpu, started.elapsed().as_secs_f64(), sw)
}

/// A guest thread's result: (CPU seconds, counts).
type Guest = JoinHandle<(f64, Vec<(&'static str, u64)>)>;

fn connect(sock: &Path) -> Driver {
    Driver::connect(sock, u64::MAX, Duration::from_secs(5)).expect("connecting a guest")
}

fn add(counts: &mut Vec<(&'static str, u64)>, what: &'static str, n: u64) {
    match counts.iter_mut().find(|c| c.0 == what) {
        Some(c) => c.1 += n,
        None => counts.push((what, n)),
    }
}

/// The study's feeder: FEED_PER_S frames a second to GUEST, in 10 ms ticks.
fn feeder(sock: PathBuf, stop: Arc<AtomicBool>) -> Guest {
    std::thread::spawn(move || {
        let mut d = connect(&sock);
        d.fill_rx().expect("posting the feeder's buffers");
        let f = abuse::frame(GUEST, FEEDER, FEED_FRAME_LEN);
        let tick = Duration::from_millis(10);
        let cpu0 = thread_cpu();
        let mut counts = Vec::new();
        let mut next = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let (sent, _) = abuse::feed(&mut d, &f, FEED_PER_S / 100, next + tick).expect("feeding");
            add(&mut counts, "fed", sent);
            next += tick;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            } else {
                next = now;
            }
        }
        (thread_cpu() - cpu0, counts)
    })
}

/// The guest on the second port.
fn guest(sock: PathBuf, play: Play, stop: Arc<AtomicBool>) -> Guest {
    std::thread::spawn(move || {
        let mut d = connect(&sock);
        let cpu0 = thread_cpu();
        let mut counts = Vec::new();
        let mut k = 0usize;
        match play {
            Play::Receive => {
                d.fill_rx().expect("posting buffers");
                let mut said = Instant::now() - PHASE;
                while !stop.load(Ordering::Relaxed) {
                    if said.elapsed() >= PHASE {
                        abuse::hello(&mut d, GUEST, FEEDER).expect("saying who it is");
                        said = Instant::now();
                    }
                    let got = abuse::take(&mut d).expect("receiving");
                    add(&mut counts, "received", got);
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            Play::One(_) | Play::All => {
                while !stop.load(Ordering::Relaxed) {
                    let a = match play {
                        Play::One(a) => a,
                        _ => Abuse::ALL[k % Abuse::ALL.len()],
                    };
                    k += 1;
                    let halt = || stop.load(Ordering::Relaxed);
                    abuse::play(&mut d, a, GUEST, FEEDER, Instant::now() + PHASE, &halt, &mut |w, n| {
                        add(&mut counts, w, n)
                    })
                    .expect("the port ended the hostile guest's connection");
                }
            }
        }
        (thread_cpu() - cpu0, counts)
    })
}

/// One scenario: a fresh switch, its two ports and guests, for `secs`.
fn scenario(play: Play, secs: f64) -> String {
    let dir = mkdtemp("sluice-bench-hostile");
    let (fsock, gsock) = (dir.join("feeder.sock"), dir.join("guest.sock"));
    let mut sw = Switch::new(SwitchConfig::default()).expect("a switch");
    let mut ports = Vec::new();
    let mut ready = Vec::new();
    for (name, sock) in [("feeder", &fsock), ("guest", &gsock)] {
        let p = open(name, sock, Role::Server, true).expect("opening a vhost-user port");
        let (frames, room) = (p.frames_fd(), p.room_fd());
        ready.push(p.shared().clone());
        let cfg = PortConfig { name: name.into(), vlan: VlanMode::Access(1), mtu: None, policy: Default::default() };
        let id = sw.add_port(cfg, Box::new(p)).expect("adding the port");
        ports.push((id, frames, room));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let dp = {
        let stop = stop.clone();
        std::thread::spawn(move || datapath(sw, ports, stop))
    };
    let guests_stop = Arc::new(AtomicBool::new(false));
    let g = guest(gsock, play, guests_stop.clone());
    let f = feeder(fsock, guests_stop.clone());
    let until = Instant::now() + Duration::from_secs(5);
    while !ready.iter().all(|s| s.connected()) {
        assert!(Instant::now() < until, "the guests did not connect");
        std::thread::sleep(Duration::from_millis(5));
    }
    let cpu0 = process_cpu();
    let wall0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    guests_stop.store(true, Ordering::Relaxed);
    let (gcpu, gcounts) = g.join().expect("the guest's thread");
    let (fcpu, fcounts) = f.join().expect("the feeder's thread");
    stop.store(true, Ordering::Relaxed);
    let (dcpu, dwall, sw) = dp.join().expect("the datapath's thread");
    let (all, wall) = (process_cpu() - cpu0, wall0.elapsed().as_secs_f64());
    let serving = (all - dcpu - gcpu - fcpu).max(0.0);
    let info = |name: &str| sw.port_info(sw.port_id(name).expect("the port")).expect("its info");
    let gi = info("guest");
    let fed = fcounts.iter().find(|c| c.0 == "fed").map_or(0, |c| c.1);
    let received = gcounts.iter().find(|c| c.0 == "received").map_or(0, |c| c.1);
    let row = format!(
        "| {} | {:.1} | {:.1} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
        play.name(),
        1e3 * dcpu / dwall,
        1e3 * serving / wall,
        1e3 * (gcpu + fcpu) / wall,
        fed as f64 / wall,
        gi.counters.tx_frames as f64 / wall,
        gi.counters.tx_drops.total() as f64 / wall,
        gi.counters.rx_drops.total() as f64 / wall,
        received as f64 / wall,
    );
    drop(sw);
    let _ = std::fs::remove_dir_all(&dir);
    row
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // (cargo test --benches lists; nothing to list)
    }
    let secs: f64 = std::env::var("SLUICE_BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let only = std::env::var("SLUICE_BENCH_ONLY").ok();
    let plays = std::iter::once(Play::Receive).chain(Abuse::ALL.map(Play::One)).chain(std::iter::once(Play::All));
    println!(
        "| guest | switch datapath CPU ms/s | switch serving CPU ms/s | guests' CPU ms/s | fed frames/s | written into the guest /s | dropped toward it /s | refused from it /s | received by it /s |"
    );
    println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|");
    for p in plays {
        if only.as_deref().is_some_and(|o| !o.split(',').any(|n| n == p.name())) {
            continue;
        }
        println!("{}", scenario(p, secs));
    }
}
