//! `sluice switch run`: the switch daemon.
//!
//! Four threads: the datapath (one epoll loop that owns the [`sluice_switch::Switch`] and
//! every port's descriptor), the control server (accepts CLI connections on the unix socket
//! and turns requests into jobs for the datapath), the signals thread (SIGINT/SIGTERM stop
//! the switch, SIGHUP reloads its file: see `reload.rs`), and the main thread, which waits
//! for the datapath to end and then removes the socket. The datapath never blocks on
//! anything but epoll; device creation (which may enter another network namespace) happens
//! on the control side.
//!
//! The service manager is told how it goes (`sluice_sys::notify`, a no-op outside a
//! `Type=notify` unit): READY=1 once the control socket listens and the file's ports are
//! attached, RELOADING=1 … READY=1 around a reload, STOPPING=1 when a stop begins.
//!
//! A stop (a signal, `sluice switch stop`) asks the datapath to end; if it has not within
//! [`STOP_WITHIN`], the process exits anyway, as after a crash: what the kernel datapath
//! holds is adopted by the next run.

mod child;
mod control;
mod datapath;
mod deadline;
pub mod error;
mod events;
mod evpn;
mod gateway;
pub mod kernel;
pub mod metrics;
mod monitor;
pub mod reload;
mod shaper;
mod state;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::mpsc;

use sluice_switch::Switch;
use sluice_sys::error::{Context, Failure, Report};
use tracing::info;

pub use datapath::Datapath;
pub use error::{Error, Result};
pub use reload::Source;
use sluice_api::config::Settings;
pub(crate) use state::Runtime;

/// Runs the switch described by `s` in the foreground until stopped (started without a
/// file: a reload has nothing to read).
pub fn run(s: Settings) -> Result<()> {
    run_from(s, None)
}

/// Runs the switch described by `s`, read from `source`, which a reload (SIGHUP) reads
/// again.
pub fn run_from(s: Settings, source: Option<Source>) -> Result<()> {
    let (notifier, bad_env) = sluice_sys::notify::Notifier::from_env();
    if let Some(w) = bad_env {
        tracing::warn!("{w}");
    }
    let notifier = std::sync::Arc::new(notifier);
    let as_read = s.clone();
    // The socket's directory (the run directory, unless the config says otherwise) is
    // walked and checked: made where missing, never one someone else can swap things in.
    if let Some(dir) = s.socket.parent().filter(|d| !d.as_os_str().is_empty()) {
        sluice_sys::fs::Dir::open(dir, Some(0o755)).map_err(|e| Failure::new("the control socket's directory", e))?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(&s.socket) {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if !t.is_socket() {
            let what = if t.is_symlink() {
                "a symbolic link"
            } else if t.is_dir() {
                "a directory"
            } else if t.is_file() {
                "a regular file"
            } else {
                "not a socket"
            };
            return Err(Error::NotASocket { path: s.socket.clone(), what });
        }
        if UnixStream::connect(&s.socket).is_ok() {
            return Err(Error::AlreadyRunning { name: s.name.clone(), socket: s.socket.clone() });
        }
        info!(socket = %s.socket.display(), "removing the socket a switch that did not stop cleanly left behind");
        std::fs::remove_file(&s.socket).with_context(|| format!("removing stale socket {}", s.socket.display()))?;
    }

    // The program a restart in place runs: this path read now, so that an upgraded binary
    // installed over it since is the one that starts (/proc/self/exe would be the old).
    let exe = std::env::current_exe().unwrap_or_else(|_| "/proc/self/exe".into());
    let signals = sluice_sys::proc::StopSignals::block();
    let sw = Switch::new(s.core.clone()).context("invalid switch settings")?;
    let (tx, rx) = mpsc::channel();
    let mut dp = Datapath::new(sw, rx, s.poll, s.datapath_nice).context("starting the datapath")?;
    if s.datapath == sluice_api::config::DatapathKind::Kernel {
        let k =
            kernel::KernelSide::start(&s.name, &s.core, dp.started()).map_err(|e| Error::KernelStart(Box::new(e)))?;
        dp.enable_kernel(k)?;
    }
    // What an earlier run (restarted in place, or crashed) left: its TAPs, still there for
    // their guests, are adopted; the ports it had attached beyond the file are attached
    // again, checked as `sluice port add` checks them.
    let mut runtime = state::Runtime::load(&s.name);
    let mut kept = state::Runtime::default();
    for p in &s.ports {
        let port = control::create_port(p, &s, runtime.known_tap(p))?;
        kept.record_tap(p, port.tap_ifindex());
        dp.attach(p.clone(), port).with_context(|| format!("attaching port {:?}", p.name))?;
    }
    for (vlan, mac, port) in &s.macs {
        dp.switch_mut().add_static_mac(*vlan, *mac, port)?;
    }
    dp.switch_mut().set_ct_max(s.conntrack_max);
    dp.switch_mut().acl_add_all(&s.acls).map_err(|(_, e)| e).context("the configuration's security-group rules")?;
    for (port, dir, action) in &s.acl_defaults {
        dp.switch_mut().acl_default(port, *dir, *action).context("a security-group default")?;
    }
    if let Some(a) = runtime.acl.take() {
        match dp.switch_mut().acl_replace(&a.rules, &a.defaults) {
            Ok(()) => {
                info!(switch = %s.name, rules = a.rules.len(), "the security groups as the earlier run changed them stand");
                kept.acl = Some(a);
            }
            Err(e) => {
                tracing::warn!("the security groups the earlier run recorded are refused ({e}); the file's stand")
            }
        }
    }
    runtime.ports.retain(|p| !s.ports.iter().any(|q| q.name == p.name));
    let mut s = s;
    if s.grants.is_some()
        && let Some(g) = runtime.grants.take()
    {
        info!(switch = %s.name, "the grants as the earlier run changed them stand");
        s.grants = Some(g.clone());
        kept.grants = Some(g);
    }
    let mut waiting = 0;
    for p in std::mem::take(&mut runtime.ports) {
        let checked = p
            .validate()
            .and_then(|_| s.grants.as_ref().map_or(Ok(()), |g| p.check_grants(g)))
            .and_then(|_| sluice_api::config::check_datapath(&p, s.datapath))
            .map_err(|m| Error::from(sluice_api::Error::Port(m)));
        let known = runtime.known_tap(&p);
        let attached = checked.and_then(|_| control::create_port(&p, &s, known)).and_then(|a| {
            let ifindex = a.tap_ifindex();
            dp.attach(p.clone(), a).map(|_| ifindex)
        });
        match attached {
            Ok(ifindex) => {
                kept.record_tap(&p, ifindex);
                kept.ports.push(p)
            }
            Err(e) => {
                tracing::warn!(port = %p.name, "not attaching again a port added at runtime: {}; it stays recorded and is tried again at the next start, or forgotten with `sluice port del {}`", Report(&e), p.name);
                waiting += 1;
                kept.ports.push(p)
            }
        }
    }
    for (vlan, mac, port) in runtime.macs {
        let ok = mac.parse().ok().is_some_and(|m| dp.switch_mut().add_static_mac(vlan, m, &port).is_ok());
        if ok {
            kept.macs.push((vlan, mac, port));
        }
    }
    // TAPs the earlier run made that no port took again (a port gone from the file): gone.
    for t in runtime.taps.iter().filter(|t| !kept.taps.iter().any(|k| k.name == t.name)) {
        if t.netns.as_deref().is_some_and(|n| !sluice_sys::netns::exists(n)) {
            continue;
        }
        let (name, ix) = (t.name.clone(), t.ifindex);
        match sluice_sys::netns::run_in(t.netns.as_deref(), move || sluice_sys::tun::remove_left_tap(&name, ix)) {
            Ok(true) => info!(tap = %t.name, "removed a TAP the earlier run left and no port uses"),
            Ok(false) => {}
            Err(e) => tracing::warn!(tap = %t.name, "cannot remove a TAP the earlier run left: {e}"),
        }
    }
    kept.save(&s.name);
    dp.finish_takeover();
    let waker = dp.waker();

    let metrics_listener = s.metrics_listen.map(metrics::bind).transpose()?;
    // (Port 0 in the file: the one the kernel gave is what `sluice stats` reports.)
    if let Some(l) = &metrics_listener {
        s.metrics_listen = Some(l.local_addr()?);
    }
    // The monitor file is checked (and refused, if it must be) before the socket exists.
    let monitor = s.monitor.clone().map(monitor::Opened::open).transpose()?;
    let listener = bind_owner_only(&s)?;
    // The gateway (a port, dnsmasq, the masquerade), once nothing else can refuse the start.
    let gateway = match s.gateway.clone().map(|g| gateway::Gateway::start(&s, &g, &mut dp)).transpose() {
        Ok(g) => g.map(std::sync::Arc::new),
        Err(e) => {
            let _ = std::fs::remove_file(&s.socket);
            return Err(e);
        }
    };
    let jobs = control::Jobs::new(tx, waker);
    // EVPN: the speaker and the agent, once the ports are attached.
    let evpn = match s.evpn.as_ref().map(|e| {
        let spec = s.ports.iter().find(|p| p.name == e.port).expect("the config names the EVPN port among its ports");
        let id = dp.switch().port_id(&spec.name).expect("the EVPN port is attached");
        evpn::Evpn::start(&s, e, spec, id, &mut dp, jobs.clone())
    }) {
        None => None,
        Some(Ok(e)) => Some(std::sync::Arc::new(e)),
        Some(Err(e)) => {
            if let Some(g) = &gateway {
                g.stop(true);
            }
            let _ = std::fs::remove_file(&s.socket);
            return Err(e);
        }
    };
    info!(switch = %s.name, socket = %s.socket.display(), mode = s.mode.as_str(), datapath = s.datapath.as_str(), lossless = s.core.lossless, poll = s.poll, ports = s.ports.len(), "switch started");

    let ctl = std::sync::Arc::new(control::Server {
        settings: s.clone(),
        jobs: jobs.clone(),
        grants: std::sync::Mutex::new(s.grants.clone()),
        state_lock: std::sync::Mutex::new(()),
        monitor: std::sync::Mutex::new(None),
        gateway: gateway.clone(),
        evpn: evpn.clone(),
    });
    if let Some(opened) = monitor {
        let started = monitor::Monitor::start(opened, ctl.monitor_source());
        let m = started.inspect_err(|_| {
            let _ = std::fs::remove_file(&s.socket);
        })?;
        *ctl.monitor.lock().unwrap_or_else(|p| p.into_inner()) = Some(m);
    }
    let served = ctl.clone();
    std::thread::Builder::new().name("control".into()).spawn(move || served.serve(listener))?;
    if let Some(l) = metrics_listener {
        let (jobs, st) = (jobs.clone(), s.clone());
        let source: std::sync::Arc<metrics::Source> = std::sync::Arc::new(move || {
            let r = control::stats_report(&jobs, &st, None)?;
            Ok((r, sluice_smc_launch::stats::read_stats().ok()))
        });
        metrics::serve(l, source)?;
    }
    let ready_line = |what: &str| format!("switch {}: {what}; control socket {}", s.name, s.socket.display());
    let attached = s.ports.len() + kept.ports.len() - waiting;
    let waiting =
        if waiting > 0 { format!(" ({waiting} added at runtime waiting to be attached again)") } else { String::new() };
    tell(notifier.ready(&ready_line(&format!("{attached} ports{waiting}"))));
    // (Said once: by the signals thread when a signal stops the switch, else at the end.)
    let stopping_said = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (sig_jobs, sig_socket, sig_notifier) = (jobs.clone(), s.socket.clone(), notifier.clone());
    let sig_said = stopping_said.clone();
    let (sig_name, sig_shown) = (s.name.clone(), s.socket.display().to_string());
    let mut reloader = reload::Reloader::new(source, as_read);
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        loop {
            let sig = signals.wait();
            if sig == sluice_sys::proc::RELOAD_SIGNAL {
                info!("reloading the configuration (SIGHUP)");
                tell(sig_notifier.reloading("reloading the configuration"));
                let what = match reloader.reload(&ctl) {
                    reload::Outcome::NoFile => "started without a file: nothing to reload".to_string(),
                    reload::Outcome::Refused(e) => format!("reload refused, running as before: {e}"),
                    reload::Outcome::Applied { changes, failed: 0 } => format!("reloaded ({changes} changes)"),
                    reload::Outcome::Applied { changes, failed } => {
                        format!("reloaded ({changes} changes, {failed} failed: see the log)")
                    }
                };
                tell(sig_notifier.ready(&format!("switch {sig_name}: {what}; control socket {sig_shown}")));
                continue;
            }
            info!(signal = sig, "stopping");
            sig_said.store(true, std::sync::atomic::Ordering::SeqCst);
            tell(sig_notifier.stopping("stopping"));
            sig_jobs.shutdown();
            exit_unless_stopped(sig_socket);
            return;
        }
    })?;

    let exit = std::thread::Builder::new()
        .name("datapath".into())
        .spawn(move || dp.run())?
        .join()
        .map_err(|_| sluice_sys::failure!("the datapath thread panicked"))??;
    let _ = std::fs::remove_file(&s.socket);
    if let Some(e) = &evpn {
        e.stop();
    }
    if let Some(g) = &gateway {
        g.stop(exit == datapath::Exit::Stop);
    }
    if exit == datapath::Exit::Stop {
        if !stopping_said.swap(true, std::sync::atomic::Ordering::SeqCst) {
            tell(notifier.stopping("stopping"));
        }
        state::Runtime::remove(&s.name);
    }
    if let datapath::Exit::Restart(upcall) = exit {
        info!(switch = %s.name, exe = %exe.display(), "restarting in place");
        // (The new image says READY=1 again once it serves.)
        tell(notifier.reloading("restarting in place"));
        use std::os::unix::process::CommandExt;
        let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
        // (Gone since, say removed by hand: the running image starts again.)
        let exe = if exe.exists() { exe } else { "/proc/self/exe".into() };
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(&args);
        match upcall {
            Some(fd) => cmd.env(kernel::UPCALL_FD_ENV, fd.to_string()),
            None => cmd.env_remove(kernel::UPCALL_FD_ENV),
        };
        let err = cmd.exec();
        sluice_sys::bail!(
            "restarting switch {:?} in place ({}) failed: {err}; start it again with `sluice switch run`",
            s.name,
            exe.display()
        );
    }
    info!(switch = %s.name, "switch stopped");
    Ok(())
}

/// Logs what the service manager could not be told (it never stops the switch).
fn tell(said: std::result::Result<(), String>) {
    if let Err(e) = said {
        tracing::warn!("{e}");
    }
}

/// How long a stop may take before the process exits without the datapath.
const STOP_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// Once a stop was asked for: exits the process (removing its control socket at `socket`)
/// if it is still running [`STOP_WITHIN`] from now — the datapath did not answer.
pub(crate) fn exit_unless_stopped(socket: std::path::PathBuf) {
    let watchdog = std::thread::Builder::new().name("stop-watchdog".into()).spawn(move || {
        std::thread::sleep(STOP_WITHIN);
        tracing::error!(
            "the datapath did not stop within {} s; exiting without it (the next run adopts what the kernel datapath holds)",
            STOP_WITHIN.as_secs()
        );
        let _ = std::fs::remove_file(&socket);
        std::process::exit(1);
    });
    if watchdog.is_err() {
        tracing::warn!("cannot watch the stop: it waits for the datapath however long that takes");
    }
}

fn bind_owner_only(s: &Settings) -> Result<UnixListener> {
    // Bind with a restrictive umask so the socket is never reachable by others, even
    // briefly; then make the mode explicit.
    let l = sluice_sys::proc::with_umask(0o177, || UnixListener::bind(&s.socket));
    let l = l.with_context(|| format!("binding the control socket {}", s.socket.display()))?;
    std::fs::set_permissions(&s.socket, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}
