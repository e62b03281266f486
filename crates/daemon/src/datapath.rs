//! The datapath thread: one epoll loop over every port's descriptor and a wake-up
//! eventfd for control jobs. Event-driven by default; `poll = true` spins on epoll with a
//! zero timeout instead (lower latency, one core busy).

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use sluice_switch::{PortConfig, PortId, Switch};
use sluice_sys::error::{Context, Failure};
use tracing::{info, warn};

use super::events::Hub;
use super::kernel::KernelSide;
use crate::error::Result;
use sluice_api::config::{PortKind, PortSpec};
use sluice_ports::Attachment;
use sluice_sys::epoll::{Epoll, Event, EventFd};

/// Why the loop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Stopped: everything the switch made is gone.
    Stop,
    /// Stopped to start again in place; the kernel datapath keeps forwarding, and its
    /// upcall TAP's descriptor (if any) is open for the next program image.
    Restart(Option<std::os::fd::RawFd>),
}

/// Work sent from the control thread, run on the datapath thread between batches.
pub type Job = Box<dyn FnOnce(&mut Datapath) + Send>;

const WAKE_TOKEN: u64 = u64::MAX;
const UPCALL_TOKEN: u64 = u64::MAX - 1;
/// The kernel datapath's reports of stations heard behind tunnels.
const HEARD_TOKEN: u64 = u64::MAX - 2;
/// Added to a port's id for its room doorbell (see `sluice_ports::Kind::Vhost`).
const ROOM_TOKEN: u64 = 1 << 32;

/// The datapath: the switch, its ports' descriptors, and the event loop.
pub struct Datapath {
    sw: Switch,
    epoll: Epoll,
    wake: Arc<EventFd>,
    jobs: Receiver<Job>,
    fds: HashMap<PortId, RawFd>,
    /// Room doorbells of the ports that have one: the write interest is watched there.
    rooms: HashMap<PortId, RawFd>,
    specs: HashMap<PortId, PortSpec>,
    poll: bool,
    nice: i32,
    started: Instant,
    started_unix_ns: u64,
    counters_reset: Instant,
    stop: bool,
    /// Stopping to start again in place: the kernel datapath is left forwarding.
    restart: bool,
    /// The kernel datapath, when the switch runs one.
    kernel: Option<KernelSide>,
    /// The MAC table's refusals when they were last logged, and when.
    full_logged: (u64, Option<Instant>),
    /// Security groups: connections refused for a full table, as last logged, and when.
    ct_full_logged: (u64, Option<Instant>),
    /// Where the switch's events go to subscribers.
    events: Arc<Hub>,
    /// EVPN: where local station changes go (the agent).
    evpn: Option<crate::evpn::Link>,
}

impl Datapath {
    /// A datapath for `sw` taking jobs from `jobs`.
    pub fn new(mut sw: Switch, jobs: Receiver<Job>, poll: bool, nice: i32) -> Result<Self> {
        sw.record_events(sluice_switch::events::DEFAULT_EVENT_QUEUE);
        let epoll = Epoll::new().context("epoll_create1")?;
        let wake = Arc::new(EventFd::new().context("eventfd")?);
        epoll.add(wake.as_raw_fd(), WAKE_TOKEN, true, false)?;
        Ok(Datapath {
            sw,
            epoll,
            wake,
            jobs,
            fds: HashMap::new(),
            rooms: HashMap::new(),
            specs: HashMap::new(),
            poll,
            nice,
            started: Instant::now(),
            started_unix_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
            counters_reset: Instant::now(),
            stop: false,
            restart: false,
            kernel: None,
            full_logged: (0, None),
            ct_full_logged: (0, None),
            events: Arc::new(Hub::default()),
            evpn: None,
        })
    }

    /// Where the switch's events are published, for subscribers.
    pub fn events(&self) -> Arc<Hub> {
        self.events.clone()
    }

    /// Hands the core's station events to the subscribers (and drops them when there are
    /// none), naming ports by the names they were attached with; and, with EVPN, the local
    /// stations' changes to the agent.
    fn drain_events(&mut self) {
        let Datapath { sw, events, specs, evpn, .. } = self;
        if !events.listened() && evpn.is_none() {
            sw.take_events(|_| ());
            return;
        }
        let mut taken = Vec::new();
        let lost = sw.take_events(|e| taken.push(e));
        if let Some(l) = evpn.as_ref() {
            if lost > 0 {
                l.resync.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            for e in &taken {
                evpn_change(sw, l, e);
            }
        }
        if !events.listened() {
            return;
        }
        let name = |id: PortId| specs.get(&id).map_or_else(|| format!("#{id}"), |s| s.name.clone());
        for e in taken {
            use sluice_api::proto::EventKind as K;
            use sluice_switch::StationChange as C;
            let (mac, vlan, port) = (e.mac.to_string(), e.vlan, name(e.port));
            events.publish(match e.change {
                C::Learned => K::StationLearned { mac, vlan, port, is_static: e.is_static },
                C::Moved { from } => K::StationMoved { mac, vlan, port, from: name(from) },
                C::Aged => K::StationAged { mac, vlan, port },
                C::Removed => K::StationRemoved { mac, vlan, port, is_static: e.is_static },
            });
        }
        if lost > 0 {
            events.lost(lost);
        }
    }

    /// EVPN: links the agent, which hears of local stations from now on.
    pub fn set_evpn(&mut self, link: crate::evpn::Link) {
        self.evpn = Some(link);
    }

    /// EVPN: the local stations the agent announces, as `(vni, mac, configured)`: every
    /// station behind a port other than EVPN tunnel `port`, in a VLAN the tunnel carries.
    pub fn evpn_local_stations(&self, port: PortId) -> Vec<(u32, sluice_wire::MacAddr, bool)> {
        self.sw
            .fib()
            .entries()
            .into_iter()
            .filter(|(_, _, e)| e.port != port && !e.remote)
            .filter_map(|(vlan, mac, e)| self.sw.evpn_vni_of(port, vlan).map(|vni| (vni, mac, e.is_static)))
            .collect()
    }

    /// EVPN: the addresses local stations' ARP messages bound to them, as `(vni, mac,
    /// ip)`, in the VLANs EVPN tunnel `port` carries.
    pub fn evpn_local_bindings(&mut self, port: PortId) -> Vec<(u32, sluice_wire::MacAddr, std::net::IpAddr)> {
        let bound = self.sw.local_bindings();
        bound
            .into_iter()
            .filter_map(|(vlan, ip, mac)| self.sw.evpn_vni_of(port, vlan).map(|vni| (vni, mac, ip)))
            .collect()
    }

    /// When the daemon started, as Unix time in nanoseconds.
    pub fn started_unix_ns(&self) -> u64 {
        self.started_unix_ns
    }

    /// The instant the loop's clock counts from.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Hands forwarding between kernel ports to the kernel datapath `k`: from now on the
    /// core reports what the kernel must follow, and the frames it hands up are read here.
    pub fn enable_kernel(&mut self, mut k: KernelSide) -> Result<()> {
        self.epoll.add(k.upcall_fd(), UPCALL_TOKEN, true, false).context("watching the upcall TAP")?;
        self.epoll
            .add(k.heard_fd(), HEARD_TOKEN, true, false)
            .context("watching the kernel datapath's reports of stations heard behind tunnels")?;
        if let Some(t) = k.take_tracker() {
            self.sw.set_kernel_tracker(Some(Box::new(t)));
        }
        self.sw.follow_fastpath();
        self.kernel = Some(k);
        Ok(())
    }

    /// Security groups: the hits the kernel datapath counted, credited to their rules now.
    pub fn credit_kernel_hits(&mut self) {
        if let Some(k) = self.kernel.as_mut() {
            k.credit_hits(&mut self.sw);
        }
    }

    /// The kernel datapath, if the switch runs one.
    pub fn kernel(&self) -> Option<&KernelSide> {
        self.kernel.as_ref()
    }

    /// The eventfd that wakes this loop.
    pub fn waker(&self) -> Arc<EventFd> {
        self.wake.clone()
    }

    /// Writes the core's changes into the kernel datapath's maps now (a capture's port
    /// must go through the core from its first frame).
    pub fn sync_kernel(&mut self) {
        if let Some(k) = self.kernel.as_mut() {
            k.sync(&mut self.sw);
        }
    }

    /// The switch.
    pub fn switch(&self) -> &Switch {
        &self.sw
    }

    /// The switch, for changes.
    pub fn switch_mut(&mut self) -> &mut Switch {
        &mut self.sw
    }

    /// The description a port was attached with.
    pub fn spec(&self, id: PortId) -> Option<&PortSpec> {
        self.specs.get(&id)
    }

    /// Whether the loop busy-polls.
    pub fn polling(&self) -> bool {
        self.poll
    }

    /// Seconds since start.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Seconds since the counters were reset.
    pub fn counters_age(&self) -> Duration {
        self.counters_reset.elapsed()
    }

    /// Zeroes counters.
    pub fn reset_counters(&mut self) {
        self.sw.reset_counters();
        if let Some(k) = self.kernel.as_mut() {
            k.reset_counters();
        }
        self.counters_reset = Instant::now();
    }

    /// Ends the loop after the current job.
    pub fn request_stop(&mut self) {
        self.stop = true;
    }

    /// Ends the loop after the current job, for a restart in place.
    pub fn request_restart(&mut self) {
        self.stop = true;
        self.restart = true;
    }

    /// After the configured ports are attached again: ends the takeover of what an
    /// earlier run left in the kernel, if there was any.
    pub fn finish_takeover(&mut self) {
        let now = self.now_ms();
        if let Some(k) = self.kernel.as_mut() {
            k.finish_takeover(&mut self.sw, now);
            k.sync(&mut self.sw);
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// `sluice port set`: changes port `name`'s rate limits, storm control and link-local
    /// forwarding as `set` says, checked as a new port's would be; answers its new
    /// description.
    pub fn set_port(&mut self, name: &str, set: &sluice_api::proto::PortSettings) -> Result<PortSpec> {
        let id = self.sw.port_id(name).ok_or_else(|| crate::error::Error::NoPort(name.to_string()))?;
        let mut spec = self.specs.get(&id).cloned().ok_or_else(|| crate::error::Error::NoPort(name.to_string()))?;
        set.apply(&mut spec);
        let policy = spec.policy().map_err(sluice_api::Error::Port)?;
        if policy.rate.rate_out > 0 && self.kernel.is_some() && !shapeable(spec.kind) {
            return Err(sluice_api::Error::Port(format!(
                "port {name:?}: rate_out is not built for an uplink or a tunnel on the kernel datapath (the kernel sends to it with no shaper); this port would not be shaped — leave rate_out out, or run the switch on the user-space datapath (rate_in works on every port)"
            ))
            .into());
        }
        self.sw.set_port_limits(name, &policy)?;
        if let Some(k) = self.kernel.as_mut() {
            k.sync(&mut self.sw);
        }
        self.apply_interest();
        info!(port = %name, rate_in = policy.rate.rate_in, rate_out = policy.rate.rate_out, "port settings changed");
        self.specs.insert(id, spec.clone());
        Ok(spec)
    }

    /// Attaches a port and starts watching it.
    pub fn attach(&mut self, spec: PortSpec, a: Attachment) -> Result<PortId> {
        let vlan = spec.validate().map_err(sluice_api::Error::Port)?;
        let policy = spec.policy().map_err(sluice_api::Error::Port)?;
        if policy.rate.rate_out > 0 && self.kernel.is_some() && !shapeable(spec.kind) {
            return Err(sluice_api::Error::Port(format!(
                "port {:?}: rate_out is not built for an uplink or a tunnel on the kernel datapath (the kernel sends to it with no shaper); this port would not be shaped — leave rate_out out, or run the switch on the user-space datapath (rate_in works on every port)",
                spec.name
            ))
            .into());
        }
        let (fd, room, mtu) = (a.fd, a.room_fd(), a.mtu());
        let tunnel = match a.kind {
            sluice_ports::Kind::Tunnel { kernel, .. } => kernel,
            _ => None,
        };
        let id =
            self.sw.add_port(PortConfig { name: spec.name.clone(), vlan, mtu: spec.mtu.or(mtu), policy }, a.port)?;
        let interest = self.sw.interest(id);
        let watched = match room {
            None => self.epoll.add(fd, u64::from(id), interest.read, interest.write),
            Some(room) => self.epoll.add(fd, u64::from(id), interest.read, false).and_then(|()| {
                self.epoll
                    .add(room, ROOM_TOKEN + u64::from(id), interest.write, false)
                    .inspect_err(|_| drop(self.epoll.delete(fd)))
            }),
        };
        if let Err(e) = watched {
            let _ = self.sw.remove_port(&spec.name);
            return Err(Failure::new("watching the port's descriptor", e).into());
        }
        self.fds.insert(id, fd);
        if let Some(room) = room {
            self.rooms.insert(id, room);
        }
        if let Some(k) = self.kernel.as_mut() {
            // The port's rules in the maps first (a tunnel's settings before them), then the
            // program on its interface.
            if let Some(t) = &tunnel
                && let Err(e) = k.add_tunnel(id, t)
            {
                let _ = self.epoll.delete(fd);
                self.fds.remove(&id);
                if let Some(room) = self.rooms.remove(&id) {
                    let _ = self.epoll.delete(room);
                }
                let _ = self.sw.remove_port(&spec.name);
                k.sync(&mut self.sw);
                return Err(e);
            }
            k.sync(&mut self.sw);
            let ifnames: Vec<String> = match spec.kind {
                PortKind::Veth => vec![spec.name.clone()],
                PortKind::Uplink => std::iter::once(spec.name.clone()).chain(spec.backups.iter().cloned()).collect(),
                PortKind::Vxlan => tunnel.iter().map(|t| t.device.clone()).collect(),
                PortKind::Tap | PortKind::Stream | PortKind::VhostUser => vec![],
            };
            if !ifnames.is_empty()
                && let Err(e) = k.attach(id, &ifnames, spec.kind == PortKind::Veth)
            {
                k.detach(id);
                let _ = self.epoll.delete(fd);
                self.fds.remove(&id);
                let _ = self.sw.remove_port(&spec.name);
                k.sync(&mut self.sw);
                return Err(e);
            }
        }
        self.events
            .publish(sluice_api::proto::EventKind::PortUp { port: spec.name.clone(), reason: "attached".into() });
        info!(port = %spec.name, kind = ?spec.kind, netns = spec.netns.as_deref().unwrap_or("-"), vlan = %self.sw.port_info(id).map(|p| p.vlan.to_string()).unwrap_or_default(), offload = spec.offload, "port added");
        self.specs.insert(id, spec);
        Ok(id)
    }

    /// Detaches a port; a TAP goes away when its descriptor closes, an uplink's interface
    /// stays (only our socket on it closes).
    pub fn detach(&mut self, name: &str) -> Result<()> {
        // What the kernel counted for it joins the departed totals, as the core's does.
        let mut kernel_part = None;
        if let (Some(k), Some(id)) = (self.kernel.as_mut(), self.sw.port_id(name)) {
            kernel_part = self.sw.port_info(id).and_then(|p| k.kernel_part(id, p.counters));
            k.detach(id);
        }
        let (id, port) = self.sw.remove_port(name)?;
        // (The stations it forgets are told while its name is known.)
        self.drain_events();
        self.events.publish(sluice_api::proto::EventKind::PortDown { port: name.into(), reason: "detached".into() });
        if let Some(c) = kernel_part {
            self.sw.add_departed(&c);
        }
        if let Some(k) = self.kernel.as_mut() {
            k.sync(&mut self.sw);
        }
        if let Some(fd) = self.fds.remove(&id) {
            let _ = self.epoll.delete(fd);
        }
        if let Some(fd) = self.rooms.remove(&id) {
            let _ = self.epoll.delete(fd);
        }
        self.specs.remove(&id);
        drop(port);
        info!(port = %name, "port deleted");
        Ok(())
    }

    /// Runs until a stop is requested; says whether it stopped for a restart.
    /// Says so when the MAC table refused stations since it last said so — at most once a
    /// minute, with how many.
    fn log_full_table(&mut self) {
        let refused = self.sw.fib().full_refusals;
        let (logged, at) = self.full_logged;
        if refused <= logged || at.is_some_and(|t| t.elapsed() < Duration::from_secs(60)) {
            if refused < logged {
                self.full_logged.0 = refused; // (counters were reset)
            }
            return;
        }
        warn!(
            "the MAC table is full ({} entries): {} frame(s) came from stations it could not learn since the \
             last report; frames to those stations are flooded — raise mac_table_size in the switch's config",
            self.sw.config().fib_max,
            refused - logged
        );
        self.full_logged = (refused, Some(Instant::now()));
    }

    /// Says so when the connection table refused new connections since it last said so
    /// (dropped `ct_full`) — at most once a minute, with how many.
    fn log_full_conntrack(&mut self) {
        let c = self.sw.ct_stats();
        let (logged, at) = self.ct_full_logged;
        if c.full <= logged || at.is_some_and(|t| t.elapsed() < Duration::from_secs(60)) {
            return;
        }
        warn!(
            "the connection table is full ({} connections): {} new connection(s) an allow-related rule passed \
             were dropped (ct_full) since the last report — raise conntrack_max in the switch's config",
            c.max,
            c.full - logged
        );
        self.ct_full_logged = (c.full, Some(Instant::now()));
    }

    /// Logs the pause watchdog's changes: an output declared stuck in a class, and its
    /// recovery.
    fn log_watchdog(&mut self) {
        let mut events = Vec::new();
        self.sw.take_watchdog_events(|e| events.push(e));
        for e in events {
            let port = self.sw.port_name(e.port).unwrap_or("?").to_string();
            if e.stuck {
                warn!(
                    port = %port,
                    class = %e.class,
                    "pause watchdog: the port took nothing for {} ms with frames waiting; its class drops toward it (cause watchdog) until it takes frames again",
                    self.sw.config().watchdog_ms
                );
            } else {
                info!(port = %port, class = %e.class, "pause watchdog: the port takes frames again");
            }
        }
    }

    pub fn run(mut self) -> Result<Exit> {
        if self.nice != 0
            && let Err(e) = sluice_sys::set_thread_nice(self.nice)
        {
            warn!("cannot set the datapath's niceness to {} ({e}); it gets a fair share of the CPU", self.nice);
        }
        let mut buf = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        let mut events: Vec<Event> = Vec::with_capacity(256);
        let mut next_expire = Instant::now() + Duration::from_secs(1);
        // Ports whose last batch was full: read again on the next turn whatever epoll says
        // (a tunnel holds the rest of a run of datagrams it read at once, which leaves its
        // socket unreadable).
        let mut again: Vec<PortId> = Vec::new();
        while !self.stop {
            // Once a second for aging, sooner when the pause watchdog has a deadline.
            let watchdog = self.sw.next_deadline_ms().map(|at| at.saturating_sub(self.now_ms()));
            let timeout =
                if self.poll || !again.is_empty() { 0 } else { watchdog.map_or(1000, |w| w.clamp(1, 1000) as i32) };
            self.epoll.wait(&mut buf, timeout, &mut events)?;
            let now = self.now_ms();
            for id in std::mem::take(&mut again) {
                if self.sw.on_readable(id, now) {
                    again.push(id);
                }
            }
            for ev in &events {
                if ev.token == WAKE_TOKEN {
                    self.wake.drain();
                    while let Ok(job) = self.jobs.try_recv() {
                        job(&mut self);
                    }
                    continue;
                }
                if ev.token == UPCALL_TOKEN {
                    let limit = self.sw.config().batch * 4;
                    if let Some(k) = self.kernel.as_mut() {
                        k.read_upcalls(&mut self.sw, now, limit);
                    }
                    continue;
                }
                if ev.token == HEARD_TOKEN {
                    if let Some(k) = self.kernel.as_mut() {
                        k.read_heard(&mut self.sw);
                    }
                    continue;
                }
                if ev.token >= ROOM_TOKEN {
                    // The doorbell is read by the port itself when it finds no room.
                    self.sw.on_writable((ev.token - ROOM_TOKEN) as PortId);
                    continue;
                }
                let id = ev.token as PortId;
                if ev.writable {
                    self.sw.on_writable(id);
                }
                if ev.readable && self.sw.on_readable(id, now) && !again.contains(&id) {
                    again.push(id);
                }
            }
            self.apply_interest();
            if self.sw.next_deadline_ms().is_some_and(|at| at <= self.now_ms()) {
                self.sw.watchdog(self.now_ms());
                self.apply_interest();
            }
            self.log_watchdog();
            if Instant::now() >= next_expire {
                if let Some(k) = self.kernel.as_mut() {
                    k.check_interfaces(&mut self.sw);
                    k.refresh_ages(&mut self.sw);
                    k.credit_hits(&mut self.sw);
                }
                self.sw.expire(self.now_ms());
                let events = &self.events;
                self.sw.tick_ports(|port, what| {
                    warn!(port = %port, "uplink failover: {what}");
                    events
                        .publish(sluice_api::proto::EventKind::UplinkFailover { port: port.into(), what: what.into() });
                });
                self.log_full_table();
                self.log_full_conntrack();
                next_expire = Instant::now() + Duration::from_secs(1);
            }
            if let Some(k) = self.kernel.as_mut() {
                k.sync(&mut self.sw);
            }
            if self.sw.has_events() {
                self.drain_events();
            }
        }
        // Leaving to start again in place: the TAPs stay for the new image (see KEEP_TAPS).
        sluice_ports::tap::KEEP_TAPS.store(self.restart, std::sync::atomic::Ordering::Release);
        let mut upcall = None;
        if let Some(k) = self.kernel.take() {
            if self.restart {
                upcall = k.leave();
            } else {
                k.stop();
            }
        }
        Ok(if self.restart { Exit::Restart(upcall) } else { Exit::Stop })
    }

    fn apply_interest(&mut self) {
        let Datapath { sw, epoll, fds, rooms, .. } = self;
        let mut failed = Vec::new();
        sw.take_interest_changes(|id, i| {
            match (fds.get(&id), rooms.get(&id)) {
                (Some(&fd), None) => drop(epoll.modify(fd, u64::from(id), i.read, i.write)),
                (Some(&fd), Some(&room)) => {
                    let _ = epoll.modify(fd, u64::from(id), i.read, false);
                    let _ = epoll.modify(room, ROOM_TOKEN + u64::from(id), i.write, false);
                }
                _ => {}
            }
            if !i.read && !i.write {
                failed.push(id);
            }
        });
        for id in failed {
            if let Some(p) = self.sw.port_info(id)
                && let Some(why) = &p.failed
            {
                warn!(port = %p.name, "port stopped: {why}; delete it with `sluice port del {}`", p.name);
                self.events
                    .publish(sluice_api::proto::EventKind::PortDown { port: p.name.clone(), reason: why.clone() });
            }
        }
    }
}

/// Whether `rate_out` shapes a port of `kind` on the kernel datapath: a veth guest's by the
/// qdisc on its switch-side end, a TAP or a socket's by the switch's core, which sends to
/// them; the kernel sends to an uplink or a tunnel itself, with no shaper.
/// What a station event means to the EVPN agent: a station behind a local port is here
/// (learned, moved here, configured) or gone; one that moved to the tunnel left.
fn evpn_change(sw: &Switch, l: &crate::evpn::Link, e: &sluice_switch::StationEvent) {
    use crate::evpn::Local;
    use sluice_switch::StationChange as C;
    let local_port = e.port != l.port;
    let Some(vni) = sw.evpn_vni_of(l.port, e.vlan) else { return };
    let (vni, mac) = (vni, e.mac);
    match e.change {
        C::Learned | C::Moved { .. } if local_port => l.tell(Local::Up { vni, mac, sticky: e.is_static }),
        C::Moved { .. } => l.tell(Local::Down { vni, mac }),
        C::Aged | C::Removed if local_port => l.tell(Local::Down { vni, mac }),
        _ => {}
    }
}

fn shapeable(kind: PortKind) -> bool {
    !matches!(kind, PortKind::Uplink | PortKind::Vxlan)
}
