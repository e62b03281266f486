//! A program the daemon runs and supervises as its child (dnsmasq for a gateway, gobgpd
//! for EVPN): started in a network namespace of the caller's choosing, its stderr read into
//! the daemon's log, started again after 1, 2, 4 … 60 s when it exits (back to 1 s once it
//! ran a minute), and given up after [`MAX_QUICK_EXITS`] exits in a row that each came
//! within a minute of their start. Stopping sends SIGTERM, then SIGKILL after
//! [`TERM_WITHIN`].

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tracing::{info, warn};

/// Exits in a row, each within a minute of its start, after which a child is given up.
pub const MAX_QUICK_EXITS: u32 = 10;
/// The longest wait before starting it again.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// A run this long resets the back-off.
const RAN_LONG: Duration = Duration::from_secs(60);
/// How long a child has to end after SIGTERM before SIGKILL.
pub const TERM_WITHIN: Duration = Duration::from_secs(5);
/// Lines of its stderr kept to say why it exited.
const LAST_LINES: usize = 5;
/// The longest stderr line read whole.
const MAX_LINE: u64 = 4096;

/// What to run.
#[derive(Clone, Debug)]
pub struct Program {
    /// Its name in the log (`dnsmasq`).
    pub label: &'static str,
    /// The executable.
    pub path: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// The network namespace it runs in (a name under /run/netns or a path; `None`: the
    /// daemon's).
    pub netns: Option<String>,
    /// The switch it serves, for the log.
    pub switch: String,
    /// It logs to stdout (gobgpd), not stderr (dnsmasq): that is the stream read into the
    /// daemon's log.
    pub log_stdout: bool,
    /// Files an earlier run of it may have left that would stop it starting (a Unix
    /// socket it listens on, after a SIGKILL), removed before each start: each in a
    /// directory only root can write.
    pub leftovers: Vec<PathBuf>,
}

/// A supervised child's state.
#[derive(Clone, Debug, Default)]
pub struct Status {
    /// `running`, `restarting`, `stopped` or `failed`.
    pub state: &'static str,
    /// Its pid while it runs.
    pub pid: Option<u32>,
    /// Times it was started again.
    pub restarts: u64,
    /// Why it last exited.
    pub last_exit: Option<String>,
    /// Times it was started (the first included): a new start means a new process.
    pub starts: u64,
}

#[derive(Default)]
struct State {
    stopping: bool,
    status: Status,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits up to `d` for a stop; true when one was asked for.
    fn wait_stop(&self, d: Duration) -> bool {
        let g = self.lock();
        let (g, _) = self.wake.wait_timeout_while(g, d, |s| !s.stopping).unwrap_or_else(|p| p.into_inner());
        g.stopping
    }
}

/// A child under supervision: it runs until [`Supervisor::stop`].
pub struct Supervisor {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Supervisor {
    /// Starts `p` and supervises it on a thread of its own.
    pub fn start(p: Program) -> std::io::Result<Supervisor> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State { stopping: false, status: Status { state: "stopped", ..Status::default() } }),
            wake: Condvar::new(),
        });
        let sh = shared.clone();
        // (The supervisor's thread enters the namespace and forks the child there: the
        // child's parent-death signal is tied to that thread.)
        let ns = p.netns.as_deref().map(sluice_sys::netns::open).transpose()?;
        let t = std::thread::Builder::new().name(p.label.into()).spawn(move || {
            if let Some(ns) = ns
                && let Err(e) = sluice_sys::netns::enter(&ns)
            {
                let mut st = sh.lock();
                st.status.state = "failed";
                st.status.last_exit = Some(format!("cannot enter its network namespace: {e}"));
                tracing::error!(switch = %p.switch, "{}: cannot enter network namespace {:?}: {e}", p.label, p.netns);
                return;
            }
            supervise(&sh, &p)
        })?;
        Ok(Supervisor { shared, thread: Mutex::new(Some(t)) })
    }

    /// Its state now.
    pub fn status(&self) -> Status {
        self.shared.lock().status.clone()
    }

    /// Stops it and waits for the supervisor to end (at most [`TERM_WITHIN`] and a little).
    pub fn stop(&self) {
        self.shared.lock().stopping = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts `p`: in its namespace, stderr piped, its signal mask cleared, and SIGTERM when
/// the thread that started it (the supervisor's) ends. The kernel clears that parent-death
/// signal when a program changes its credentials (dnsmasq drops to its user), so then it
/// covers the start only; the service manager, which stops the unit's whole cgroup, covers
/// the rest.
fn spawn(p: &Program) -> std::io::Result<Child> {
    for f in &p.leftovers {
        let _ = std::fs::remove_file(f);
    }
    {
        let mut cmd = Command::new(&p.path);
        cmd.args(&p.args).stdin(Stdio::null());
        if p.log_stdout {
            cmd.stdout(Stdio::piped()).stderr(Stdio::null());
        } else {
            cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        }
        // SAFETY: the closure runs in the child between fork and exec and calls only
        // sigemptyset, sigprocmask, prctl and getppid, all async-signal-safe, on a set of
        // its own stack; it allocates nothing.
        unsafe {
            let parent = libc::getpid();
            cmd.pre_exec(move || {
                // (The daemon blocks its stop signals in every thread, for its signals
                // thread; the mask is inherited, and the child must hear SIGTERM.)
                let mut none: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut none);
                if libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // (The parent died before the prctl: nobody would stop this one.)
                if libc::getppid() != parent {
                    return Err(std::io::Error::other("the daemon is gone"));
                }
                Ok(())
            });
        }
        cmd.spawn()
    }
}

/// Sends `sig` to child `c`, which has not been waited for (so its pid is still its own).
fn signal(c: &Child, sig: i32) {
    if let Ok(pid) = i32::try_from(c.id()) {
        // SAFETY: kill with a pid of our unreaped child and a plain signal number.
        unsafe { libc::kill(pid, sig) };
    }
}

/// Reads a child's log stream into the daemon's log, keeping its last lines in `last`.
fn read_stderr(
    r: impl Read,
    label: &'static str,
    switch: String,
    last: Arc<Mutex<std::collections::VecDeque<String>>>,
) {
    let mut r = BufReader::new(r);
    loop {
        let mut line = Vec::new();
        match r.by_ref().take(MAX_LINE).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line).trim_end().to_string();
        if text.is_empty() {
            continue;
        }
        info!(switch = %switch, "{label}: {text}");
        let mut l = last.lock().unwrap_or_else(|p| p.into_inner());
        if l.len() == LAST_LINES {
            l.pop_front();
        }
        l.push_back(text);
    }
}

/// Runs `p` until stopped, starting it again with back-off when it exits.
fn supervise(sh: &Shared, p: &Program) {
    let (label, switch) = (p.label, p.switch.as_str());
    let mut delay = Duration::from_secs(1);
    let mut quick = 0;
    loop {
        if sh.lock().stopping {
            break;
        }
        let started = Instant::now();
        let why = match spawn(p) {
            Err(e) => format!("could not start ({}): {e}", p.path.display()),
            Ok(mut child) => {
                {
                    let mut st = sh.lock();
                    st.status.state = "running";
                    st.status.pid = Some(child.id());
                    st.status.starts += 1;
                }
                info!(switch, pid = child.id(), "{label} started");
                let last = Arc::new(Mutex::new(std::collections::VecDeque::new()));
                let log: Option<Box<dyn Read + Send>> = if p.log_stdout {
                    child.stdout.take().map(|o| Box::new(o) as Box<dyn Read + Send>)
                } else {
                    child.stderr.take().map(|e| Box::new(e) as Box<dyn Read + Send>)
                };
                let reader = log.map(|e| {
                    let (sw, l) = (switch.to_string(), last.clone());
                    std::thread::Builder::new().name(format!("{label}-log")).spawn(move || read_stderr(e, label, sw, l))
                });
                let status = loop {
                    match child.try_wait() {
                        Ok(Some(st)) => break Some(st),
                        Ok(None) => {}
                        Err(e) => {
                            warn!(switch, "cannot wait for {label}: {e}");
                            break None;
                        }
                    }
                    if sh.wait_stop(Duration::from_millis(100)) {
                        end(&mut child, label, switch);
                        break None;
                    }
                };
                if let Some(Ok(t)) = reader {
                    let _ = t.join();
                }
                let Some(status) = status else {
                    let mut st = sh.lock();
                    (st.status.state, st.status.pid) = ("stopped", None);
                    return;
                };
                let lines: Vec<String> = last.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect();
                let said =
                    if lines.is_empty() { String::new() } else { format!("; its last words: {}", lines.join(" | ")) };
                format!("exited ({status}) after {} s{said}", started.elapsed().as_secs())
            }
        };
        if started.elapsed() >= RAN_LONG {
            delay = Duration::from_secs(1);
            quick = 0;
        }
        quick += 1;
        {
            let mut st = sh.lock();
            st.status.pid = None;
            st.status.last_exit = Some(why.clone());
            st.status.state = if quick >= MAX_QUICK_EXITS { "failed" } else { "restarting" };
        }
        if quick >= MAX_QUICK_EXITS {
            tracing::error!(
                switch,
                "{label} {why}; given up after {quick} exits in a row within a minute of their start: fix what its log says and restart the switch (`sluice switch restart`)"
            );
            return;
        }
        warn!(switch, "{label} {why}; starting it again in {} s", delay.as_secs());
        if sh.wait_stop(delay) {
            sh.lock().status.state = "stopped";
            return;
        }
        sh.lock().status.restarts += 1;
        delay = (delay * 2).min(MAX_BACKOFF);
    }
}

/// Ends a child: SIGTERM, then SIGKILL when it has not exited within [`TERM_WITHIN`].
fn end(c: &mut Child, label: &str, switch: &str) {
    signal(c, libc::SIGTERM);
    let until = Instant::now() + TERM_WITHIN;
    while Instant::now() < until {
        if let Ok(Some(_)) = c.try_wait() {
            info!(switch, "{label} stopped");
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    warn!(switch, "{label} did not end within {} s of SIGTERM: killed", TERM_WITHIN.as_secs());
    let _ = c.kill();
    let _ = c.wait();
}
