//! What the plugin sets on the hosts' and containers' interfaces: addresses and routes
//! inside the container's namespace (entered through a descriptor checked once, never the
//! path again: `sluice_sys::netns`), the network's gateway address on the host's end of
//! its gateway port, and masquerading in an nftables table of the plugin's own
//! (`inet sluice-cni`), one rule per container address, tagged with the container's port.

use std::fs::File;
use std::net::IpAddr;

use serde_json::Value;

use crate::exec::tool;
use crate::ipam::{Address, Allocation};

/// The nftables table the plugin's rules are in.
pub const NFT_TABLE: &str = "sluice-cni";
/// Its chain.
const NFT_CHAIN: &str = "postrouting";

/// Opens the container's namespace (checked to be a network namespace).
pub fn open_netns(path: &str) -> std::io::Result<File> {
    sluice_sys::netns::open(path)
}

/// Runs `ip ARGS` inside the namespace of `ns`.
fn ip_in(ns: &File, args: Vec<String>) -> std::io::Result<Vec<u8>> {
    let ns = ns.try_clone()?;
    sluice_sys::netns::run_in_file(Some(ns), move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        tool("ip", &a)
    })
}

/// Gives interface `ifname` in the container the allocation's addresses, brings it up and
/// adds its routes (via the route's gateway, or the address's of its family).
pub fn configure(ns: &File, ifname: &str, a: &Allocation) -> std::io::Result<()> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    for addr in &a.ips {
        ip_in(ns, s(&["addr", "replace", &addr.cidr(), "dev", ifname]))?;
    }
    ip_in(ns, s(&["link", "set", "dev", ifname, "up"]))?;
    for (dst, gw) in &a.routes {
        let v4 = dst.contains('.');
        let gw = gw.or_else(|| a.ips.iter().find(|x| x.ip.is_ipv4() == v4).and_then(|x| x.gateway));
        let mut args = s(&["route", "replace", dst]);
        if let Some(g) = gw {
            args.extend(s(&["via", &g.to_string()]));
        }
        args.extend(s(&["dev", ifname]));
        ip_in(ns, args)?;
    }
    Ok(())
}

/// The MAC address of interface `ifname` in the container.
pub fn container_mac(ns: &File, ifname: &str) -> std::io::Result<String> {
    let out = ip_in(ns, vec!["-j".into(), "link".into(), "show".into(), "dev".into(), ifname.into()])?;
    let v: Value = serde_json::from_slice(&out).map_err(std::io::Error::other)?;
    Ok(v[0]["address"].as_str().unwrap_or_default().to_string())
}

/// The MAC address of interface `name` here.
pub fn host_mac(name: &str) -> String {
    std::fs::read_to_string(format!("/sys/class/net/{name}/address")).map(|s| s.trim().to_string()).unwrap_or_default()
}

/// The addresses interface `ifname` in the container has, as `ADDR/PREFIX`; an error if it
/// is not there.
pub fn container_addresses(ns: &File, ifname: &str) -> std::io::Result<Vec<String>> {
    let out = ip_in(ns, vec!["-j".into(), "addr".into(), "show".into(), "dev".into(), ifname.into()])?;
    let v: Value = serde_json::from_slice(&out).map_err(std::io::Error::other)?;
    Ok(v[0]["addr_info"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| Some(format!("{}/{}", a["local"].as_str()?, a["prefixlen"].as_u64()?)))
        .collect())
}

/// Gives host interface `iface` the gateway address `gw` (with the subnet's prefix) and
/// brings it up; nothing changes when it has it already.
pub fn set_gateway(iface: &str, gw: IpAddr, prefix: u8) -> std::io::Result<()> {
    tool("ip", &["addr", "replace", &format!("{gw}/{prefix}"), "dev", iface])?;
    tool("ip", &["link", "set", "dev", iface, "up"])?;
    Ok(())
}

/// Masquerades `addr` to destinations outside its subnet, tagged with `tag` (the
/// container's port); the table and chain are made when missing.
pub fn masquerade(addr: &Address, tag: &str) -> std::io::Result<()> {
    let fam = if addr.ip.is_ipv4() { "ip" } else { "ip6" };
    let script = format!(
        "add table inet {NFT_TABLE}\n\
         add chain inet {NFT_TABLE} {NFT_CHAIN} {{ type nat hook postrouting priority srcnat; policy accept; }}\n\
         add rule inet {NFT_TABLE} {NFT_CHAIN} {fam} saddr {} {fam} daddr != {} masquerade comment \"{tag}\"\n",
        addr.ip,
        addr.subnet()
    );
    nft_script(&script)
}

/// Deletes the masquerading rules tagged `tag` (none is fine). The table and chain stay (an
/// empty chain matches nothing; deleting them would race another container's ADD).
pub fn unmasquerade(tag: &str) -> std::io::Result<()> {
    let listed = match tool("nft", &["-j", "list", "chain", "inet", NFT_TABLE, NFT_CHAIN]) {
        Ok(o) => o,
        // No table or chain: no rule.
        Err(_) => return Ok(()),
    };
    let v: Value = serde_json::from_slice(&listed).map_err(std::io::Error::other)?;
    let mine: Vec<u64> = v["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o.get("rule"))
        .filter(|r| r["comment"].as_str() == Some(tag))
        .filter_map(|r| r["handle"].as_u64())
        .collect();
    for h in &mine {
        tool("nft", &["delete", "rule", "inet", NFT_TABLE, NFT_CHAIN, "handle", &h.to_string()])?;
    }
    Ok(())
}

/// The masquerading rules tagged `tag`.
pub fn masquerade_rules(tag: &str) -> usize {
    tool("nft", &["-j", "list", "chain", "inet", NFT_TABLE, NFT_CHAIN])
        .ok()
        .and_then(|o| serde_json::from_slice::<Value>(&o).ok())
        .map_or(0, |v| {
            v["nftables"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|o| o["rule"]["comment"].as_str() == Some(tag))
                .count()
        })
}

/// Runs an nft script (all of it or nothing, as nft applies a file).
fn nft_script(script: &str) -> std::io::Result<()> {
    let mut cmd = std::process::Command::new("nft");
    cmd.args(["-f", "-"]);
    let out = crate::exec::run(cmd, script.as_bytes(), crate::exec::TOOL_WITHIN)?;
    if out.ok { Ok(()) } else { Err(std::io::Error::other(format!("nft: {}", out.stderr))) }
}
