//! `sluice-cni`: the CNI plugin attaching containers to a sluice switch (docs/cni.md).
//!
//! A client of the switch's daemon, as `sluice port add` is: ADD has the daemon make a veth
//! pair for the container (`port add --may-exist`, the guest end `CNI_IFNAME` made inside
//! `CNI_NETNS`), runs the IPAM plugin the configuration names, sets its addresses and routes
//! in the container, gives the host the gateway address on the network's gateway port, and
//! masquerades with nftables when asked. What ADD did is undone in reverse order when a
//! later step fails; DEL of anything absent succeeds; every wait is bounded (the daemon's
//! answers, the programs run: `exec`). Results and errors are the specification's JSON
//! on stdout.

mod conf;
mod error;
mod exec;
mod ipam;
mod net;

use std::io::Read;
use std::process::ExitCode;

use serde_json::{Value, json};
use sluice_api::client::Client;
use sluice_api::config::{PortKind, PortSpec};
use sluice_api::proto::Request;

use conf::{Env, MAX_CONFIG, NetConf};
use error::*;
use ipam::Allocation;

/// The CNI specification version this plugin implements.
pub const SPEC_VERSION: &str = "1.0.0";
/// The versions it reads configurations and writes results in.
const SUPPORTED: [&str; 4] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0"];
/// Container unknown or does not exist (the specification's code 3).
const CONTAINER_UNKNOWN: u32 = 3;
/// The namespace the gateway port's host end stays in: the daemon's own (the daemon reads
/// the path as itself; the plugin runs beside it, in the host's namespace).
const HOST_NETNS: &str = "/proc/self/ns/net";
/// The alias the daemon marks the veth pairs it makes with (`sluice_ports::veth::MADE_ALIAS`).
const MADE_ALIAS: &str = "sluice: veth pair made for a port";

fn main() -> ExitCode {
    let command = std::env::var("CNI_COMMAND").unwrap_or_default();
    let mut version = SPEC_VERSION.to_string();
    match run(&command, &mut version) {
        Ok(Some(v)) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::SUCCESS,
        Err(mut e) => {
            e.cni_version = version;
            println!("{}", serde_json::to_string(&e).unwrap_or_default());
            ExitCode::FAILURE
        }
    }
}

fn run(command: &str, version: &mut String) -> Result<Option<Value>> {
    if command == "VERSION" {
        return Ok(Some(json!({ "cniVersion": SPEC_VERSION, "supportedVersions": SUPPORTED })));
    }
    if !matches!(command, "ADD" | "DEL" | "CHECK") {
        return Err(CniError::new(
            INVALID_ENV,
            format!("CNI_COMMAND {command:?} is not one this plugin runs: ADD, DEL, CHECK or VERSION"),
            "",
        ));
    }
    let mut stdin = Vec::new();
    std::io::stdin()
        .take(MAX_CONFIG)
        .read_to_end(&mut stdin)
        .map_err(|e| CniError::new(IO_FAILURE, "reading the network configuration on stdin", e.to_string()))?;
    let conf = NetConf::parse(&stdin)?;
    if !SUPPORTED.contains(&conf.cni_version.as_str()) {
        return Err(CniError::new(
            INCOMPATIBLE_VERSION,
            format!("cniVersion {:?} is not one this plugin speaks: {}", conf.cni_version, SUPPORTED.join(", ")),
            "",
        ));
    }
    *version = conf.cni_version.clone();
    let env = Env::read(command)?;
    match command {
        "ADD" => {
            let mut undo = Undo::default();
            let r = add(&conf, &env, &stdin, &mut undo);
            if r.is_err() {
                undo.run();
            }
            r.map(Some)
        }
        "DEL" => del(&conf, &env, &stdin).map(|()| None),
        _ => check(&conf, &env, &stdin).map(|()| None),
    }
}

/// What ADD did so far, undone in reverse order when a later step fails.
#[derive(Default)]
struct Undo(Vec<Box<dyn FnOnce()>>);

impl Undo {
    fn push(&mut self, f: impl FnOnce() + 'static) {
        self.0.push(Box::new(f));
    }

    fn run(self) {
        for f in self.0.into_iter().rev() {
            f();
        }
    }
}

/// Connects to the configuration's switch: "try again later" when none answers.
fn connect(conf: &NetConf) -> Result<Client> {
    Client::for_target(&conf.target()).map_err(|e| {
        let code = match e {
            sluice_api::Error::Unreachable { .. } | sluice_api::Error::NoSwitch { .. } => TRY_AGAIN,
            _ => PORT_REFUSED,
        };
        CniError::new(code, format!("no sluice switch answers for network {}: {e}", conf.name), "")
    })
}

/// Adds `spec` (`--may-exist`); true if it was not attached before.
fn port_add(c: &mut Client, spec: PortSpec) -> Result<bool> {
    let name = spec.name.clone();
    c.call_value(&Request::PortAdd { port: Box::new(spec), may_exist: true })
        .map(|answer| answer["existed"] != true)
        .map_err(|e| CniError::new(PORT_REFUSED, format!("the switch refused port {name}: {e}"), ""))
}

/// Undoes the addition of port `name`.
fn undo_port(undo: &mut Undo, conf: &NetConf, name: String) {
    let target = conf.target();
    undo.push(move || {
        if let Ok(mut c) = Client::for_target(&target) {
            let _ = c.call_value(&Request::PortDel { name, if_exists: true });
        }
    });
}

/// The container's network namespace (`CNI_NETNS`), opened and checked.
fn container_netns(env: &Env) -> Result<std::fs::File> {
    let netns = env.netns.clone().unwrap_or_default();
    net::open_netns(&netns).map_err(|e| {
        CniError::new(
            CONTAINER_UNKNOWN,
            format!("the container's network namespace {netns} cannot be entered"),
            e.to_string(),
        )
    })
}

fn add(conf: &NetConf, env: &Env, stdin: &[u8], undo: &mut Undo) -> Result<Value> {
    let ns = container_netns(env)?;
    let mut c = connect(conf)?;
    let port = env.port_name();
    if conf.host_gateway {
        // The network's gateway port: shared by its containers, made once (by the first
        // ADD that succeeds), kept.
        let gw = PortSpec {
            kind: PortKind::Veth,
            netns: Some(HOST_NETNS.into()),
            ifname: Some(conf.gateway_interface()),
            mtu: conf.mtu,
            vlan: conf.vlan,
            ..PortSpec::tap(&conf.gateway_port())
        };
        if port_add(&mut c, gw)? {
            undo_port(undo, conf, conf.gateway_port());
        }
    }
    let spec = PortSpec {
        kind: PortKind::Veth,
        netns: env.netns.clone(),
        ifname: Some(env.ifname.clone()),
        mtu: conf.mtu,
        vlan: conf.vlan,
        ..PortSpec::tap(&port)
    };
    port_add(&mut c, spec)?;
    undo_port(undo, conf, port.clone());
    let mut alloc = Allocation::default();
    if let Some(ipam_conf) = &conf.ipam {
        let v = ipam::delegate(env, ipam_conf, "ADD", stdin)?.unwrap_or_default();
        let (env2, ipam2, stdin2) = (env.clone(), ipam_conf.clone(), stdin.to_vec());
        undo.push(move || {
            let _ = ipam::delegate(&env2, &ipam2, "DEL", &stdin2);
        });
        alloc = Allocation::parse(&v)?;
    }
    net::configure(&ns, &env.ifname, &alloc).map_err(|e| {
        CniError::new(NETNS_SETUP, format!("setting the addresses of {} in the container", env.ifname), e.to_string())
    })?;
    if conf.host_gateway {
        let iface = conf.gateway_interface();
        for a in &alloc.ips {
            if let Some(gw) = a.gateway {
                net::set_gateway(&iface, gw, a.prefix).map_err(|e| {
                    CniError::new(
                        GATEWAY,
                        format!("giving the host the gateway address {gw} on {iface}"),
                        e.to_string(),
                    )
                })?;
            }
        }
    }
    if conf.ip_masq && !alloc.ips.is_empty() {
        let p = port.clone();
        undo.push(move || {
            let _ = net::unmasquerade(&p);
        });
        for a in &alloc.ips {
            net::masquerade(a, &port).map_err(|e| {
                CniError::new(
                    MASQUERADE,
                    format!("masquerading {} (nftables table inet {})", a.ip, net::NFT_TABLE),
                    e.to_string(),
                )
            })?;
        }
    }
    let mac = net::container_mac(&ns, &env.ifname).unwrap_or_default();
    Ok(result(conf, env, &port, &mac, &alloc))
}

/// The ADD result, in the configuration's CNI version.
fn result(conf: &NetConf, env: &Env, port: &str, mac: &str, a: &Allocation) -> Value {
    let old = conf.cni_version != "1.0.0";
    let ips: Vec<Value> = a
        .ips
        .iter()
        .map(|x| {
            let mut v = json!({ "address": x.cidr(), "interface": 1 });
            if let Some(g) = x.gateway {
                v["gateway"] = json!(g.to_string());
            }
            if old {
                v["version"] = json!(if x.ip.is_ipv4() { "4" } else { "6" });
            }
            v
        })
        .collect();
    let routes: Vec<Value> = a
        .routes
        .iter()
        .map(|(dst, gw)| match gw {
            Some(g) => json!({ "dst": dst, "gw": g.to_string() }),
            None => json!({ "dst": dst }),
        })
        .collect();
    json!({
        "cniVersion": conf.cni_version,
        "interfaces": [
            { "name": port, "mac": net::host_mac(port) },
            { "name": env.ifname, "mac": mac, "sandbox": env.netns.clone().unwrap_or_default() },
        ],
        "ips": ips,
        "routes": routes,
        "dns": if a.dns.is_object() { a.dns.clone() } else { json!({}) },
    })
}

fn del(conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<()> {
    let port = env.port_name();
    match connect(conf) {
        Ok(mut c) => {
            c.call_value(&Request::PortDel { name: port.clone(), if_exists: true }).map_err(|e| {
                CniError::new(PORT_REFUSED, format!("the switch refused to delete port {port}: {e}"), "")
            })?;
        }
        // No switch runs: its ports went with it, but not a pair it made — removed here.
        Err(e) if e.code == TRY_AGAIN => remove_made_pair(&port),
        Err(e) => return Err(e),
    }
    if let Some(ipam_conf) = &conf.ipam {
        ipam::delegate(env, ipam_conf, "DEL", stdin)?;
    }
    net::unmasquerade(&port)
        .map_err(|e| CniError::new(MASQUERADE, format!("removing the masquerading of port {port}"), e.to_string()))?;
    Ok(())
}

/// Deletes the veth pair of port `name` if the switch made it (its alias says so).
fn remove_made_pair(name: &str) {
    let made = sluice_sys::names::check_ifname(name).is_ok()
        && std::fs::read_to_string(format!("/sys/class/net/{name}/ifalias")).is_ok_and(|a| a.trim_end() == MADE_ALIAS);
    if made {
        let _ = exec::tool("ip", &["link", "del", "dev", name]);
    }
}

fn check(conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<()> {
    let port = env.port_name();
    let failed = |m: String| CniError::new(CHECK_FAILED, m, "");
    let mut c = connect(conf)?;
    let list = c
        .call_value(&Request::PortList)
        .map_err(|e| CniError::new(PORT_REFUSED, "listing the switch's ports", e.to_string()))?;
    let attached = list["ports"].as_array().into_iter().flatten().any(|p| p["name"].as_str() == Some(port.as_str()));
    if !attached {
        return Err(failed(format!("the switch has no port {port} for container {}", env.container_id)));
    }
    let ns = container_netns(env)?;
    let has = net::container_addresses(&ns, &env.ifname)
        .map_err(|e| failed(format!("the container has no interface {}: {e}", env.ifname)))?;
    let prev = conf.prev_result.as_ref().map(Allocation::parse).transpose()?.unwrap_or_default();
    for a in &prev.ips {
        if !has.contains(&a.cidr()) {
            return Err(failed(format!(
                "{} in the container lacks address {} (it has {})",
                env.ifname,
                a.cidr(),
                has.join(", ")
            )));
        }
        if conf.ip_masq && net::masquerade_rules(&port) == 0 {
            return Err(failed(format!(
                "no masquerading rule for port {port} in nftables table inet {}",
                net::NFT_TABLE
            )));
        }
    }
    if let Some(ipam_conf) = &conf.ipam {
        ipam::delegate(env, ipam_conf, "CHECK", stdin)?;
    }
    Ok(())
}
