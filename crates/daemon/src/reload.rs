//! A configuration reloaded while the switch runs (SIGHUP, `sluice switch reload`): the
//! file the switch was started with is read again and checked whole — a bad one is refused
//! with its line and changes nothing — then the difference from what runs is applied as
//! the control jobs `sluice port del`/`port add` run, one port at a time, while every
//! other port keeps forwarding.
//!
//! [`Plan::between`] is the difference, pure: ports removed, ports changed (removed and
//! added again), ports added; static MAC entries removed and added; the settings that can
//! change live (the MAC aging time, the stations one port may learn) and those that cannot
//! (they are logged and kept until a restart). Ports added at runtime (`sluice port add`)
//! are not the file's: a reload leaves them alone, unless the file now names one, which
//! the file then takes over.

use std::path::PathBuf;

use sluice_api::config::{DatapathKind, PortSpec, Settings};
use sluice_api::proto::Request;
use sluice_wire::MacAddr;
use tracing::{info, warn};

use crate::control::Server;

/// Where a switch's settings come from, to be read again at a reload: its file and the
/// command line's overrides of it.
#[derive(Clone, Debug)]
pub struct Source {
    /// The configuration file (`switch run --config FILE`).
    pub file: PathBuf,
    /// `--poll`: busy-poll even if the file does not say so.
    pub poll: bool,
    /// `--datapath`: overrides the file's.
    pub datapath: Option<DatapathKind>,
    /// `--metrics`: overrides the file's `metrics_listen`.
    pub metrics: Option<std::net::SocketAddr>,
    /// `--vhost-allow-user`, resolved: replaces the file's `vhost_allow_users`.
    pub vhost_allow_users: Option<Vec<u32>>,
    /// `--vhost-allow-group`, resolved: replaces the file's `vhost_allow_groups`.
    pub vhost_allow_groups: Option<Vec<u32>>,
}

impl Source {
    /// Reads and checks the settings as `switch run` does before it touches the system:
    /// the file, the overrides, the core's own checks. The error names the file (and line)
    /// and what to change.
    pub fn read(&self) -> Result<Settings, String> {
        let mut s = sluice_api::config::load(&self.file).map_err(|e| e.to_string())?;
        s.poll |= self.poll;
        if let Some(m) = self.metrics {
            s.metrics_listen = Some(m);
        }
        if let Some(u) = &self.vhost_allow_users {
            s.vhost_allow.users = u.clone();
        }
        if let Some(g) = &self.vhost_allow_groups {
            s.vhost_allow.groups = g.clone();
        }
        let at = self.file.display();
        if let Some(d) = self.datapath {
            s.datapath = d;
            sluice_api::config::check_lossless(s.datapath, s.core.lossless).map_err(|e| format!("{at}: {e}"))?;
            for p in &s.ports {
                sluice_api::config::check_datapath(p, s.datapath).map_err(|e| format!("{at}: {e}"))?;
            }
        }
        sluice_switch::Switch::new(s.core.clone()).map_err(|e| format!("{at}: {e}"))?;
        Ok(s)
    }
}

/// What a reload changes, decided from the settings that run and those just read.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// File ports gone from the file: deleted.
    pub remove: Vec<String>,
    /// File ports whose table changed: deleted and added again as the file says now.
    pub change: Vec<PortSpec>,
    /// Ports new in the file: added.
    pub add: Vec<PortSpec>,
    /// Ports added at runtime that the file now names the same way: from now on the
    /// file's (nothing is done to the port).
    pub adopt: Vec<String>,
    /// Ports added at runtime that the file now names otherwise: deleted, then added as
    /// the file says (they are in `change` too).
    pub take_over: Vec<String>,
    /// Static MAC entries of the file that are gone or whose port changed: removed.
    pub macs_removed: Vec<(u16, MacAddr, String)>,
    /// Static MAC entries to add (new ones, and those of ports deleted and added again).
    pub macs_added: Vec<(u16, MacAddr, String)>,
    /// The MAC aging time (ms) and the per-port station limit, when either changed.
    pub learning: Option<(u64, usize)>,
    /// Settings that changed in the file but cannot change while the switch runs: kept
    /// until a restart (each with what it is now and what the file says).
    pub kept: Vec<String>,
}

impl Plan {
    /// The difference between `old` (the file as applied) and `new`, given the ports
    /// added at runtime, `runtime`.
    pub fn between(old: &Settings, new: &Settings, runtime: &[PortSpec]) -> Plan {
        let mut p = Plan::default();
        for o in &old.ports {
            match new.ports.iter().find(|n| n.name == o.name) {
                None => p.remove.push(o.name.clone()),
                Some(n) if n != o => p.change.push(n.clone()),
                Some(_) => {}
            }
        }
        for n in new.ports.iter().filter(|n| !old.ports.iter().any(|o| o.name == n.name)) {
            match runtime.iter().find(|r| r.name == n.name) {
                Some(r) if r == n => p.adopt.push(n.name.clone()),
                Some(_) => {
                    p.take_over.push(n.name.clone());
                    p.change.push(n.clone());
                }
                None => p.add.push(n.clone()),
            }
        }
        let bounced = |port: &str| p.remove.iter().any(|r| r == port) || p.change.iter().any(|c| c.name == port);
        // (A deleted port's entries go with it; those of a port added again come back.)
        for m in old.macs.iter().filter(|m| !new.macs.contains(m) && !bounced(&m.2)) {
            p.macs_removed.push(m.clone());
        }
        for m in &new.macs {
            let fresh = !old.macs.contains(m);
            if fresh || bounced(&m.2) {
                p.macs_added.push(m.clone());
            }
        }
        let (oc, nc) = (&old.core, &new.core);
        if (oc.aging_ms, oc.port_mac_limit) != (nc.aging_ms, nc.port_mac_limit) {
            p.learning = Some((nc.aging_ms, nc.port_mac_limit));
        }
        let mut kept = |what: &str, was: String, now: String| {
            if was != now {
                p.kept.push(format!("{what} ({was} now, {now} in the file)"));
            }
        };
        kept("name", old.name.clone(), new.name.clone());
        kept("mode", old.mode.as_str().into(), new.mode.as_str().into());
        kept("datapath", old.datapath.as_str().into(), new.datapath.as_str().into());
        kept("socket", old.socket.display().to_string(), new.socket.display().to_string());
        kept("mtu", oc.mtu.to_string(), nc.mtu.to_string());
        kept("lossless", oc.lossless.to_string(), nc.lossless.to_string());
        kept("queue_len", oc.queue_len.to_string(), nc.queue_len.to_string());
        kept("hold_len", oc.hold_len.to_string(), nc.hold_len.to_string());
        kept("batch", oc.batch.to_string(), nc.batch.to_string());
        kept("mac_table_size", oc.fib_max.to_string(), nc.fib_max.to_string());
        kept("watchdog_ms", oc.watchdog_ms.to_string(), nc.watchdog_ms.to_string());
        kept("router_mac", oc.router_mac.to_string(), nc.router_mac.to_string());
        let classes = |c: &[sluice_switch::class::ClassConfig]| format!("{c:?}");
        if oc.classes != nc.classes {
            kept("class", classes(&oc.classes), classes(&nc.classes));
        }
        kept("poll", old.poll.to_string(), new.poll.to_string());
        kept("datapath_nice", old.datapath_nice.to_string(), new.datapath_nice.to_string());
        let listen = |a: Option<std::net::SocketAddr>| a.map_or("off".into(), |a| a.to_string());
        kept("metrics_listen", listen(old.metrics_listen), listen(new.metrics_listen));
        let monitor = |m: &Option<sluice_api::config::MonitorSettings>| format!("{m:?}");
        if old.monitor != new.monitor {
            kept("monitor_file", monitor(&old.monitor), monitor(&new.monitor));
        }
        let grants = |g: &Option<sluice_api::config::Grants>| format!("{g:?}");
        if old.grants != new.grants {
            kept("grants (`sluice grant` changes them live)", grants(&old.grants), grants(&new.grants));
        }
        // Security groups: a restart applies the file's, `sluice acl` changes them live.
        kept("conntrack_max", old.conntrack_max.to_string(), new.conntrack_max.to_string());
        if old.acls != new.acls || old.acl_defaults != new.acl_defaults {
            let n = |s: &Settings| format!("{} rules, {} defaults", s.acls.len(), s.acl_defaults.len());
            kept("[[acl]] (`sluice acl` changes them live)", n(old), format!("{}, changed", n(new)));
        }
        // The gateway (address, range, DNS, uplink): its port, dnsmasq and table are made at
        // start, so a change takes a restart (`sluice switch restart` keeps the guests).
        let gateway = |g: &Option<sluice_api::config::GatewaySettings>| match g {
            None => "none".to_string(),
            Some(g) => format!("{}/{}, DHCP {}-{}", g.address, g.prefix, g.range.0, g.range.1),
        };
        if old.gateway != new.gateway {
            let (was, now) = (gateway(&old.gateway), gateway(&new.gateway));
            p.kept.push(format!(
                "gateway ({was} now, {now} in the file{})",
                if was == now { "; other gateway settings differ" } else { "" }
            ));
        }
        p
    }

    /// True when it changes nothing.
    pub fn is_empty(&self) -> bool {
        let Plan { remove, change, add, adopt, take_over: _, macs_removed, macs_added, learning, kept: _ } = self;
        remove.is_empty()
            && change.is_empty()
            && add.is_empty()
            && adopt.is_empty()
            && macs_removed.is_empty()
            && macs_added.is_empty()
            && learning.is_none()
    }
}

/// A running switch's reloads: where its settings come from, and the file's settings as
/// last applied.
pub struct Reloader {
    source: Option<Source>,
    applied: Settings,
}

/// How a reload ended, for the service manager's status line.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing to read: the switch was started without a file.
    NoFile,
    /// The file was refused (the reason names its line); nothing changed.
    Refused(String),
    /// Applied; how many steps failed (each was logged).
    Applied { changes: usize, failed: usize },
}

impl Reloader {
    /// Reloads of a switch started from `source` (`None`: from flags alone) with `applied`.
    pub fn new(source: Option<Source>, applied: Settings) -> Reloader {
        Reloader { source, applied }
    }

    /// Reads the file again and applies the difference through `server`'s jobs.
    pub fn reload(&mut self, server: &Server) -> Outcome {
        let Some(src) = &self.source else {
            info!("reload asked for, but this switch was started without a configuration file: nothing to read again");
            return Outcome::NoFile;
        };
        let new = match src.read() {
            Ok(s) => s,
            Err(e) => {
                warn!("reload refused, the switch is unchanged: {e}");
                return Outcome::Refused(e);
            }
        };
        let runtime = server.runtime_ports();
        let plan = Plan::between(&self.applied, &new, &runtime);
        for k in &plan.kept {
            warn!(file = %src.file.display(), "{k} cannot change while the switch runs: kept until `sluice switch stop` and `switch run`");
        }
        let (changes, failed) = apply(server, &plan, &mut self.applied, &new);
        info!(file = %src.file.display(), changes, failed, "configuration reloaded");
        Outcome::Applied { changes, failed }
    }
}

/// Applies `plan` through `server`; `applied` becomes what now runs of `new`. Returns how
/// many steps were taken and how many failed.
fn apply(server: &Server, plan: &Plan, applied: &mut Settings, new: &Settings) -> (usize, usize) {
    let (mut done, mut failed) = (0, 0);
    let mut step = |what: String, r: crate::Result<()>| match r {
        Ok(()) => {
            info!("reload: {what}");
            done += 1;
            true
        }
        Err(e) => {
            warn!("reload: {what} failed: {}", sluice_sys::error::Report(&e));
            failed += 1;
            false
        }
    };
    for m in &plan.macs_removed {
        let req = Request::FibDel { mac: m.1.to_string(), vlan: m.0 };
        step(format!("static MAC {} in VLAN {} removed", m.1, m.0), server.execute(req).map(|_| ()));
    }
    for name in &plan.remove {
        if step(format!("port {name} deleted"), del(server, name)) {
            applied.ports.retain(|p| &p.name != name);
        }
    }
    for name in &plan.adopt {
        server.forget_runtime_port(name);
        if let Some(spec) = new.ports.iter().find(|p| &p.name == name) {
            applied.ports.push(spec.clone());
        }
        step(format!("port {name}, added at runtime, is the file's from now on"), Ok(()));
    }
    for spec in &plan.change {
        let name = &spec.name;
        if !step(format!("port {name} deleted to be added as the file says now"), del(server, name)) {
            continue;
        }
        applied.ports.retain(|p| &p.name != name);
        if step(format!("port {name} added again as the file says"), add(server, spec)) {
            applied.ports.push(spec.clone());
        }
    }
    for spec in &plan.add {
        if step(format!("port {} added", spec.name), add(server, spec)) {
            applied.ports.push(spec.clone());
        }
    }
    for m in &plan.macs_added {
        let (vlan, mac, port) = (m.0, m.1, m.2.clone());
        let r = server.jobs.run(move |dp| dp.switch_mut().add_static_mac(vlan, mac, &port));
        let r = r.and_then(|r| r.map_err(crate::Error::from));
        step(format!("static MAC {} in VLAN {} on port {} added", m.1, m.0, m.2), r);
    }
    if let Some((aging, limit)) = plan.learning {
        let r = server.jobs.run(move |dp| {
            dp.switch_mut().set_learning(aging, limit);
            dp.sync_kernel();
        });
        step(format!("MAC aging {} s and at most {limit} stations learned per port", aging / 1000), r);
        applied.core.aging_ms = aging;
        applied.core.port_mac_limit = limit;
    }
    applied.macs = new.macs.clone();
    (done, failed)
}

/// Deletes port `name` as `sluice port del` does.
fn del(server: &Server, name: &str) -> crate::Result<()> {
    server.execute(Request::PortDel { name: name.to_string(), if_exists: false }).map(|_| ())
}

/// Adds port `spec` as `sluice port add` does, as one of the file's (not recorded as added
/// at runtime).
fn add(server: &Server, spec: &PortSpec) -> crate::Result<()> {
    server.execute(Request::PortAdd { port: Box::new(spec.clone()), may_exist: false })?;
    server.forget_runtime_port(&spec.name);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(text: &str) -> Settings {
        sluice_api::config::parse(text, std::path::Path::new("s.toml")).unwrap()
    }

    const BASE: &str = "name = \"sw\"\n\
        [[port]]\nname = \"a\"\n\
        [[port]]\nname = \"b\"\nvlan = 10\n\
        [[port]]\nname = \"c\"\n\
        [[mac]]\nmac = \"02:00:00:00:00:0a\"\nport = \"a\"\n\
        [[mac]]\nmac = \"02:00:00:00:00:0b\"\nport = \"b\"\nvlan = 10\n";

    #[test]
    fn the_same_file_changes_nothing() {
        let p = Plan::between(&settings(BASE), &settings(BASE), &[]);
        assert!(p.is_empty() && p.kept.is_empty(), "{p:?}");
    }

    #[test]
    fn ports_removed_changed_and_added_are_told_apart_and_others_untouched() {
        let new = "name = \"sw\"\nmac_aging = 60\n\
            [[port]]\nname = \"a\"\n\
            [[port]]\nname = \"b\"\nvlan = 20\n\
            [[port]]\nname = \"d\"\n\
            [[mac]]\nmac = \"02:00:00:00:00:0a\"\nport = \"a\"\n\
            [[mac]]\nmac = \"02:00:00:00:00:0b\"\nport = \"b\"\nvlan = 20\n\
            [[mac]]\nmac = \"02:00:00:00:00:0d\"\nport = \"d\"\n";
        let p = Plan::between(&settings(BASE), &settings(new), &[]);
        assert_eq!(p.remove, ["c"]);
        assert_eq!(p.change.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["b"]);
        assert_eq!(p.add.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["d"]);
        // b's old entry goes with the port; its new one and d's are added; a's stays.
        assert!(p.macs_removed.is_empty(), "{:?}", p.macs_removed);
        let added: Vec<_> = p.macs_added.iter().map(|m| (m.0, m.2.as_str())).collect();
        assert_eq!(added, [(20, "b"), (1, "d")]);
        assert_eq!(p.learning, Some((60_000, sluice_switch::SwitchConfig::default().port_mac_limit)));
        assert!(p.kept.is_empty(), "{:?}", p.kept);
    }

    #[test]
    fn a_static_mac_removed_from_a_port_that_stays_is_removed() {
        let new = BASE.replace("[[mac]]\nmac = \"02:00:00:00:00:0a\"\nport = \"a\"\n", "");
        let p = Plan::between(&settings(BASE), &settings(&new), &[]);
        assert_eq!(p.macs_removed.len(), 1);
        assert_eq!(p.macs_removed[0].2, "a");
        assert!(p.macs_added.is_empty() && p.remove.is_empty() && p.change.is_empty());
    }

    #[test]
    fn settings_that_cannot_change_live_are_named_and_kept() {
        let new = BASE.replace("name = \"sw\"\n", "name = \"sw\"\nmode = \"l3\"\nmtu = 9000\nmac_limit_per_port = 5\n");
        let p = Plan::between(&settings(BASE), &settings(&new), &[]);
        let kept = p.kept.join("; ");
        assert!(kept.contains("mode (l2 now, l3 in the file)") && kept.contains("mtu (1500 now, 9000"), "{kept}");
        assert_eq!(p.learning, Some((300_000, 5)));
        assert!(p.remove.is_empty() && p.add.is_empty() && p.change.is_empty());
    }

    #[test]
    fn the_file_takes_over_a_runtime_port_it_now_names() {
        let runtime = [PortSpec::tap("d"), PortSpec { vlan: Some(7), ..PortSpec::tap("e") }];
        let new = format!("{BASE}[[port]]\nname = \"d\"\n[[port]]\nname = \"e\"\n");
        let p = Plan::between(&settings(BASE), &settings(&new), &runtime);
        assert_eq!(p.adopt, ["d"], "the same table: the port stays as it is");
        assert_eq!(p.take_over, ["e"]);
        assert_eq!(p.change.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["e"]);
        assert!(p.add.is_empty());
    }

    #[test]
    fn a_changed_gateway_is_kept_until_a_restart() {
        let old = settings("name = \"sw\"\ngateway = \"10.77.0.254/24\"\n");
        let new = settings("name = \"sw\"\ngateway = \"10.78.0.254/24\"\n");
        let p = Plan::between(&old, &new, &[]);
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(p.kept, vec!["gateway (10.77.0.254/24, DHCP 10.77.0.1-10.77.0.253 now, 10.78.0.254/24, DHCP 10.78.0.1-10.78.0.253 in the file)".to_string()]);
        let off = settings("name = \"sw\"\n");
        assert!(Plan::between(&old, &off, &[]).kept[0].contains("none in the file"));
        assert!(Plan::between(&old, &old, &[]).kept.is_empty());
    }
}
