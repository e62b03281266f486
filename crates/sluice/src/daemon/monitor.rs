//! Monitor records (`monitor_interval`, `monitor_file`, `sluice monitor start|stop`;
//! docs/architecture.md, "Seeing inside the switch"): one compact JSON line of every
//! counter per interval, appended to a file that is rotated before it grows past its bound.
//! `sluice report` reduces a record to interval tables and charts.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use tracing::{info, warn};

use crate::proto::{MonitorStatus, StatsReport};

/// What to record, where, how often, and how much at most.
pub use crate::config::MonitorSettings as MonitorSpec;

/// A snapshot source for the recorder.
pub type Source = dyn Fn() -> Result<StatsReport> + Send + Sync;

/// A running recorder.
pub struct Monitor {
    spec: MonitorSpec,
    stop: Arc<AtomicBool>,
    records: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

/// Opens `path` for appending, mode 0600, never through a symbolic link, and only if it is
/// a regular file.
fn open(path: &Path) -> Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("opening the monitor file {} (a symbolic link is refused)", path.display()))?;
    if !f.metadata()?.is_file() {
        bail!("the monitor file {} is not a regular file", path.display());
    }
    Ok(f)
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

impl Monitor {
    /// Starts recording: the file is opened now (an error is the caller's), then a thread
    /// appends a record every interval.
    pub fn start(spec: MonitorSpec, source: Arc<Source>) -> Result<Monitor> {
        if let Some(d) = spec.file.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        let mut file = open(&spec.file)?;
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
                    let mut l = serde_json::to_string(&serde_json::json!({"t": unix_now(), "stats": r}))?;
                    l.push('\n');
                    Ok(l)
                });
                let wrote = line.and_then(|l| {
                    let len = file.metadata()?.len();
                    if len > 0 && len + l.len() as u64 > s.max_bytes {
                        let old = PathBuf::from(format!("{}.1", s.file.display()));
                        std::fs::rename(&s.file, &old)
                            .with_context(|| format!("rotating {} to {}", s.file.display(), old.display()))?;
                        file = open(&s.file)?;
                    }
                    file.write_all(l.as_bytes()).context("writing a record")
                });
                match wrote {
                    Ok(()) => {
                        count.fetch_add(1, Ordering::Relaxed);
                        failing = false;
                    }
                    Err(e) if !failing => {
                        warn!(file = %s.file.display(), "monitor record lost: {e:#} (said once until it works again)");
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
