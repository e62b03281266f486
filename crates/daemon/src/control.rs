//! The control server: reads JSON requests from the unix socket (JSON-RPC 2.0 or the line
//! protocol, told apart per line: docs/api.md), runs them on the datapath thread as jobs,
//! and writes the answers in the request's framing. Every refused request is logged with
//! its reason.
//!
//! Bounds (docs/architecture.md, "Servers and files"): a connection may wait
//! [`IDLE`] between requests, but a request must arrive whole within [`REQUEST_WITHIN`] of
//! its first byte, and its answer be taken within [`ANSWER_WITHIN`]; a job waits for the
//! datapath at most [`JOB_WAIT`], and the client is then told the datapath is busy.

use std::io::{BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Sender};
use std::time::Duration;

use sluice_sys::error::{Context, Report};
use sluice_wire::MacAddr;
use tracing::{debug, warn};

use super::datapath::{Datapath, Job};
use super::deadline::{Deadline, Paced, write_all_by};
use crate::error::{Error, Result};
use sluice_api::config::{PortKind, PortSpec, Settings};
use sluice_api::proto::*;
use sluice_ports::{self as ports, Attachment};
use sluice_sys::epoll::EventFd;
use sluice_sys::netns;

/// How long a job waits for the datapath to run it.
pub const JOB_WAIT: Duration = Duration::from_secs(10);

/// A handle for running jobs on the datapath thread.
#[derive(Clone)]
pub struct Jobs {
    tx: Sender<Job>,
    wake: Arc<EventFd>,
    wait: Duration,
}

impl Jobs {
    /// Wraps the job channel and the datapath's wake-up.
    pub fn new(tx: Sender<Job>, wake: Arc<EventFd>) -> Self {
        Jobs { tx, wake, wait: JOB_WAIT }
    }

    /// Runs `f` on the datapath and waits for its result, at most [`JOB_WAIT`]: then the
    /// answer is that the datapath is busy (the job still runs when the datapath gets to
    /// it).
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce(&mut Datapath) -> T + Send + 'static) -> Result<T> {
        let (rtx, rrx) = mpsc::sync_channel(1);
        self.tx
            .send(Box::new(move |dp: &mut Datapath| {
                let _ = rtx.send(f(dp));
            }))
            .map_err(|_| Error::Stopped)?;
        self.wake.notify();
        rrx.recv_timeout(self.wait).map_err(|e| match e {
            mpsc::RecvTimeoutError::Timeout => Error::Busy { secs: self.wait.as_secs() },
            mpsc::RecvTimeoutError::Disconnected => Error::StoppedBeforeAnswering,
        })
    }

    /// Runs `f` on the datapath without waiting for it.
    pub fn post(&self, f: impl FnOnce(&mut Datapath) + Send + 'static) {
        if self.tx.send(Box::new(f)).is_ok() {
            self.wake.notify();
        }
    }

    /// Asks the datapath to stop.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Box::new(|dp: &mut Datapath| dp.request_stop()));
        self.wake.notify();
    }

    /// Asks the datapath to stop for a restart in place (the kernel datapath stays).
    pub fn restart(&self) {
        let _ = self.tx.send(Box::new(|dp: &mut Datapath| dp.request_restart()));
        self.wake.notify();
    }
}

/// Opens the device of port `spec` (in its namespace, if it names one), as its kind does; a
/// TAP is adopted when an earlier run left it with index `known_tap` (see `tun::open_tap`).
pub fn create_port(spec: &PortSpec, s: &Settings, known_tap: Option<u32>) -> Result<Attachment> {
    let (default_mtu, kernel) = (s.core.mtu, s.datapath == sluice_api::config::DatapathKind::Kernel);
    spec.validate().map_err(sluice_api::Error::Port)?;
    // (A veth port's namespace is entered only to make its pair: see `ports::veth`.)
    if let Some(ns) = &spec.netns
        && spec.kind != PortKind::Veth
        && !netns::exists(ns)
    {
        return Err(Error::Refused(format!(
            "network namespace {ns:?} does not exist (create it with `ip netns add {ns}`)"
        )));
    }
    let mtu = spec.mtu.unwrap_or(default_mtu);
    Ok(match spec.kind {
        PortKind::Tap => ports::tap::attach(spec, mtu, known_tap)?,
        PortKind::Veth => ports::veth::attach(spec, mtu)?,
        PortKind::Stream => ports::stream::attach(spec)?,
        PortKind::VhostUser => ports::vhost::attach(spec, &s.vhost_allow)?,
        PortKind::Vxlan => {
            // On the kernel datapath a vxlan device receives, and the program sends into it.
            let device = kernel.then(|| super::kernel::tunnel_device_name(&s.name, &spec.name));
            ports::vxlan::attach(spec, device.as_deref())?
        }
        PortKind::Uplink => ports::uplink::attach(spec, kernel)?,
    })
}

/// The control socket server.
pub struct Server {
    /// The switch's settings at start.
    pub settings: Settings,
    /// Jobs for the datapath.
    pub jobs: Jobs,
    /// VLAN grants as they are now (`None`: not enforced).
    pub grants: std::sync::Mutex<Option<sluice_api::config::Grants>>,
    /// Orders changes to the runtime state file.
    pub state_lock: std::sync::Mutex<()>,
    /// Monitor records, while they are written.
    pub monitor: std::sync::Mutex<Option<super::monitor::Monitor>>,
    /// The switch's gateway, when it has one.
    pub gateway: Option<std::sync::Arc<super::gateway::Gateway>>,
    /// The switch's EVPN agent, when it has one.
    pub evpn: Option<std::sync::Arc<super::evpn::Evpn>>,
}

/// Writes a refusal on a connection about to be closed (taken by the client by `due`).
fn refuse(s: &UnixStream, error: String, due: Deadline) {
    let r = Response { ok: false, error: Some(error), data: None };
    if let Ok(mut text) = serde_json::to_string(&r) {
        text.push('\n');
        let _ = write_all_by(s, text.as_bytes(), due);
    }
}

/// Bytes of copies a capture may keep waiting for its client (beyond them copies are lost,
/// counted).
const CAPTURE_BUDGET: usize = 8 << 20;

/// Control connections served at once; more are told to try again.
const MAX_CONNS: usize = 32;
/// How long a control connection may sit idle between requests.
const IDLE: Duration = Duration::from_secs(300);
/// A request must arrive whole within this time of its first byte.
pub const REQUEST_WITHIN: Duration = Duration::from_secs(10);
/// An answer must be taken whole within this time.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

impl Server {
    /// Serves connections until the process ends; each connection on its own thread, at
    /// most [`MAX_CONNS`] at once.
    pub fn serve(self: Arc<Self>, listener: UnixListener) {
        let me = self;
        let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut backoff = std::time::Duration::ZERO;
        for conn in listener.incoming() {
            match conn {
                Ok(stream) => {
                    backoff = std::time::Duration::ZERO;
                    if open.fetch_add(1, Ordering::AcqRel) >= MAX_CONNS {
                        open.fetch_sub(1, Ordering::AcqRel);
                        // (Never blocks this thread: a fresh socket takes a short answer at once.)
                        let _ = stream.set_nonblocking(true);
                        refuse(
                            &stream,
                            format!(
                                "the switch already serves {MAX_CONNS} control connections; try again when one ends"
                            ),
                            Deadline::after(ANSWER_WITHIN),
                        );
                        continue;
                    }
                    let (me, mine) = (me.clone(), open.clone());
                    let spawned = std::thread::Builder::new().name("control-conn".into()).spawn(move || {
                        me.handle(stream);
                        mine.fetch_sub(1, Ordering::AcqRel);
                    });
                    if spawned.is_err() {
                        open.fetch_sub(1, Ordering::AcqRel);
                    }
                }
                Err(e) => {
                    // (Out of descriptors, say: wait before trying again, up to a second, so a
                    // lasting fault neither spins nor floods the log.)
                    backoff =
                        (backoff * 2).clamp(std::time::Duration::from_millis(10), std::time::Duration::from_secs(1));
                    warn!("control socket accept failed: {e}; trying again in {} ms", backoff.as_millis());
                    std::thread::sleep(backoff);
                }
            }
        }
    }

    /// Serves one connection: a request line, its answer, and so on; a capture or a
    /// subscription takes the connection over.
    fn handle(&self, stream: UnixStream) {
        let out = match stream.try_clone() {
            Ok(s) => s,
            Err(_) => return,
        };
        // An idle connection is closed after a while; a request is at most MAX_REQUEST bytes
        // and arrives whole within REQUEST_WITHIN of its first byte.
        let mut reader = BufReader::new(Paced::new(stream, IDLE, REQUEST_WITHIN));
        loop {
            let resp = match read_request(&mut reader, MAX_REQUEST) {
                Incoming::End => {
                    if reader.get_ref().was_late() {
                        debug!("closing a control connection whose request came too slowly");
                        refuse(
                            &out,
                            format!(
                                "the request did not arrive whole within {} s of its first byte; closing the connection",
                                REQUEST_WITHIN.as_secs()
                            ),
                            Deadline::after(ANSWER_WITHIN),
                        );
                    }
                    return;
                }
                Incoming::TooLong => {
                    refuse(
                        &out,
                        format!("request longer than {} KiB; closing the connection", MAX_REQUEST >> 10),
                        Deadline::after(ANSWER_WITHIN),
                    );
                    return;
                }
                Incoming::Malformed(framing, why) => {
                    warn!("refused a request: {}", why.message);
                    (framing, Err(why))
                }
                Incoming::Request(framing, Request::Capture { port, direction, snaplen }) => {
                    // The connection is the capture's from here on.
                    let stream = reader.into_inner().into_inner();
                    if let Err(e) = self.capture(stream, out, &framing, &port, &direction, snaplen) {
                        debug!(port = %port, "capture ended: {}", Report(&e));
                    }
                    return;
                }
                Incoming::Request(framing @ Framing::Rpc(_), Request::Subscribe { kinds }) => {
                    // The connection is the subscription's from here on.
                    let stream = reader.into_inner().into_inner();
                    if let Err(e) = self.subscribe(stream, out, &framing, &kinds) {
                        debug!("subscription ended: {}", Report(&e));
                    }
                    return;
                }
                Incoming::Request(framing, Request::Subscribe { .. }) => (
                    framing,
                    Err(RpcError::new(
                        code::REFUSED,
                        "subscribe is answered in JSON-RPC only: send {\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"subscribe\"} (docs/api.md)",
                    )),
                ),
                Incoming::Request(framing, req) => {
                    debug!(?req, "control request");
                    let what = format!("{req:?}");
                    let hello = matches!(req, Request::Hello);
                    match self.execute(req) {
                        Ok(mut data) => {
                            // (A client of the line protocol checks for its own version; the
                            // switch's summary in the counters says the same to it.)
                            if framing == Framing::V1
                                && let Some(d) = data.as_mut()
                            {
                                if hello {
                                    d["protocol"] = PROTOCOL_V1.into();
                                } else if let Some(p) = d.get_mut("switch").and_then(|s| s.get_mut("protocol")) {
                                    *p = PROTOCOL_V1.into();
                                }
                            }
                            (framing, Ok(data))
                        }
                        Err(e) => {
                            let err = rpc_error(&e);
                            warn!(request = %what, "refused: {}", err.message);
                            (framing, Err(err))
                        }
                    }
                }
            };
            let (framing, resp) = resp;
            if let Some(text) = framing.answer(resp)
                && write_all_by(&out, text.as_bytes(), Deadline::after(ANSWER_WITHIN)).is_err()
            {
                return;
            }
            let pending = !reader.buffer().is_empty();
            reader.get_mut().next_request(pending);
        }
    }

    /// Serves a capture of `port` on a control connection: the answer, then records every
    /// 20 ms until the client closes the connection (or stops reading for 10 s), or the
    /// port goes away.
    fn capture(
        &self,
        stream: UnixStream,
        mut out: UnixStream,
        framing: &Framing,
        port: &str,
        dir: &str,
        snaplen: u32,
    ) -> Result<()> {
        let answer = |r| {
            if let Some(line) = framing.answer(r) {
                let _ = write_all_by(&out, line.as_bytes(), Deadline::after(ANSWER_WITHIN));
            }
        };
        use sluice_switch::capture::Direction;
        let d = match dir {
            "in" => Direction::In,
            "out" => Direction::Out,
            "both" => Direction::Both,
            other => {
                answer(Err(RpcError::new(
                    code::INVALID_PARAMS,
                    format!("capture direction {other:?}: use in, out or both"),
                )));
                return Ok(());
            }
        };
        let snaplen = (snaplen as usize).clamp(64, 262_144);
        let name = port.to_string();
        let started = self.jobs.run(move |dp| {
            let r = dp.switch_mut().capture_start(&name, d, snaplen, CAPTURE_BUDGET, wall_clock_ns);
            // (On the kernel datapath the port now goes through the core.)
            dp.sync_kernel();
            r
        })?;
        let id = match started {
            Ok(id) => id,
            Err(e) => {
                answer(Err(RpcError::new(code::NO_SUCH_PORT, format!("{e}; `sluice port list` shows the ports"))));
                return Ok(());
            }
        };
        tracing::info!(port = %port, direction = dir, "capture started");
        let result = (|| -> Result<()> {
            let ok = Ok(Some(serde_json::json!({"port": port, "snaplen": snaplen})));
            if let Some(line) = framing.answer(ok) {
                write_all_by(&out, line.as_bytes(), Deadline::after(ANSWER_WITHIN))?;
            }
            // (From here a stream of records: each write may wait 10 s for the client.)
            out.set_write_timeout(Some(std::time::Duration::from_secs(10)))?;
            stream.set_read_timeout(Some(std::time::Duration::from_millis(20)))?;
            let mut probe = [0u8; 64];
            let mut lost_said = 0;
            loop {
                // The client says nothing after its request: a read that returns is its end
                // (Ctrl-C: it closes its side and reads what was copied until then).
                let closing = match std::io::Read::read(&mut &stream, &mut probe) {
                    Ok(_) => true,
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                        false
                    }
                    Err(e) => return Err(e.into()),
                };
                let (frames, state) = self.jobs.run(move |dp| {
                    let mut v = Vec::new();
                    let r = dp.switch_mut().capture_take(id, |c| v.push(c));
                    (v, r)
                })?;
                let now = wall_clock_ns();
                let mut buf = Vec::new();
                let mut record = |kind: u8, ts: u64, len: u32, data: &[u8]| {
                    buf.push(kind);
                    buf.extend_from_slice(&ts.to_be_bytes());
                    buf.extend_from_slice(&len.to_be_bytes());
                    buf.extend_from_slice(&(data.len() as u32).to_be_bytes());
                    buf.extend_from_slice(data);
                };
                for c in &frames {
                    record(u8::from(c.out), c.ts_ns, c.len, &c.data);
                }
                let (lost, ended) = state.unwrap_or((0, true));
                if lost != lost_said {
                    record(2, now, 0, &lost.to_be_bytes());
                    lost_said = lost;
                }
                if ended {
                    record(3, now, 0, &[]);
                }
                if !buf.is_empty() {
                    out.write_all(&buf)?;
                }
                if ended || closing {
                    return Ok(());
                }
            }
        })();
        let _ = self.jobs.run(move |dp| {
            dp.switch_mut().capture_stop(id);
            dp.sync_kernel();
        });
        tracing::info!(port = %port, "capture ended");
        result
    }

    /// Serves a subscription on a control connection: the answer, then each event as a
    /// notification line until the client closes the connection, or stops reading for
    /// [`ANSWER_WITHIN`] (then it is disconnected; the datapath never waits for it).
    fn subscribe(&self, stream: UnixStream, mut out: UnixStream, framing: &Framing, kinds: &[String]) -> Result<()> {
        let answer = |r| -> Result<()> {
            if let Some(line) = framing.answer(r) {
                write_all_by(&out, line.as_bytes(), Deadline::after(ANSWER_WITHIN))?;
            }
            Ok(())
        };
        let mask = match super::events::kind_mask(kinds) {
            Ok(m) => m,
            Err(k) => {
                let why = format!("no event kind {k:?}; the kinds are {}", EVENT_KINDS.join(", "));
                return answer(Err(RpcError::new(code::INVALID_PARAMS, why)));
            }
        };
        let hub = match self.jobs.run(|dp| dp.events()) {
            Ok(h) => h,
            Err(e) => return answer(Err(rpc_error(&e))),
        };
        let Some(sub) = hub.subscribe(mask) else {
            let why = format!(
                "the switch already serves {} subscribers; try again when one ends",
                super::events::MAX_SUBSCRIBERS
            );
            return answer(Err(RpcError::new(code::LIMIT, why)));
        };
        let kinds = if kinds.is_empty() { EVENT_KINDS.iter().map(|k| k.to_string()).collect() } else { kinds.to_vec() };
        answer(Ok(Some(json(Subscribed { kinds, seq: hub.next_seq() })?)))?;
        tracing::info!("events subscribed");
        out.set_write_timeout(Some(ANSWER_WITHIN))?;
        stream.set_read_timeout(Some(Duration::from_millis(1)))?;
        let (mut probe, mut lost_said) = ([0u8; 512], 0);
        loop {
            // The client says nothing after its request; its end of the connection ends the
            // subscription.
            match std::io::Read::read(&mut &stream, &mut probe) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => return Err(e.into()),
            }
            let mut buf = String::new();
            match sub.rx.recv_timeout(Duration::from_millis(200)) {
                Ok(line) => {
                    buf.push_str(&line);
                    while buf.len() < 1 << 20
                        && let Ok(line) = sub.rx.try_recv()
                    {
                        buf.push_str(&line);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
            }
            let lost = sub.lost();
            if lost != lost_said {
                // (Told with sequence number 0: it is this connection's, not the switch's.)
                let what = EventKind::EventsLost { count: lost - lost_said };
                buf.push_str(&event_line(&Event { seq: 0, time: now_s(), what }));
                lost_said = lost;
            }
            if !buf.is_empty()
                && let Err(e) = out.write_all(buf.as_bytes())
            {
                warn!("disconnecting an events subscriber that took nothing for {} s: {e}", ANSWER_WITHIN.as_secs());
                return Err(e.into());
            }
        }
    }

    pub(crate) fn execute(&self, req: Request) -> Result<Option<serde_json::Value>> {
        let s = &self.settings;
        if let Request::PortDel { name, .. } = &req
            && self.forget_pending(name)?
        {
            return Ok(None);
        }
        let v = match req {
            Request::Hello => {
                let st = self.settings.clone();
                let mut summary = self.jobs.run(move |dp| summary(dp, &st))?;
                summary.gateway = self.gateway.as_ref().map(|g| g.status());
                json(summary)?
            }
            Request::PortAdd { port, may_exist } => {
                // One port added at a time: `--may-exist` callers racing for one port (CNI
                // ADDs of one network) see it attached or attach it, never both fail.
                static ADDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
                let _one = ADDING.lock().unwrap_or_else(|p| p.into_inner());
                let port = *port;
                if port.evpn {
                    return Err(Error::Api(sluice_api::Error::Port(format!(
                        "port {:?}: an EVPN tunnel comes with the switch's [evpn] table, in its configuration file; it cannot be added to a running switch",
                        port.name
                    ))));
                }
                let (existing, missing) = {
                    let n = port.name.clone();
                    let watched = port.mirror.clone();
                    self.jobs.run(move |dp| {
                        let sw = dp.switch();
                        let existing = sw.port_id(&n).map(|id| dp.spec(id).cloned());
                        (existing, watched.into_iter().find(|w| sw.port_id(w).is_none()))
                    })?
                };
                if let Some(attached) = existing {
                    if !may_exist {
                        return Err(Error::PortExists(port.name));
                    }
                    let differ = attached.map_or_else(|| vec!["type".to_string()], |a| a.differences(&port));
                    if differ.is_empty() {
                        return Ok(Some(serde_json::json!({ "existed": true })));
                    }
                    return Err(Error::Refused(format!(
                        "a port named {:?} is already attached with other settings (those that differ: {}); delete it first, or add it as it is",
                        port.name,
                        differ.join(", ")
                    )));
                }
                if let Some(w) = missing {
                    return Err(Error::Refused(format!(
                        "port {:?} cannot mirror {w:?}: the switch has no port {w:?} (`sluice port list` shows its ports); add that port first",
                        port.name
                    )));
                }
                if let Some(g) = self.grants.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                    port.check_grants(g).map_err(sluice_api::Error::Port)?;
                }
                sluice_api::config::check_datapath(&port, s.datapath).map_err(sluice_api::Error::Port)?;
                let dev = create_port(&port, s, None)?;
                let (spec, ifindex) = (port.clone(), dev.tap_ifindex());
                let made = port.kind == PortKind::Veth && port.netns.is_some();
                let name = port.name.clone();
                if let Err(e) = self.jobs.run(move |dp| dp.attach(port, dev).map(|_| ()))? {
                    // (A pair made for the port is not left behind by a refused attach; a
                    // busy datapath still attaches it later, so its pair stays then.)
                    if made {
                        let _ = ports::veth::remove_made(&name);
                    }
                    return Err(e);
                }
                self.remember(|r| {
                    r.record_tap(&spec, ifindex);
                    r.ports.retain(|p| p.name != spec.name);
                    r.ports.push(spec);
                });
                return Ok(None);
            }
            Request::PortDel { name, if_exists } => {
                let n = name.clone();
                let detached = self.jobs.run(move |dp| {
                    let spec = dp.switch().port_id(&name).and_then(|id| dp.spec(id).cloned());
                    dp.detach(&name).map(|()| spec)
                })?;
                let spec = match detached {
                    Ok(spec) => spec,
                    Err(Error::Switch(sluice_switch::SwitchError::NoSuchPort(_))) if if_exists => {
                        return Ok(Some(serde_json::json!({ "existed": false })));
                    }
                    Err(e) => return Err(e),
                };
                // A veth pair the switch made for the port goes with it.
                if spec.is_some_and(|s| s.kind == PortKind::Veth && s.netns.is_some())
                    && let Err(e) = ports::veth::remove_made(&n)
                {
                    warn!(port = %n, "removing the veth pair made for the port: {e}");
                }
                self.remember(|r| {
                    r.ports.retain(|p| p.name != n);
                    r.taps.retain(|t| t.name != n);
                    r.macs.retain(|m| m.2 != n);
                });
                return Ok(None);
            }
            Request::PortList | Request::Stats { port: None } => json(self.stats(None)?)?,
            Request::Stats { port: Some(p) } => json(self.stats(Some(p))?)?,
            Request::MonitorStart { file, interval_ms, max_mb } => {
                let spec = super::monitor::MonitorSpec {
                    file,
                    interval: std::time::Duration::from_millis(interval_ms.clamp(100, 3_600_000)),
                    max_bytes: max_mb.clamp(1, 1 << 20) << 20,
                };
                // Opened (and refused, if it must be) before anything else is touched.
                let opened = super::monitor::Opened::open(spec)?;
                let mut m = self.monitor.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(old) = m.take() {
                    old.stop();
                }
                let started = super::monitor::Monitor::start(opened, self.monitor_source())?;
                let st = started.status();
                *m = Some(started);
                json(st)?
            }
            Request::MonitorStop => {
                let m = self.monitor.lock().unwrap_or_else(|p| p.into_inner()).take();
                let st = m.as_ref().map(|m| m.status()).unwrap_or_default();
                if let Some(m) = m {
                    m.stop();
                }
                json(MonitorStatus { running: false, ..st })?
            }
            Request::MonitorStatus => {
                let m = self.monitor.lock().unwrap_or_else(|p| p.into_inner());
                json(m.as_ref().map(|m| m.status()).unwrap_or_default())?
            }
            Request::Capture { .. } => return Err(Error::Refused("a capture takes a connection of its own".into())),
            Request::Subscribe { .. } => {
                return Err(Error::Refused("a subscription takes a connection of its own".into()));
            }
            Request::StatsReset => {
                self.jobs.run(|dp| dp.reset_counters())?;
                return Ok(None);
            }
            Request::FibShow => json(self.jobs.run(fib_report)?)?,
            Request::PortSet { name, set } => {
                let spec = self.jobs.run(move |dp| dp.set_port(&name, &set))??;
                let answer =
                    serde_json::to_value(&spec).map_err(|e| Error::Refused(format!("encoding the port: {e}")))?;
                self.remember(|r| {
                    if let Some(p) = r.ports.iter_mut().find(|p| p.name == spec.name) {
                        *p = spec;
                    }
                });
                answer
            }
            Request::MdbShow => json(self.jobs.run(mdb_report)?)?,
            Request::EvpnShow => match &self.evpn {
                Some(e) => json(e.report())?,
                None => {
                    return Err(Error::Api(sluice_api::Error::Port(
                        "the switch has no EVPN: add an [evpn] table and a vxlan port with evpn = true".into(),
                    )));
                }
            },
            Request::EvpnClearDuplicates { vni, mac } => {
                let Some(e) = &self.evpn else {
                    return Err(Error::Api(sluice_api::Error::Port(
                        "the switch has no EVPN: add an [evpn] table and a vxlan port with evpn = true".into(),
                    )));
                };
                let mac = mac.as_deref().map(parse_mac).transpose()?;
                let n = e.clear_duplicates(vni, mac).map_err(|m| Error::Api(sluice_api::Error::Port(m)))?;
                json(sluice_api::proto::EvpnCleared { cleared: n as u64 })?
            }
            Request::FibAdd { mac, vlan, port } => {
                let m = parse_mac(&mac)?;
                let p = port.clone();
                self.jobs.run(move |dp| dp.switch_mut().add_static_mac(vlan, m, &p))??;
                self.remember(|r| {
                    r.macs.retain(|e| !(e.0 == vlan && e.1.parse::<MacAddr>().ok() == Some(m)));
                    r.macs.push((vlan, m.to_string(), port));
                });
                return Ok(None);
            }
            Request::FibDel { mac, vlan } => {
                let m = parse_mac(&mac)?;
                if !self.jobs.run(move |dp| dp.switch_mut().fib_mut().remove(vlan, m))? {
                    return Err(Error::Refused(format!("no MAC entry {mac} in VLAN {vlan}")));
                }
                self.remember(|r| r.macs.retain(|e| !(e.0 == vlan && e.1.parse::<MacAddr>().ok() == Some(m))));
                return Ok(None);
            }
            Request::Shutdown => {
                self.jobs.shutdown();
                super::exit_unless_stopped(self.settings.socket.clone());
                return Ok(None);
            }
            Request::Restart => {
                self.jobs.restart();
                return Ok(None);
            }
            Request::GrantAdd { port, vlans, promiscuous } => {
                for &v in &vlans {
                    if !(1..=4094).contains(&v) {
                        return Err(Error::Refused(format!("VLAN {v} is out of range: use 1 to 4094")));
                    }
                }
                let mut g = self.grants.lock().unwrap_or_else(|p| p.into_inner());
                let Some(g) = g.as_mut() else {
                    return Err(Error::Refused(format!(
                        "switch {} does not enforce grants (any port may join any VLAN); set `grants = true` in its config to use them",
                        s.name
                    )));
                };
                if !vlans.is_empty() {
                    g.vlans.entry(port.clone()).or_default().extend(vlans.iter().copied());
                }
                if promiscuous {
                    g.promiscuous.insert(port.clone());
                }
                let now = g.clone();
                self.remember(|r| r.grants = Some(now));
                tracing::info!(port = %port, vlans = ?vlans, promiscuous, "granted");
                return Ok(None);
            }
            Request::GrantDel { port, vlans, promiscuous } => {
                let in_use = {
                    let n = port.clone();
                    self.jobs.run(move |dp| {
                        let id = dp.switch().port_id(&n)?;
                        dp.spec(id).cloned()
                    })?
                };
                let mut g = self.grants.lock().unwrap_or_else(|p| p.into_inner());
                let Some(g) = g.as_mut() else {
                    return Err(Error::Refused(format!(
                        "switch {} does not enforce grants; there is nothing to revoke",
                        s.name
                    )));
                };
                let mut trial = g.clone();
                let all = vlans.is_empty() && !promiscuous;
                if let Some(after) = trial.vlans.get_mut(&port) {
                    if all {
                        after.clear();
                    }
                    for v in &vlans {
                        after.remove(v);
                    }
                    if after.is_empty() {
                        trial.vlans.remove(&port);
                    }
                }
                if all || promiscuous {
                    trial.promiscuous.remove(&port);
                }
                if let Some(spec) = in_use
                    && spec.check_grants(&trial).is_err()
                {
                    return Err(Error::Refused(format!(
                        "port {port:?} is attached and uses what is being revoked; delete it or move it to a granted VLAN first"
                    )));
                }
                *g = trial.clone();
                self.remember(|r| r.grants = Some(trial));
                tracing::info!(port = %port, vlans = ?vlans, promiscuous, "grant revoked");
                return Ok(None);
            }
            // Security groups.
            Request::AclAdd { port, rule } => {
                let id = self
                    .jobs
                    .run(move |dp| dp.switch_mut().acl_add(&port, &rule))?
                    .map_err(|e| Error::Refused(format!("rule refused: {e}")))?;
                tracing::info!(id, "security-group rule added");
                self.remember_acl()?;
                json(sluice_api::proto::AclAdded { id })?
            }
            Request::AclDel { port, id } => {
                let p = port.clone();
                if self.jobs.run(move |dp| dp.switch_mut().acl_del(p.as_deref(), id))?.is_none() {
                    let on = port.map(|p| format!(" on port {p:?}")).unwrap_or_default();
                    return Err(Error::Refused(format!("no security-group rule {id}{on}; see `sluice acl list`")));
                }
                self.remember_acl()?;
                return Ok(None);
            }
            Request::AclList { port } => json(self.jobs.run(move |dp| {
                dp.credit_kernel_hits();
                let mut r = acl_report(dp.switch(), port.as_deref());
                r.conntrack.kernel_zone = dp.kernel().and_then(|k| k.conntrack_zone());
                r
            })?)?,
            Request::AclDefault { port, dir, action } => {
                use sluice_switch::acl;
                let refused = |e: acl::AclError| Error::Refused(format!("default refused: {e}"));
                let dir = acl::parse_dir(&dir).map_err(refused)?;
                let action = acl::parse_action(&action).map_err(refused)?;
                self.jobs.run(move |dp| dp.switch_mut().acl_default(&port, dir, action))?.map_err(refused)?;
                self.remember_acl()?;
                return Ok(None);
            }
            Request::GrantList => {
                let g = self.grants.lock().unwrap_or_else(|p| p.into_inner());
                let enforced = g.is_some();
                let g = g.clone().unwrap_or_default();
                serde_json::json!({ "enforced": enforced, "grants": g.vlans, "promiscuous": g.promiscuous })
            }
        };
        Ok(Some(v))
    }

    /// Records the security groups as they are now in the runtime state file: a restart
    /// (in place, or after a crash) keeps the changes made with `sluice acl`.
    fn remember_acl(&self) -> Result<()> {
        let a = self.jobs.run(|dp| super::state::AclState::of(dp.switch()))?;
        self.remember(|r| r.acl = Some(a));
        Ok(())
    }

    /// Updates the switch's runtime state file (see `state.rs`), one change at a time.
    fn remember(&self, f: impl FnOnce(&mut super::Runtime)) {
        let _g = self.state_lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut r = super::Runtime::load(&self.settings.name);
        f(&mut r);
        r.save(&self.settings.name);
    }

    fn stats(&self, port: Option<String>) -> Result<StatsReport> {
        stats_report(&self.jobs, &self.settings, port)
    }

    /// What a monitor record holds: the switch's counters now.
    pub fn monitor_source(&self) -> Arc<super::monitor::Source> {
        let (jobs, st) = (self.jobs.clone(), self.settings.clone());
        Arc::new(move || stats_report(&jobs, &st, None))
    }
}

/// What a reload (reload.rs) and a start need of the runtime record beyond requests.
impl Server {
    /// The ports recorded as added at runtime (attached or waiting to be).
    pub(crate) fn runtime_ports(&self) -> Vec<PortSpec> {
        let _g = self.state_lock.lock().unwrap_or_else(|p| p.into_inner());
        super::Runtime::load(&self.settings.name).ports
    }

    /// Stops counting port `name` as added at runtime: the file names it now (its TAP's
    /// record stays).
    pub(crate) fn forget_runtime_port(&self, name: &str) {
        self.remember(|r| r.ports.retain(|p| p.name != name));
    }

    /// Forgets port `name` if it is recorded as added at runtime but is not attached (the
    /// start could not attach it again, its namespace gone, say): `sluice port del` of it
    /// then succeeds. True if it was such a port.
    fn forget_pending(&self, name: &str) -> Result<bool> {
        let n = name.to_string();
        if self.jobs.run(move |dp| dp.switch().port_id(&n).is_some())? {
            return Ok(false);
        }
        let mut pending = false;
        self.remember(|r| {
            pending = r.ports.iter().any(|p| p.name == name);
            r.ports.retain(|p| p.name != name);
            r.macs.retain(|m| m.2 != name);
        });
        if pending {
            tracing::info!(port = %name, "forgot a port added at runtime that was waiting to be attached again");
        }
        Ok(pending)
    }
}

/// The switch's counters now (of port `port` only, if given), as `sluice stats --json`
/// prints them: asked of the datapath thread.
pub fn stats_report(jobs: &Jobs, settings: &Settings, port: Option<String>) -> Result<StatsReport> {
    let st = settings.clone();
    jobs.run(move |dp| {
        let ports: Vec<PortStats> = dp
            .switch()
            .ports()
            .into_iter()
            .filter(|p| port.as_deref().is_none_or(|n| n == p.name))
            .map(|p| {
                let (counters, upcall, kernel) = match dp.kernel() {
                    Some(k) => k.merged(p.id, p.counters),
                    None => (p.counters, 0, None),
                };
                PortStats {
                    netns: dp.spec(p.id).and_then(|s| s.netns.clone()),
                    name: p.name,
                    kind: p.kind.into(),
                    vlan: p.vlan.to_string(),
                    mtu: p.mtu,
                    offload: p.caps.offload,
                    lossless_input: p.caps.lossless_input,
                    queued: p.queued,
                    held: p.held,
                    paused: p.paused,
                    classes: p
                        .classes
                        .iter()
                        .map(|k| ClassStats {
                            name: k.name.clone(),
                            lossless: k.lossless,
                            queued: k.queued,
                            stuck: k.stuck,
                            counters: k.counters,
                        })
                        .collect(),
                    resolving: p.resolving,
                    upcall,
                    kernel,
                    failed: p.failed,
                    link: p.link,
                    counters,
                    device_drops: p.device_drops,
                }
            })
            .collect();
        if let Some(n) = &port
            && ports.is_empty()
        {
            return Err(Error::NoPort(n.clone()));
        }
        Ok(StatsReport {
            switch: summary(dp, &st),
            uptime_s: dp.uptime().as_secs_f64(),
            counters_age_s: dp.counters_age().as_secs_f64(),
            ports,
            departed: *dp.switch().departed(),
            fib: fib_summary(dp),
            kernel: dp.kernel().map(|k| k.summary()),
            // (Jobs run on the datapath thread.)
            cpu: sluice_api::proto::CpuReport {
                datapath_s: sluice_sys::cpu_seconds(true),
                process_s: sluice_sys::cpu_seconds(false),
            },
        })
    })?
}

/// A refusal as a JSON-RPC error: its code says what kind of refusal, its message what
/// to do.
fn rpc_error(e: &Error) -> RpcError {
    let c = match e {
        Error::NoPort(_) | Error::Switch(sluice_switch::SwitchError::NoSuchPort(_)) => code::NO_SUCH_PORT,
        Error::PortExists(_) | Error::Switch(sluice_switch::SwitchError::DuplicatePort(_)) => code::ALREADY_EXISTS,
        Error::Busy { .. } => code::BUSY,
        Error::Stopped | Error::StoppedBeforeAnswering => code::STOPPING,
        _ => code::REFUSED,
    };
    RpcError::new(c, Report(e).to_string())
}

/// Now, as Unix time in seconds.
fn now_s() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// An answer's data as JSON.
fn json(v: impl serde::Serialize) -> Result<serde_json::Value> {
    Ok(serde_json::to_value(v).context("encoding the answer")?)
}

/// A MAC address a client gave.
fn parse_mac(mac: &str) -> Result<MacAddr> {
    mac.parse().map_err(|_| Error::Refused(format!("{mac:?} is not a MAC address (aa:bb:cc:dd:ee:ff)")))
}

fn summary(dp: &Datapath, s: &Settings) -> SwitchSummary {
    SwitchSummary {
        protocol: PROTOCOL,
        protocol_minor: PROTOCOL_MINOR,
        version: env!("CARGO_PKG_VERSION").into(),
        name: s.name.clone(),
        mode: s.mode.as_str().into(),
        pid: std::process::id(),
        started_ns: dp.started_unix_ns(),
        lossless: s.core.lossless,
        datapath: s.datapath.as_str().into(),
        poll: dp.polling(),
        mtu: s.core.mtu,
        ports: dp.switch().port_ids().count(),
        metrics: s.metrics_listen.map(|a| a.to_string()),
        gateway: None,
    }
}

fn fib_summary(dp: &Datapath) -> FibSummary {
    let f = dp.switch().fib();
    FibSummary {
        entries: f.len(),
        max_entries: dp.switch().config().fib_max,
        aging_s: f.aging_ms() / 1000,
        moves: f.moves,
        full_refusals: f.full_refusals,
    }
}

fn fib_report(dp: &mut Datapath) -> FibReport {
    let now = dp.uptime().as_millis() as u64;
    let entries = dp
        .switch()
        .fib()
        .entries()
        .into_iter()
        .map(|(vlan, mac, e)| FibEntryReport {
            vlan,
            mac: mac.to_string(),
            port: dp.switch().port_name(e.port).unwrap_or("?").to_string(),
            is_static: e.is_static,
            age_s: (!e.is_static && !e.remote).then(|| now.saturating_sub(e.last_seen_ms) as f64 / 1000.0),
            endpoint: dp.switch().port_endpoint(e.port, vlan, mac),
            origin: match (e.is_static, e.remote) {
                (true, _) => "static",
                (_, true) => "evpn",
                _ => "learned",
            }
            .into(),
        })
        .collect();
    FibReport { summary: fib_summary(dp), entries }
}

/// IGMP/MLD snooping's database as `sluice mdb show` prints it.
fn mdb_report(dp: &mut Datapath) -> sluice_api::proto::MdbReport {
    use sluice_api::proto::{MdbGroupReport, MdbMemberReport, MdbPortCounters, MdbQuerierReport, MdbRouterReport};
    let v = dp.switch().mdb_view();
    let s = |ms: u64| ms as f64 / 1000.0;
    let querier = |q: &Option<(std::net::IpAddr, String)>| match q {
        Some((a, p)) => MdbQuerierReport { who: "other".into(), address: Some(a.to_string()), port: Some(p.clone()) },
        None => MdbQuerierReport { who: "switch".into(), address: None, port: None },
    };
    sluice_api::proto::MdbReport {
        enabled: v.enabled,
        pruning: v.pruning,
        groups: v
            .groups
            .iter()
            .map(|(e, names)| MdbGroupReport {
                vlan: e.vlan,
                group: e.group.to_string(),
                set: e.set,
                ports: e
                    .ports
                    .iter()
                    .zip(names)
                    .map(|(&(_, left), n)| MdbMemberReport { port: n.clone(), expires_s: s(left) })
                    .collect(),
            })
            .collect(),
        routers: v
            .routers
            .iter()
            .map(|r| MdbRouterReport { port: r.port.clone(), expires_s: r.learned_ms.map(s) })
            .collect(),
        querier_v4: querier(&v.queriers[0]),
        querier_v6: querier(&v.queriers[1]),
        counters: v
            .counters
            .iter()
            .map(|(p, c)| MdbPortCounters {
                port: p.clone(),
                reports: c.reports,
                leaves: c.leaves,
                queries: c.queries,
                mdb_full: c.mdb_full,
                truncated: c.truncated,
            })
            .collect(),
    }
}

/// The wall clock in nanoseconds since the Unix epoch: the time each capture copy is stamped
/// with as the core makes it (pcap's timestamps).
fn wall_clock_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// The answer to `acl_list`: the rules (of `port`, or all) with their hits, the ports'
/// defaults, the connection tracker's numbers.
fn acl_report(sw: &sluice_switch::Switch, port: Option<&str>) -> sluice_api::proto::AclReport {
    use sluice_api::proto::{AclDefaults, AclReport, AclRuleReport, ConntrackReport};
    use sluice_switch::acl::Dir;
    let rules = sw
        .acl_list(port)
        .into_iter()
        .map(|l| AclRuleReport { port: l.port, id: l.rule.id, hits: l.hits, rule: l.rule.spec() })
        .collect();
    let defaults = sw
        .acl_ports()
        .into_iter()
        .filter(|p| port.is_none_or(|w| w == p))
        .map(|p| AclDefaults {
            dir_in: sw.acl_default_of(&p, Dir::In).name().into(),
            out: sw.acl_default_of(&p, Dir::Out).name().into(),
            port: p,
        })
        .collect();
    let c = sw.ct_stats();
    AclReport {
        rules,
        defaults,
        conntrack: ConntrackReport { entries: c.entries as u64, max: c.max as u64, full: c.full, kernel_zone: None },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_the_datapath_does_not_take_is_answered_busy_in_bounded_time() {
        let (tx, rx) = mpsc::channel();
        let jobs = Jobs { wait: Duration::from_millis(200), ..Jobs::new(tx, Arc::new(EventFd::new().unwrap())) };
        let started = std::time::Instant::now();
        let e = jobs.run(|_| ()).unwrap_err();
        assert!(matches!(e, Error::Busy { .. }) && e.to_string().contains("the datapath is busy"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(10));
        drop(rx);
        assert!(matches!(jobs.run(|_| ()), Err(Error::Stopped)));
    }
}
