//! What the runtime hands the plugin: the network configuration on stdin (JSON) and the
//! `CNI_*` environment, both checked before anything is touched; and the names the plugin
//! derives from them (the container's switch port, the network's gateway port).

use std::path::PathBuf;

use serde::Deserialize;
use serde_json::Value;

use crate::error::{CniError, DECODE, INVALID_CONFIG, INVALID_ENV, Result};

/// The most of stdin read: a network configuration is a few KiB.
pub const MAX_CONFIG: u64 = 1 << 20;

/// The plugin's keys of the network configuration (others — `args`, `runtimeConfig`,
/// `capabilities`, a runtime's own — are ignored, as the specification allows).
#[derive(Debug, Deserialize)]
pub struct NetConf {
    /// The CNI version the result is written in.
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    /// The network's name.
    pub name: String,
    /// The switch, by name (its socket is /run/sluice/NAME.sock); default: the only one
    /// running.
    #[serde(default)]
    pub switch: Option<String>,
    /// The switch's control socket, when it is not in the default place.
    #[serde(default)]
    pub socket: Option<PathBuf>,
    /// Masquerade the container's addresses to destinations outside its subnet.
    #[serde(rename = "ipMasq", default)]
    pub ip_masq: bool,
    /// Give the host the IPAM result's gateway address on an interface attached to the
    /// switch (default true), so that containers reach the host and route through it.
    #[serde(rename = "hostGateway", default = "yes")]
    pub host_gateway: bool,
    /// The host's interface carrying the gateway address; default `sl` + 12 hex digits of
    /// the network name's hash.
    #[serde(rename = "hostInterface", default)]
    pub host_interface: Option<String>,
    /// The container's port's MTU; the switch's by default.
    #[serde(default)]
    pub mtu: Option<u16>,
    /// The container's port's access VLAN (default 1).
    #[serde(default)]
    pub vlan: Option<u16>,
    /// The IPAM plugin's configuration (its `type` names the plugin).
    #[serde(default)]
    pub ipam: Option<Value>,
    /// The result of the plugins before this one (CHECK, DEL).
    #[serde(rename = "prevResult", default)]
    pub prev_result: Option<Value>,
}

fn yes() -> bool {
    true
}

impl NetConf {
    /// Parses and checks the configuration.
    pub fn parse(bytes: &[u8]) -> Result<NetConf> {
        let c: NetConf = serde_json::from_slice(bytes)
            .map_err(|e| CniError::new(DECODE, "the network configuration on stdin is not valid", e.to_string()))?;
        let bad = |m: String| Err(CniError::new(INVALID_CONFIG, m, ""));
        if c.name.is_empty() {
            return bad("the network configuration has no `name`".into());
        }
        if c.switch.is_some() && c.socket.is_some() {
            return bad("set `switch` (a name) or `socket` (a path), not both".into());
        }
        if let Some(s) = &c.switch
            && (s.is_empty() || s.contains(['/', '\0']))
        {
            return bad(format!("switch {s:?} is not a switch name (no `/`); give its socket's path as `socket`"));
        }
        if let Some(i) = &c.host_interface {
            sluice_sys::names::check_ifname(i)
                .map_err(|e| CniError::new(INVALID_CONFIG, format!("hostInterface: {e}"), ""))?;
        }
        if let Some(v) = c.vlan
            && !(1..=4094).contains(&v)
        {
            return bad(format!("vlan {v} is out of range: use 1 to 4094"));
        }
        if let Some(ipam) = &c.ipam {
            let t = ipam["type"].as_str().unwrap_or_default();
            if t.is_empty() || t.contains(['/', '\0']) || t == "." || t == ".." {
                return bad(format!("ipam.type {:?} is not a plugin's name (found in CNI_PATH)", ipam["type"]));
            }
        }
        Ok(c)
    }

    /// The switch the plugin talks to.
    pub fn target(&self) -> sluice_api::client::Target {
        sluice_api::client::Target { switch: self.switch.clone(), socket: self.socket.clone() }
    }

    /// The switch's port carrying the network's gateway: `g` + 12 hex digits of the hash of
    /// the network's name.
    pub fn gateway_port(&self) -> String {
        format!("g{}", hex12(&[self.name.as_bytes()]))
    }

    /// The host's end of the gateway's pair.
    pub fn gateway_interface(&self) -> String {
        self.host_interface.clone().unwrap_or_else(|| format!("sl{}", hex12(&[self.name.as_bytes()])))
    }
}

/// The `CNI_*` environment of one call.
#[derive(Clone, Debug)]
pub struct Env {
    /// The container's ID.
    pub container_id: String,
    /// The container's network namespace (a path); DEL may come without one.
    pub netns: Option<String>,
    /// The interface to make inside it.
    pub ifname: String,
    /// Where plugins (the IPAM one) are found.
    pub path: Vec<PathBuf>,
}

impl Env {
    /// Reads and checks the environment for `command` (not VERSION).
    pub fn read(command: &str) -> Result<Env> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let need = |k: &str| var(k).ok_or_else(|| CniError::new(INVALID_ENV, format!("{k} is not set"), ""));
        let container_id = need("CNI_CONTAINERID")?;
        if container_id.len() > 1024 || container_id.contains('\0') {
            return Err(CniError::new(INVALID_ENV, "CNI_CONTAINERID is not a container ID", ""));
        }
        let ifname = need("CNI_IFNAME")?;
        sluice_sys::names::check_ifname(&ifname)
            .map_err(|e| CniError::new(INVALID_ENV, format!("CNI_IFNAME: {e}"), ""))?;
        let netns = var("CNI_NETNS");
        match (&netns, command) {
            (None, "ADD" | "CHECK") => return Err(CniError::new(INVALID_ENV, "CNI_NETNS is not set", "")),
            (Some(ns), _) if !sluice_sys::netns::is_path(ns) => {
                return Err(CniError::new(INVALID_ENV, format!("CNI_NETNS {ns:?} is not an absolute path"), ""));
            }
            (Some(ns), _) => sluice_sys::netns::check(ns).map_err(|e| CniError::new(INVALID_ENV, e, ""))?,
            _ => {}
        }
        let path = var("CNI_PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
        Ok(Env { container_id, netns, ifname, path })
    }

    /// The container's port on the switch: `c` + 12 hex digits of the hash of the container
    /// ID and the interface name (stable: the same pair always gives the same port).
    pub fn port_name(&self) -> String {
        format!("c{}", hex12(&[self.container_id.as_bytes(), b"\0", self.ifname.as_bytes()]))
    }
}

/// 64-bit FNV-1a over the parts, one after the other. Stable by definition (offset basis
/// 0xcbf29ce484222325, prime 0x100000001b3): port names derived from it never change
/// between versions of the plugin, so a DEL finds what an older ADD made.
pub fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.iter().flat_map(|p| p.iter()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The top 48 bits of [`fnv1a64`] as 12 hex digits.
pub fn hex12(parts: &[&[u8]]) -> String {
    format!("{:012x}", fnv1a64(parts) >> 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_is_the_published_function() {
        // The reference values of the FNV test suite.
        assert_eq!(fnv1a64(&[b""]), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(&[b"a"]), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(&[b"foobar"]), 0x8594_4171_f739_67e8);
        assert_eq!(fnv1a64(&[b"foo", b"bar"]), fnv1a64(&[b"foobar"]));
        assert_eq!(hex12(&[b"foobar"]), "85944171f739");
    }

    #[test]
    fn a_config_is_checked_before_use() {
        let ok =
            br#"{"cniVersion":"1.0.0","name":"n","type":"sluice-cni","switch":"sw0","ipam":{"type":"host-local"}}"#;
        let c = NetConf::parse(ok).unwrap();
        assert!(c.host_gateway && !c.ip_masq);
        assert_eq!(c.gateway_port().len(), 13);
        assert_eq!(c.gateway_interface().len(), 14);
        for (bad, code) in [
            (&br#"{"cniVersion":"1.0.0""#[..], DECODE),
            (br#"{"cniVersion":"1.0.0","name":"","type":"sluice-cni"}"#, INVALID_CONFIG),
            (br#"{"cniVersion":"1.0.0","name":"n","type":"x","switch":"a","socket":"/s"}"#, INVALID_CONFIG),
            (br#"{"cniVersion":"1.0.0","name":"n","type":"x","ipam":{"type":"../bin/sh"}}"#, INVALID_CONFIG),
            (br#"{"cniVersion":"1.0.0","name":"n","type":"x","hostInterface":"much-too-long-name"}"#, INVALID_CONFIG),
        ] {
            assert_eq!(NetConf::parse(bad).unwrap_err().code, code, "{}", String::from_utf8_lossy(bad));
        }
    }
}
