//! Monitor records (`monitor_interval`, `monitor_file`, `sluice monitor start|stop`;
//! docs/architecture.md, "Seeing inside the switch"): one compact JSON line of every
//! counter per interval, appended to a file that is rotated before it grows past its bound.
//! `sluice report` reduces a record to interval tables and charts.
//!
//! The file's path is the admin's, but it may lie under a directory others can write:
//! its directory is walked with `openat` and the file opened `O_NOFOLLOW|O_NONBLOCK` and
//! checked before use (see `sys::fs`), so a FIFO, a device, a link or someone else's file
//! there is refused at once, with what to do, instead of hanging the caller or being
//! written through.

use std::fs::File;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use tracing::{info, warn};

use sluice_api::proto::{MonitorStatus, StatsReport};
use sluice_sys::error::{Context, Failure, Report};
use sluice_sys::fs::Dir;

use crate::error::Result;

/// What to record, where, how often, and how much at most.
pub use sluice_api::config::MonitorSettings as MonitorSpec;

/// A snapshot source for the recorder.
pub type Source = dyn Fn() -> Result<StatsReport> + Send + Sync;

/// A running recorder.
pub struct Monitor {
    spec: MonitorSpec,
    stop: Arc<AtomicBool>,
    records: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

/// A monitor file opened and checked, not yet written to.
pub struct Opened {
    spec: MonitorSpec,
    dir: Dir,
    file: File,
}

impl Opened {
    /// Opens `spec`'s file for appending, mode 0600 when it is made (its directories too,
    /// 0700): a regular file of the daemon's user only, never through a link, without
    /// blocking (a FIFO or a device there is refused, not waited on).
    pub fn open(spec: MonitorSpec) -> Result<Opened> {
        let (dir, file) = sluice_sys::fs::append_checked(&spec.file, 0o600)
            .map_err(|e| Failure::new("cannot record to the monitor file", e))?;
        Ok(Opened { spec, dir, file })
    }
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

impl Monitor {
    /// Starts recording into a file [`Opened::open`] opened: a thread appends a record
    /// every interval.
    pub fn start(opened: Opened, source: Arc<Source>) -> Result<Monitor> {
        let Opened { spec, dir, mut file } = opened;
        let name = spec.file.file_name().map(|n| n.to_os_string()).unwrap_or_default();
        let mut rotated = name.clone();
        rotated.push(".1");
        let stop = Arc::new(AtomicBool::new(false));
        let records = Arc::new(AtomicU64::new(0));
        let (s, stopping, count) = (spec.clone(), stop.clone(), records.clone());
        info!(file = %spec.file.display(), interval_ms = spec.interval.as_millis() as u64, "monitor records started");
        let thread = std::thread::Builder::new().name("monitor".into()).spawn(move || {
            let mut next = Instant::now();
            let mut failing = false;
            while !stopping.load(Ordering::Acquire) {
                let now = Instant::now();
                if now < next {
                    // (Bounded waits, so that a stop is seen within 100 ms.)
                    std::thread::sleep((next - now).min(Duration::from_millis(100)));
                    continue;
                }
                next += s.interval;
                if next < now {
                    next = now + s.interval;
                }
                let line = source().and_then(|r| {
                    let mut l = serde_json::to_string(&serde_json::json!({"t": unix_now(), "stats": r}))
                        .context("encoding a record")?;
                    l.push('\n');
                    Ok(l)
                });
                let wrote = line.and_then(|l| {
                    let len = file.metadata()?.len();
                    if len > 0 && len + l.len() as u64 > s.max_bytes {
                        dir.rename(&name, &rotated).context("rotating the monitor file")?;
                        file = dir.append(&name, 0o600).context("opening the monitor file again")?;
                    }
                    Ok(file.write_all(l.as_bytes()).context("writing a record")?)
                });
                match wrote {
                    Ok(()) => {
                        count.fetch_add(1, Ordering::Relaxed);
                        failing = false;
                    }
                    Err(e) if !failing => {
                        warn!(file = %s.file.display(), "monitor record lost: {} (said once until it works again)", Report(&e));
                        failing = true;
                    }
                    Err(_) => {}
                }
            }
        })?;
        Ok(Monitor { spec, stop, records, thread: Some(thread) })
    }

    /// What it does, for `sluice monitor status`.
    pub fn status(&self) -> MonitorStatus {
        MonitorStatus {
            running: true,
            file: Some(self.spec.file.display().to_string()),
            interval_ms: self.spec.interval.as_millis() as u64,
            max_mb: self.spec.max_bytes / (1 << 20),
            records: self.records.load(Ordering::Relaxed),
        }
    }

    /// Stops recording (the last record is complete; the thread notices within 100 ms).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
            info!(file = %self.spec.file.display(), records = self.records.load(Ordering::Relaxed), "monitor records stopped");
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.halt();
    }
}
