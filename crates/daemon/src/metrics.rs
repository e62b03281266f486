//! The Prometheus / OpenMetrics endpoint (`metrics_listen`, `switch run --metrics`;
//! docs/architecture.md, "Seeing inside the switch").
//!
//! Each scrape takes the snapshot `sluice stats --json` prints and encodes it with
//! `prometheus-client` as constant counters and gauges, named as node_exporter names its
//! own: `sluice_port_rx_bytes_total{switch="sw0",port="t1"}`. The HTTP side is the least
//! a scraper needs: `GET /metrics` on a plain TCP listener, each connection bounded in size
//! and in time as a whole (its request head within 5 s of the connection, its answer
//! within 5 s). One thread reads every connection's head (up to [`MAX_WAITING`] of them,
//! the oldest closed for a newcomer beyond that), so clients that connect and trickle, or
//! say nothing, cost a descriptor and never keep a scraper out; at most [`MAX_ANSWERING`]
//! are answered at once.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tracing::{info, warn};

use super::deadline::{Deadline, write_all_by};
use crate::error::{Error, Result};
use sluice_api::proto::StatsReport;
use sluice_sys::epoll::{Epoll, Event};
use sluice_sys::error::{Context, Report};

/// Connections answered at once (a thread each); a request beyond them is answered 503.
const MAX_ANSWERING: usize = 16;
/// Connections waiting for their request head, read by the endpoint's one thread; when
/// this many wait, the oldest is closed for a newcomer.
const MAX_WAITING: usize = 256;
/// Connections taken from the listener per turn of the loop (so heads are read between).
const ACCEPT_BATCH: usize = 64;
/// A request's head is at most this long.
const MAX_REQUEST: usize = 8192;
/// A request's head must arrive whole within this time of the connection.
const HEAD_WITHIN: Duration = Duration::from_secs(5);
/// An answer must be taken whole within this time.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// The endpoint says at most once in this time that it closed or refused connections.
const WARN_EVERY: Duration = Duration::from_secs(60);
/// The listener's token in the loop's epoll (connections count from 1).
const LISTENER: u64 = 0;
/// The content type of the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A snapshot source: the switch's counters now, and (when readable) the host's SMC
/// counters (`sluice smc stats --json`).
pub type Source = dyn Fn() -> Result<(StatsReport, Option<serde_json::Value>)> + Send + Sync;

/// Binds the endpoint's address (before the switch starts, so a taken port fails the start
/// with the reason).
pub fn bind(addr: SocketAddr) -> Result<TcpListener> {
    Ok(TcpListener::bind(addr).with_context(|| {
        format!(
            "metrics endpoint: listening on {addr} (is the port taken? choose another with `metrics_listen` or --metrics)"
        )
    })?)
}

/// A connection waiting for its request head.
struct Waiting<T> {
    since: Instant,
    conn: T,
    head: Vec<u8>,
}

/// The connections waiting for their heads, by token: tokens rise with arrival, so the
/// first is the oldest.
struct Heads<T> {
    max: usize,
    next: u64,
    waiting: BTreeMap<u64, Waiting<T>>,
    /// Connections closed for a newcomer, or for taking too long, since the last warning.
    evicted: u64,
    late: u64,
}

impl<T> Heads<T> {
    fn new(max: usize) -> Heads<T> {
        Heads { max, next: LISTENER, waiting: BTreeMap::new(), evicted: 0, late: 0 }
    }

    /// Takes a newcomer (arrived at `now`): its token, and the oldest waiting connection
    /// when it took that one's place.
    fn admit(&mut self, now: Instant, conn: T) -> (u64, Option<T>) {
        let out = (self.waiting.len() >= self.max).then(|| self.waiting.pop_first()).flatten().map(|(_, w)| {
            self.evicted += 1;
            w.conn
        });
        self.next += 1;
        self.waiting.insert(self.next, Waiting { since: now, conn, head: Vec::new() });
        (self.next, out)
    }

    /// The connections whose head did not arrive whole within [`HEAD_WITHIN`] by `now`.
    fn expire(&mut self, now: Instant) -> Vec<T> {
        let mut out = Vec::new();
        while let Some(e) = self.waiting.first_entry() {
            if Deadline::from(e.get().since, HEAD_WITHIN).left_at(now).is_some() {
                break;
            }
            out.push(e.remove().conn);
            self.late += 1;
        }
        out
    }

    /// How long until the oldest head is late (`None`: nobody waits).
    fn next_expiry(&self, now: Instant) -> Option<Duration> {
        self.waiting
            .first_key_value()
            .map(|(_, w)| Deadline::from(w.since, HEAD_WITHIN).left_at(now).unwrap_or_default())
    }
}

/// What a read of a waiting connection came to.
enum HeadRead {
    /// More may come.
    Partial,
    /// The head is whole.
    Whole,
    /// Closed, broken, or too long: drop it (too long: answer 431 first).
    Done { too_long: bool },
}

/// Reads what `w` has for now.
fn read_head(w: &mut Waiting<TcpStream>) -> HeadRead {
    let mut buf = [0u8; 1024];
    loop {
        match w.conn.read(&mut buf) {
            Ok(0) => return HeadRead::Done { too_long: false },
            Ok(n) => {
                w.head.extend_from_slice(&buf[..n]);
                if w.head.windows(4).any(|x| x == b"\r\n\r\n") {
                    return HeadRead::Whole;
                }
                if w.head.len() > MAX_REQUEST {
                    return HeadRead::Done { too_long: true };
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return HeadRead::Partial,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return HeadRead::Done { too_long: false },
        }
    }
}

/// Serves scrapes on `listener` on a thread of its own: one loop accepts connections and
/// reads their request heads (without a thread each, so connections that say nothing cost
/// only a descriptor); a connection whose head is whole is answered on a thread of its
/// own, at most [`MAX_ANSWERING`] at once.
pub fn serve(listener: TcpListener, source: Arc<Source>) -> Result<()> {
    let bound = listener.local_addr()?;
    info!(listen = %bound, "metrics endpoint: http://{bound}/metrics");
    listener.set_nonblocking(true)?;
    let ep = Epoll::new()?;
    ep.add(listener.as_raw_fd(), LISTENER, true, false)?;
    std::thread::Builder::new().name("metrics".into()).spawn(move || {
        let answering = Arc::new(AtomicUsize::new(0));
        let mut heads: Heads<TcpStream> = Heads::new(MAX_WAITING);
        let mut busy = 0u64;
        let mut warned: Option<Instant> = None;
        let mut buf = vec![libc::epoll_event { events: 0, u64: 0 }; 128];
        let mut events: Vec<Event> = Vec::with_capacity(128);
        loop {
            let wait = heads.next_expiry(Instant::now()).map_or(1000, |d| d.as_millis().clamp(1, 1000) as i32);
            if ep.wait(&mut buf, wait, &mut events).is_err() {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            for ev in &events {
                if ev.token == LISTENER {
                    for _ in 0..ACCEPT_BATCH {
                        let stream = match listener.accept() {
                            Ok((s, _)) => s,
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                            Err(_) => {
                                // (Out of descriptors, say: do not spin.)
                                std::thread::sleep(Duration::from_millis(100));
                                break;
                            }
                        };
                        if stream.set_nonblocking(true).is_err() {
                            continue;
                        }
                        let fd = stream.as_raw_fd();
                        let (token, old) = heads.admit(Instant::now(), stream);
                        if let Some(old) = old {
                            let _ = ep.delete(old.as_raw_fd());
                        }
                        if ep.add(fd, token, true, false).is_err() {
                            heads.waiting.remove(&token);
                        }
                    }
                    continue;
                }
                let Some(w) = heads.waiting.get_mut(&ev.token) else { continue };
                let got = read_head(w);
                if matches!(got, HeadRead::Partial) {
                    continue;
                }
                let Some(w) = heads.waiting.remove(&ev.token) else { continue };
                let _ = ep.delete(w.conn.as_raw_fd());
                match got {
                    HeadRead::Done { too_long: true } => {
                        let _ = respond(&w.conn, "431 Request Header Fields Too Large", "text/plain", b"request too large\n");
                    }
                    HeadRead::Whole if answering.fetch_add(1, Ordering::AcqRel) >= MAX_ANSWERING => {
                        answering.fetch_sub(1, Ordering::AcqRel);
                        busy += 1;
                        // (Never blocks this thread: a fresh socket takes a short answer at once.)
                        let _ = respond(&w.conn, "503 Service Unavailable", "text/plain", b"too many scrapes at once\n");
                    }
                    HeadRead::Whole => {
                        let (source, count) = (source.clone(), answering.clone());
                        let spawned = std::thread::Builder::new().name("metrics-conn".into()).spawn(move || {
                            let r = w.conn.set_nonblocking(false).map_err(Error::from);
                            if let Err(e) = r.and_then(|_| answer(&w.conn, &w.head, &*source)) {
                                tracing::debug!("metrics endpoint: {}", Report(&e));
                            }
                            count.fetch_sub(1, Ordering::AcqRel);
                        });
                        if spawned.is_err() {
                            answering.fetch_sub(1, Ordering::AcqRel);
                        }
                    }
                    HeadRead::Partial | HeadRead::Done { .. } => {}
                }
            }
            let now = Instant::now();
            for late in heads.expire(now) {
                let _ = ep.delete(late.as_raw_fd());
            }
            if (heads.evicted > 0 || heads.late > 0 || busy > 0) && warned.is_none_or(|w| w.elapsed() >= WARN_EVERY) {
                warn!(
                    closed_for_newcomers = heads.evicted,
                    closed_late = heads.late,
                    answered_503 = busy,
                    "metrics endpoint: closed connections that had not sent their request within {} s or whose place a newcomer took ({MAX_WAITING} waiting), or answered 503 ({MAX_ANSWERING} being answered); said at most once a minute",
                    HEAD_WITHIN.as_secs()
                );
                (heads.evicted, heads.late, busy) = (0, 0, 0);
                warned = Some(now);
            }
        }
    })?;
    Ok(())
}

/// Answers request `head` on `stream`.
fn answer(stream: &TcpStream, head: &[u8], source: &Source) -> Result<()> {
    let line = String::from_utf8_lossy(&head[..head.iter().position(|&b| b == b'\r').unwrap_or(0)]).into_owned();
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if method != "GET" && method != "HEAD" {
        return respond(stream, "405 Method Not Allowed", "text/plain", b"GET /metrics\n");
    }
    if path != "/metrics" {
        return respond(stream, "404 Not Found", "text/plain", b"sluice serves its metrics at /metrics\n");
    }
    let body = match source().and_then(|(r, smc)| render(&r, smc.as_ref())) {
        Ok(b) => b,
        Err(e) => {
            let msg = format!("cannot read the switch's counters: {}\n", Report(&e));
            return respond(stream, "500 Internal Server Error", "text/plain", msg.as_bytes());
        }
    };
    if method == "HEAD" {
        let h = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        return Ok(write_all_by(stream, h.as_bytes(), Deadline::after(ANSWER_WITHIN)).context("answering")?);
    }
    respond(stream, "200 OK", CONTENT_TYPE, body.as_bytes())
}

/// Writes an answer, all of it within [`ANSWER_WITHIN`].
fn respond(stream: &TcpStream, status: &str, ctype: &str, body: &[u8]) -> Result<()> {
    let mut a = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    a.extend_from_slice(body);
    Ok(write_all_by(stream, &a, Deadline::after(ANSWER_WITHIN)).context("answering")?)
}

/// The OpenMetrics text of snapshot `r` (and the host's SMC counters `smc`).
pub fn render(r: &StatsReport, smc: Option<&serde_json::Value>) -> Result<String> {
    let mut reg = Registry::default();
    reg.register_collector(Box::new(Snapshot { r: r.clone(), smc: smc.cloned() }));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &reg).context("encoding")?;
    Ok(out)
}

#[derive(Debug)]
struct Snapshot {
    r: StatsReport,
    smc: Option<serde_json::Value>,
}

/// What a port counter means, for its HELP line (by its name in `sluice stats --json`).
fn port_help(key: &str) -> &'static str {
    match key {
        "rx_frames" => "Frames received from the port (a GSO frame counts once).",
        "rx_bytes" => "Bytes received from the port.",
        "rx_gso" => "GSO frames received from the port.",
        "forwarded" => "Frames from the port sent to one port.",
        "flooded" => "Frames from the port flooded to every port of their VLAN.",
        "copies" => "Copies of the port's frames offered to outputs (mirrors included).",
        "consumed" => "Frames from the port the switch answered itself (ARP, neighbour discovery).",
        "tx_offered" => "Frames offered to the port.",
        "generated" => "Frames the switch made itself and sent to the port.",
        "tx_frames" => "Frames sent to the port.",
        "tx_bytes" => "Bytes sent to the port.",
        "tx_gso" => "GSO frames sent to the port whole.",
        "tx_segmented" => "GSO frames the switch cut into segments for the port.",
        "tx_segments" => "Segments the switch cut GSO frames into for the port.",
        "tx_csum_filled" => "Frames whose partial checksum the switch completed for the port.",
        "pauses" => "Times the port's input was paused (lossless: a full output held it back).",
        "failovers" => "Times the uplink moved to another device.",
        "learn_refused" => "Frames from sources the port may not learn (its station limit).",
        _ => "A port counter (see `sluice stats --json`).",
    }
}

impl Snapshot {
    fn counters(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let sw = self.r.switch.name.as_str();
        // Every numeric counter of a port, by its name in `sluice stats --json`; drops by
        // cause get a label.
        let per_port: Vec<(String, serde_json::Value)> = self
            .r
            .ports
            .iter()
            .map(|p| (p.name.clone(), serde_json::to_value(p.counters).unwrap_or_default()))
            .collect();
        let keys: Vec<String> = per_port
            .first()
            .and_then(|(_, v)| v.as_object())
            .map(|o| o.iter().filter(|(_, v)| v.is_u64()).map(|(k, _)| k.clone()).collect())
            .unwrap_or_default();
        for key in &keys {
            let name = format!("sluice_port_{key}");
            let mut m = enc.encode_descriptor(&name, port_help(key), None, MetricType::Counter)?;
            for (port, v) in &per_port {
                let labels = [("switch", sw), ("port", port.as_str())];
                ConstCounter::new(v[key].as_u64().unwrap_or(0)).encode(m.encode_family(&labels)?)?;
            }
        }
        for (dir, what) in [("rx", "received from"), ("tx", "on their way to")] {
            let name = format!("sluice_port_{dir}_drops");
            let help = format!("Frames {what} the port the switch dropped, by cause.");
            let mut m = enc.encode_descriptor(&name, &help, None, MetricType::Counter)?;
            for (port, v) in &per_port {
                for (cause, n) in v[format!("{dir}_drops")].as_object().into_iter().flatten() {
                    let labels = [("switch", sw), ("port", port.as_str()), ("cause", cause.as_str())];
                    ConstCounter::new(n.as_u64().unwrap_or(0)).encode(m.encode_family(&labels)?)?;
                }
            }
        }
        let mut m = enc.encode_descriptor(
            "sluice_port_device_drops",
            "Frames the port's own device dropped (a TAP's queue, a tunnel's socket), towards the guest or from it.",
            None,
            MetricType::Counter,
        )?;
        for p in &self.r.ports {
            if let Some(d) = p.device_drops {
                for (dir, n) in [("to_guest", d.to_guest), ("from_guest", d.from_guest)] {
                    let labels = [("switch", sw), ("port", p.name.as_str()), ("direction", dir)];
                    ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
                }
            }
        }
        type Gauge = fn(&sluice_api::proto::PortStats) -> i64;
        let gauges: [(&str, &str, Gauge); 5] = [
            ("sluice_port_queued_frames", "Frames waiting in the port's output queues.", |p| p.queued as i64),
            ("sluice_port_held_frames", "Frames held back for the port's full outputs (lossless).", |p| p.held as i64),
            ("sluice_port_upcall_frames", "Frames the kernel datapath sent up that the core has not taken yet.", |p| {
                p.upcall as i64
            }),
            ("sluice_port_paused", "1 while the port's input is paused (lossless).", |p| i64::from(p.paused)),
            ("sluice_port_up", "1 unless the port failed.", |p| i64::from(p.failed.is_none())),
        ];
        for (name, help, f) in gauges {
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for p in &self.r.ports {
                ConstGauge::new(f(p)).encode(m.encode_family(&[("switch", sw), ("port", p.name.as_str())])?)?;
            }
        }
        // The kernel datapath's own part (kernel ports only).
        type Kernel = fn(&sluice_api::proto::KernelPortStats) -> u64;
        let kernel: [(&str, &str, Kernel); 4] = [
            ("sluice_kernel_forwarded", "Frames from the port the kernel datapath forwarded itself.", |k| k.forwarded),
            ("sluice_kernel_flooded", "Frames from the port the kernel datapath flooded itself.", |k| k.flooded),
            ("sluice_kernel_upcalls", "Frames from the port the kernel datapath sent up to the core.", |k| k.upcalls),
            (
                "sluice_kernel_misses",
                "Frames from the port of a kind the kernel datapath had no current verdict for (sent up).",
                |k| k.misses,
            ),
        ];
        if self.r.ports.iter().any(|p| p.kernel.is_some()) {
            for (name, help, f) in kernel {
                let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
                for p in &self.r.ports {
                    if let Some(k) = &p.kernel {
                        ConstCounter::new(f(k))
                            .encode(m.encode_family(&[("switch", sw), ("port", p.name.as_str())])?)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn classes(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let sw = self.r.switch.name.as_str();
        type Count = fn(&sluice_switch::ClassCounters) -> u64;
        let counters: [(&str, &str, Count); 4] = [
            ("sluice_class_rx_frames", "Frames queued into the class's queue of the port.", |c| c.rx_frames),
            ("sluice_class_tx_frames", "Frames of the class sent to the port.", |c| c.tx_frames),
            ("sluice_class_tx_bytes", "Bytes of the class sent to the port.", |c| c.tx_bytes),
            ("sluice_class_watchdog_trips", "Times the pause watchdog declared the class's queue stuck.", |c| {
                c.watchdog_trips
            }),
        ];
        for (name, help, f) in counters {
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            for p in &self.r.ports {
                for k in &p.classes {
                    let labels = [("switch", sw), ("port", p.name.as_str()), ("class", k.name.as_str())];
                    ConstCounter::new(f(&k.counters)).encode(m.encode_family(&labels)?)?;
                }
            }
        }
        let mut m = enc.encode_descriptor(
            "sluice_class_tx_drops",
            "Frames of the class dropped on their way to the port, by cause.",
            None,
            MetricType::Counter,
        )?;
        for p in &self.r.ports {
            for k in &p.classes {
                let drops = serde_json::to_value(k.counters.tx_drops).unwrap_or_default();
                for (cause, n) in drops.as_object().into_iter().flatten() {
                    let labels = [
                        ("switch", sw),
                        ("port", p.name.as_str()),
                        ("class", k.name.as_str()),
                        ("cause", cause.as_str()),
                    ];
                    ConstCounter::new(n.as_u64().unwrap_or(0)).encode(m.encode_family(&labels)?)?;
                }
            }
        }
        let mut m = enc.encode_descriptor(
            "sluice_class_queued_frames",
            "Frames in the class's queue.",
            None,
            MetricType::Gauge,
        )?;
        for p in &self.r.ports {
            for k in &p.classes {
                let labels = [("switch", sw), ("port", p.name.as_str()), ("class", k.name.as_str())];
                ConstGauge::new(k.queued as i64).encode(m.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }

    fn switch(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let r = &self.r;
        let l = [("switch", r.switch.name.as_str())];
        let gauge = |enc: &mut DescriptorEncoder, name: &str, help: &str, v: i64| -> Result<(), std::fmt::Error> {
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(v).encode(m.encode_family(&l)?)
        };
        let counter = |enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64| -> Result<(), std::fmt::Error> {
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(v).encode(m.encode_family(&l)?)
        };
        let fcounter = |enc: &mut DescriptorEncoder, name: &str, help: &str, v: f64| -> Result<(), std::fmt::Error> {
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(v).encode(m.encode_family(&l)?)
        };
        gauge(enc, "sluice_fib_entries", "Entries in the MAC table.", r.fib.entries as i64)?;
        gauge(enc, "sluice_fib_max_entries", "Entries the MAC table holds at most.", r.fib.max_entries as i64)?;
        counter(enc, "sluice_fib_moves", "Stations the MAC table saw move to another port.", r.fib.moves)?;
        counter(
            enc,
            "sluice_fib_full_refusals",
            "Stations not learned because the MAC table was full.",
            r.fib.full_refusals,
        )?;
        gauge(enc, "sluice_ports", "Ports attached.", r.ports.len() as i64)?;
        fcounter(
            enc,
            "sluice_datapath_cpu_seconds",
            "CPU time of the switch's datapath thread (user + system).",
            r.cpu.datapath_s,
        )?;
        fcounter(
            enc,
            "sluice_process_cpu_seconds",
            "CPU time of the switch's daemon (user + system).",
            r.cpu.process_s,
        )?;
        gauge(
            enc,
            "sluice_start_time_seconds",
            "When the switch's daemon started, in seconds since the epoch.",
            (r.switch.started_ns / 1_000_000_000) as i64,
        )?;
        if let Some(k) = &r.kernel {
            counter(
                enc,
                "sluice_kernel_upcall_queue_drops",
                "Frames the upcall TAP dropped because its queue was full (kernel datapath).",
                k.upcall_queue_drops.unwrap_or(0),
            )?;
            counter(
                enc,
                "sluice_kernel_map_updates_failed",
                "Changes of the core the kernel datapath's maps refused.",
                k.map_updates_failed,
            )?;
            counter(
                enc,
                "sluice_kernel_upcalls_refused",
                "Frames read from the upcall TAP the core could not take (kernel datapath).",
                k.upcalls_refused,
            )?;
            counter(
                enc,
                "sluice_kernel_upcall_egress_refused",
                "Frames others sent out of the upcall TAP, dropped before its queue (kernel datapath).",
                k.upcall_egress_refused,
            )?;
        }
        Ok(())
    }

    fn smc(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(v) = self.smc.as_ref().and_then(|v| v.as_object()) else { return Ok(()) };
        for (k, n) in v {
            if let Some(n) = n.as_u64() {
                let name = format!("sluice_smc_{k}");
                let help =
                    format!("The shared-memory fast path's `{k}`, summed over the host's users (`sluice smc stats`).");
                ConstCounter::new(n).encode(enc.encode_descriptor(&name, &help, None, MetricType::Counter)?)?;
            }
        }
        // Each user's own counts (a user's programs write only their own file, so a
        // member of the fast path's group can misstate only what is labelled with its uid).
        if let Some(users) = v.get("users").and_then(|u| u.as_object()) {
            let keys: std::collections::BTreeSet<&String> = users
                .values()
                .filter_map(|u| u.as_object())
                .flat_map(|u| u.iter().filter(|(_, n)| n.is_u64()).map(|(k, _)| k))
                .collect();
            for k in keys {
                let name = format!("sluice_smc_user_{k}");
                let help = format!("The shared-memory fast path's `{k}` as one user's programs counted it.");
                let mut m = enc.encode_descriptor(&name, &help, None, MetricType::Counter)?;
                for (uid, u) in users {
                    if let Some(n) = u.get(k).and_then(|n| n.as_u64()) {
                        ConstCounter::new(n).encode(m.encode_family(&[("uid", uid.as_str())])?)?;
                    }
                }
            }
        }
        let mut m = enc.encode_descriptor(
            "sluice_smc_fallbacks",
            "Connections that stayed on TCP, by side and reason (`sluice smc stats`).",
            None,
            MetricType::Counter,
        )?;
        for side in ["client", "server"] {
            for (reason, n) in v.get(&format!("fallback_{side}")).and_then(|x| x.as_object()).into_iter().flatten() {
                let labels = [("side", side), ("reason", reason.as_str())];
                ConstCounter::new(n.as_u64().unwrap_or(0)).encode(m.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.counters(&mut enc)?;
        self.classes(&mut enc)?;
        self.switch(&mut enc)?;
        self.smc(&mut enc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newcomer_takes_the_place_of_the_oldest_head_and_late_heads_are_closed() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut h: Heads<&str> = Heads::new(3);
        assert_eq!(h.next_expiry(t0), None);
        assert_eq!(h.admit(at(0), "a"), (1, None));
        assert_eq!(h.admit(at(10), "b"), (2, None));
        assert_eq!(h.admit(at(20), "c"), (3, None));
        // Full: the oldest goes, whoever the newcomer is.
        assert_eq!(h.admit(at(30), "d"), (4, Some("a")));
        h.waiting.remove(&2); // (b sent its head and went to be answered)
        assert_eq!(h.admit(at(40), "e"), (5, None));
        assert_eq!(h.evicted, 1);
        assert_eq!(h.next_expiry(at(20)), Some(HEAD_WITHIN));
        // Five seconds after its connection a head is late, whatever it sent meanwhile.
        assert!(h.expire(at(4_999)).is_empty());
        assert_eq!(h.expire(at(5_030)), ["c", "d"]);
        assert_eq!(h.late, 2);
        assert_eq!(h.next_expiry(at(5_030)), Some(Duration::from_millis(10)));
        assert_eq!(h.waiting.len(), 1);
    }
}
