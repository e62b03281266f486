//! Delegating addresses to the IPAM plugin the configuration names (`host-local`, `dhcp`,
//! `static`): found in `CNI_PATH`, run with the plugin's own environment and stdin, its
//! result read as the specification's (addresses with prefixes, gateways, routes, DNS).

use std::net::IpAddr;
use std::process::Command;

use serde_json::Value;

use crate::conf::Env;
use crate::error::{CniError, DECODE, IPAM_FAILED, Result};
use crate::exec;

/// One address the IPAM plugin gave.
#[derive(Clone, Debug, PartialEq)]
pub struct Address {
    /// The address.
    pub ip: IpAddr,
    /// Its prefix length.
    pub prefix: u8,
    /// The subnet's gateway, if it named one.
    pub gateway: Option<IpAddr>,
}

impl Address {
    /// `ADDR/PREFIX`.
    pub fn cidr(&self) -> String {
        format!("{}/{}", self.ip, self.prefix)
    }

    /// The subnet, `NETWORK/PREFIX`.
    pub fn subnet(&self) -> String {
        let net = match self.ip {
            IpAddr::V4(a) => {
                let m = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                IpAddr::from((u32::from(a) & m).to_be_bytes())
            }
            IpAddr::V6(a) => {
                let m = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                IpAddr::from((u128::from(a) & m).to_be_bytes())
            }
        };
        format!("{net}/{}", self.prefix)
    }
}

/// Parses `ADDR/PREFIX`.
pub fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (a, p) = s.split_once('/')?;
    let ip: IpAddr = a.parse().ok()?;
    let prefix: u8 = p.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (prefix <= max).then_some((ip, prefix))
}

/// What the IPAM plugin returned.
#[derive(Clone, Debug, Default)]
pub struct Allocation {
    /// Its addresses.
    pub ips: Vec<Address>,
    /// Its routes, as it wrote them (`dst`, optional `gw`).
    pub routes: Vec<(String, Option<IpAddr>)>,
    /// Its DNS settings, as it wrote them.
    pub dns: Value,
}

impl Allocation {
    /// Reads a result (of the IPAM plugin, or a `prevResult`).
    pub fn parse(v: &Value) -> Result<Allocation> {
        let bad = |m: String| CniError::new(DECODE, m, v.to_string());
        let mut a = Allocation { dns: v.get("dns").cloned().unwrap_or(Value::Null), ..Default::default() };
        for ip in v["ips"].as_array().into_iter().flatten() {
            let s = ip["address"].as_str().unwrap_or_default();
            let (addr, prefix) = parse_cidr(s).ok_or_else(|| bad(format!("IPAM address {s:?} is not ADDR/PREFIX")))?;
            let gateway = match ip.get("gateway").and_then(Value::as_str) {
                Some(g) => Some(g.parse().map_err(|_| bad(format!("IPAM gateway {g:?} is not an address")))?),
                None => None,
            };
            a.ips.push(Address { ip: addr, prefix, gateway });
        }
        for r in v["routes"].as_array().into_iter().flatten() {
            let dst = r["dst"].as_str().unwrap_or_default();
            if parse_cidr(dst).is_none() {
                return Err(bad(format!("IPAM route {dst:?} is not NETWORK/PREFIX")));
            }
            let gw = match r.get("gw").and_then(Value::as_str) {
                Some(g) => Some(g.parse().map_err(|_| bad(format!("IPAM route gateway {g:?} is not an address")))?),
                None => None,
            };
            a.routes.push((dst.to_string(), gw));
        }
        Ok(a)
    }
}

/// Runs the IPAM plugin of `ipam` (the configuration's `ipam` object) for `command`
/// (ADD, DEL, CHECK) with the same stdin the plugin got; its result for ADD.
pub fn delegate(env: &Env, ipam: &Value, command: &str, stdin: &[u8]) -> Result<Option<Value>> {
    let name = ipam["type"].as_str().unwrap_or_default();
    let Some(prog) = exec::find_plugin(&env.path, name) else {
        return Err(CniError::new(
            IPAM_FAILED,
            format!(
                "IPAM plugin {name:?} is not in CNI_PATH; install it (containernetworking-plugins) or add its directory to CNI_PATH"
            ),
            format!("CNI_PATH: {:?}", env.path),
        ));
    };
    let mut cmd = Command::new(&prog);
    cmd.env("CNI_COMMAND", command);
    let out = exec::run(cmd, stdin, exec::IPAM_WITHIN)
        .map_err(|e| CniError::new(IPAM_FAILED, format!("running IPAM plugin {}", prog.display()), e.to_string()))?;
    if !out.ok {
        // Its error result says why, in its own words.
        let said: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let msg = said["msg"].as_str().map_or_else(|| out.stderr.clone(), str::to_string);
        return Err(CniError::new(
            IPAM_FAILED,
            format!("IPAM plugin {name} failed {command}: {msg}"),
            said["details"].as_str().unwrap_or_default().to_string(),
        ));
    }
    if command != "ADD" {
        return Ok(None);
    }
    let v: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| CniError::new(DECODE, format!("IPAM plugin {name}'s result is not JSON"), e.to_string()))?;
    Ok(Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_local_result_is_read() {
        let v: Value = serde_json::from_str(
            r#"{"cniVersion":"1.0.0","ips":[{"address":"10.88.5.2/24","gateway":"10.88.5.1"},{"address":"fd00:5::2/64"}],
                "routes":[{"dst":"0.0.0.0/0"},{"dst":"10.0.0.0/8","gw":"10.88.5.254"}],"dns":{}}"#,
        )
        .unwrap();
        let a = Allocation::parse(&v).unwrap();
        assert_eq!(a.ips[0].cidr(), "10.88.5.2/24");
        assert_eq!(a.ips[0].subnet(), "10.88.5.0/24");
        assert_eq!(a.ips[0].gateway, Some("10.88.5.1".parse().unwrap()));
        assert_eq!(a.ips[1].subnet(), "fd00:5::/64");
        assert_eq!(a.routes[1], ("10.0.0.0/8".into(), Some("10.88.5.254".parse().unwrap())));
        let bad: Value = serde_json::from_str(r#"{"ips":[{"address":"10.88.5.2"}]}"#).unwrap();
        assert!(Allocation::parse(&bad).is_err());
        assert!(parse_cidr("10.0.0.1/33").is_none());
    }
}
