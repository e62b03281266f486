//! The host-local rendezvous registry: files under the runtime directory that every
//! network namespace of the host sees (docs/architecture.md, "Capability").
//!
//! - `smc/listen/KEY_PORT.NETNS.PID` — a sluice listener (KEY: the address, `any4` or
//!   `any6` for wildcards); its side door is `smc/door/PID.sock`.
//! - `smc/intent/CPORT_SADDR_SPORT` — a client under the launcher is about to connect
//!   from port CPORT to SADDR:SPORT and will propose shared memory: the server's `accept`
//!   waits for that proposal instead of deciding "plain TCP" at once.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use crate::sys;

fn dir(sub: &str) -> PathBuf {
    crate::run_dir().join("smc").join(sub)
}

fn key(ip: IpAddr) -> String {
    if ip.is_unspecified() {
        return if ip.is_ipv4() { "any4".into() } else { "any6".into() };
    }
    ip.to_string().replace(':', "-")
}

/// The side door of process `pid`.
pub fn door_path(pid: u32) -> PathBuf {
    dir("door").join(format!("{pid}.sock"))
}

/// Announces a listener on `addr`; returns the entry to remove when it closes.
pub fn register_listener(addr: SocketAddr) -> Option<PathBuf> {
    let d = dir("listen");
    std::fs::create_dir_all(&d).ok()?;
    let p = d.join(format!("{}_{}.{}.{}", key(addr.ip()), addr.port(), sys::netns_inode(), sys::pid()));
    std::fs::write(&p, b"").ok()?;
    Some(p)
}

/// Sluice listeners that may be behind `dst`: (pid, network namespace inode).
pub fn listeners_for(dst: SocketAddr) -> Vec<(u32, u64)> {
    let Ok(rd) = std::fs::read_dir(dir("listen")) else { return Vec::new() };
    let port = dst.port();
    let mut keys = vec![format!("{}_{port}.", key(dst.ip()))];
    if dst.is_ipv4() {
        keys.push(format!("any4_{port}."));
    }
    // A dual-stack IPv6 wildcard listener also takes IPv4 connections.
    keys.push(format!("any6_{port}."));
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(k) = keys.iter().find(|k| name.starts_with(k.as_str())) else { continue };
        let mut rest = name[k.len()..].split('.');
        let (Some(ns), Some(pid)) =
            (rest.next().and_then(|x| x.parse().ok()), rest.next().and_then(|x| x.parse().ok()))
        else {
            continue;
        };
        if !sys::alive(pid) {
            let _ = std::fs::remove_file(e.path());
            continue;
        }
        if !out.contains(&(pid, ns)) {
            out.push((pid, ns));
        }
    }
    out
}

fn intent_path(client_port: u16, server: SocketAddr) -> PathBuf {
    dir("intent").join(format!("{client_port}_{}_{}", key(server.ip()), server.port()))
}

/// Says a proposal is coming for the connection from `client_port` to `server`.
pub fn announce(client_port: u16, server: SocketAddr) -> Option<PathBuf> {
    let d = dir("intent");
    std::fs::create_dir_all(&d).ok()?;
    let p = intent_path(client_port, server);
    std::fs::write(&p, sys::pid().to_string()).ok()?;
    Some(p)
}

/// True when a client announced a proposal for this connection.
pub fn announced(client: SocketAddr, server: SocketAddr) -> bool {
    intent_path(client.port(), server).exists()
}
