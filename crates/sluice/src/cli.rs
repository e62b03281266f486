//! The CLI verbs that talk to a running switch, and how their answers are printed.

use anyhow::{Result, bail};
use comfy_table::{CellAlignment, Table};

use sluice_api::client::{self, Client, Target};
use sluice_api::config::{PortKind, PortSpec};
use sluice_api::proto::*;

/// Arguments of `sluice port add`.
#[derive(Debug, clap::Args)]
pub struct PortAddArgs {
    /// Port name; for a TAP, the interface name (1–15 bytes).
    pub name: String,
    /// Kind of port.
    #[arg(long = "type", value_enum, default_value = "tap")]
    pub kind: KindArg,
    /// TAP: create it inside this network namespace (an `ip netns` name); uplink: the
    /// namespace its interface is in. TAP and veth also take the path of a namespace file
    /// (/proc/PID/ns/net, /run/netns/cni-…); a veth with --netns is a pair the switch
    /// makes, NAME here and --ifname in the namespace.
    #[arg(long, value_name = "NS")]
    pub netns: Option<String>,
    /// veth with --netns: the name of the pair's end inside the namespace, e.g. eth0
    /// (default: the port's name).
    #[arg(long, value_name = "NAME", requires = "netns")]
    pub ifname: Option<String>,
    /// Succeed, doing nothing, when a port of this name with the same settings is attached
    /// (other settings are still refused, naming what differs).
    #[arg(long)]
    pub may_exist: bool,
    /// Access port of this VLAN (default 1).
    #[arg(long, value_name = "VID", conflicts_with = "trunk")]
    pub vlan: Option<u16>,
    /// Trunk port carrying these VLANs tagged, e.g. 10,20.
    #[arg(long, value_name = "VID,…", value_delimiter = ',')]
    pub trunk: Option<Vec<u16>>,
    /// Native VLAN of a trunk (untagged frames belong to it).
    #[arg(long, value_name = "VID", requires = "trunk")]
    pub native: Option<u16>,
    /// MTU, 68 to 9000 (default: the switch's).
    #[arg(long, value_parser = sluice_api::config::mtu_arg)]
    pub mtu: Option<u16>,
    /// Turn checksum/TSO offloads off: the switch cuts GSO frames for this port in
    /// software and completes checksums.
    #[arg(long)]
    pub no_offload: bool,
    /// Isolate the port: it exchanges frames with uplinks only, never other guests.
    #[arg(long)]
    pub isolated: bool,
    /// Anti-spoofing: drop (and count) frames from any other source MAC address.
    #[arg(long, value_name = "MAC")]
    pub mac: Option<String>,
    /// Anti-spoofing: the only source IP addresses the port's packets and ARP may carry,
    /// e.g. 10.0.0.5,fd00::5 (0.0.0.0 and :: always pass, for DHCP and DAD); `learn`
    /// locks the first address of each family the port uses. In Layer 3 mode these are
    /// also the addresses the port is reached at (a guest port without any learns them).
    #[arg(long = "ip", value_name = "ADDR,…", value_delimiter = ',')]
    pub ips: Vec<String>,
    /// Drop (and count as `filtered`) the port's frames of these EtherTypes, e.g.
    /// 0x88cc (LLDP) or 0x8863,0x8864 (PPPoE); the EtherType after any 802.1Q tag.
    #[arg(long = "drop-ethertype", value_name = "TYPE,…", value_delimiter = ',', value_parser = ethertype_arg)]
    pub drop_ethertypes: Vec<u16>,
    /// Forward the port's frames to these IEEE link-local addresses, dropped (and counted
    /// as `link_local`) otherwise: full addresses or their last byte, e.g. 0e (LLDP) or
    /// 00 (spanning tree BPDUs). Pause (01) and LACP (02) are never forwarded.
    #[arg(long = "forward-link-local", value_name = "ADDR,…", value_delimiter = ',')]
    pub forward_link_local: Vec<String>,
    /// Storm control: the most broadcast frames a second the port may send, e.g. 1000;
    /// more are dropped (counted as `storm`).
    #[arg(long, value_name = "PPS")]
    pub storm_broadcast_pps: Option<u32>,
    /// Storm control: the most multicast frames a second the port may send.
    #[arg(long, value_name = "PPS")]
    pub storm_multicast_pps: Option<u32>,
    /// Storm control: frames of each kind that may come at once (default: a tenth of a
    /// second of the rate, at least 16).
    #[arg(long, value_name = "FRAMES")]
    pub storm_burst: Option<u32>,
    /// Rate limit of what the port's guest sends, in Mbit/s on the wire (Ethernet frames),
    /// e.g. 100.
    #[arg(long, value_name = "MBIT")]
    pub rate_in: Option<f64>,
    /// Rate limit of what the port's guest is sent, in Mbit/s on the wire.
    #[arg(long, value_name = "MBIT")]
    pub rate_out: Option<f64>,
    /// The rate limits' burst in KiB (at least 64; default: the larger of 2 × 64 KiB and
    /// half a second of the rate).
    #[arg(long, value_name = "KIB")]
    pub burst: Option<u64>,
    /// Make this port a mirror: it gets a copy of every frame these ports receive and are
    /// sent (in its own VLANs; make it a trunk to see several), never holding them back.
    #[arg(long, value_name = "PORT,…", value_delimiter = ',')]
    pub mirror: Vec<String>,
    /// Uplink: up to two backup interfaces that take over when the active one is down.
    #[arg(long = "backup", value_name = "IFACE,…", value_delimiter = ',')]
    pub backups: Vec<String>,
    /// Stream: the unix socket its peer listens on (QEMU's `-netdev
    /// stream,server=on,addr.type=unix,addr.path=PATH`, or `sluice port relay`).
    #[arg(long, value_name = "PATH")]
    pub path: Option<std::path::PathBuf>,
    /// VXLAN: the underlay address of this host the tunnel's UDP socket binds to (in
    /// --netns, if given).
    #[arg(long, value_name = "ADDR")]
    pub local: Option<String>,
    /// VXLAN: remote endpoints every flooded frame goes to, e.g. 192.168.77.2; the only
    /// ones datagrams are accepted from unless --remotes-only false.
    #[arg(long = "remote", value_name = "ADDR,…", value_delimiter = ',')]
    pub remotes: Vec<String>,
    /// VXLAN: accept and learn from the --remote endpoints only (true, the default), or
    /// from any sender on the underlay, flooding to the senders heard besides (false).
    #[arg(long, value_name = "BOOL")]
    pub remotes_only: Option<bool>,
    /// VXLAN: the VNI carrying the port's frames (0 to 16777215).
    #[arg(long, value_name = "N", conflicts_with = "vni_map")]
    pub vni: Option<u32>,
    /// VXLAN: a VNI per VLAN, e.g. 10=5010,20=5020 (the port becomes a trunk of them).
    #[arg(long, value_name = "VID=VNI,…", value_delimiter = ',')]
    pub vni_map: Vec<String>,
    /// VXLAN: the UDP port, here and at the remotes (default 4789).
    #[arg(long, value_name = "PORT")]
    pub dstport: Option<u16>,
    /// vhost-user: the unix socket QEMU's `-chardev socket,path=PATH` names. The switch
    /// listens on it (mode 0600, or 0660 with the group of `vhost_allow_groups`) unless --client.
    /// (Here --socket is the VM's; name the switch with --switch.)
    #[arg(long, value_name = "PATH")]
    pub socket: Option<std::path::PathBuf>,
    /// vhost-user: QEMU listens on --socket (`-chardev socket,…,server=on`) and the switch
    /// connects, retrying until QEMU is there (and again after QEMU restarts).
    #[arg(long)]
    pub client: bool,
    /// IGMP/MLD snooping: the port leads to a multicast router and gets every group frame
    /// and every report: auto (while queries are heard on it), always, never.
    #[arg(long, value_enum, default_value = "auto")]
    pub mcast_router: McastRouterArg,
    #[command(flatten)]
    pub target: client::TargetByName,
}

/// `--mcast-router` values.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum McastRouterArg {
    /// While IGMP or MLD queries are heard on the port.
    Auto,
    /// Always.
    Always,
    /// Never, even when queries are heard on it.
    Never,
}

/// Port kinds on the command line.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum KindArg {
    /// A TAP device, created for the port.
    Tap,
    /// An existing host interface (NAME) connecting the switch to the LAN.
    Uplink,
    /// The switch's end (NAME) of an existing veth pair whose other end is in the guest's
    /// namespace, forwarded by the kernel datapath (switches with `datapath = "kernel"`).
    Veth,
    /// A unix stream socket (--path) a program listens on, carrying frames with QEMU's
    /// `-netdev stream` framing; the switch can hold the program back (lossless).
    Stream,
    /// A QEMU VM's virtio-net device over vhost-user (--socket): the switch reads and
    /// fills the VM's queues in its shared memory, and can hold the VM back (lossless).
    VhostUser,
    /// A VXLAN tunnel (--local, --remote, --vni) to other switches, Linux vxlan devices or
    /// Open vSwitch hosts: a UDP socket (user-space datapath), or a vxlan device the TC
    /// programs send into (kernel datapath).
    Vxlan,
}

/// Arguments of `sluice stats`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct StatsArgs {
    /// Show one port in detail.
    pub port: Option<String>,
    /// Print JSON (schema in docs/stats-json.md).
    #[arg(long)]
    pub json: bool,
    #[command(subcommand)]
    pub reset: Option<StatsSub>,
    #[command(flatten)]
    pub target: Target,
}

/// `sluice stats reset`.
#[derive(Debug, clap::Subcommand)]
pub enum StatsSub {
    /// Zero every counter of the switch.
    Reset {
        #[command(flatten)]
        target: Target,
    },
}

fn table() -> Table {
    let mut t = Table::new();
    t.load_style(comfy_table::presets::NOTHING);
    t.set_content_arrangement(comfy_table::ContentArrangement::Disabled);
    t
}

fn right(t: &mut Table, from: usize) {
    for i in from..t.column_count() {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
}

/// `1234567` → `1.23M`.
pub fn si(n: u64) -> String {
    let f = n as f64;
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.1}k", f / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2}M", f / 1e6),
        _ => format!("{:.2}G", f / 1e9),
    }
}

/// Bytes as `12.3 MB`.
pub fn bytes(n: u64) -> String {
    let f = n as f64;
    match n {
        0..1_000 => format!("{n} B"),
        1_000..1_000_000 => format!("{:.1} kB", f / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} MB", f / 1e6),
        _ => format!("{:.2} GB", f / 1e9),
    }
}

pub fn switch_list(json: bool) -> Result<()> {
    let mut rows = Vec::new();
    for (name, path) in client::running() {
        let Ok(mut c) = Client::connect(&path) else { continue };
        if let Ok(s) = c.call::<SwitchSummary>(&Request::Hello) {
            rows.push((s, path));
        } else {
            let _ = name;
        }
    }
    if json {
        let v: Vec<_> = rows.iter().map(|(s, p)| serde_json::json!({"switch": s, "socket": p})).collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if rows.is_empty() {
        println!("no switch is running");
        return Ok(());
    }
    let mut t = table();
    t.set_header(["SWITCH", "MODE", "PID", "PORTS", "MTU", "LOSSLESS", "LOOP", "SOCKET"]);
    for (s, p) in rows {
        t.add_row([
            s.name,
            s.mode,
            s.pid.to_string(),
            s.ports.to_string(),
            s.mtu.to_string(),
            if s.lossless { "yes" } else { "no" }.into(),
            if s.poll { "poll" } else { "event" }.into(),
            p.display().to_string(),
        ]);
    }
    println!("{t}");
    Ok(())
}

pub fn switch_stop(target: &Target) -> Result<()> {
    let mut c = Client::for_target(target)?;
    let s: SwitchSummary = c.call(&Request::Hello)?;
    c.call_final(&Request::Shutdown)?;
    // Wait until the daemon has gone (its socket stops answering).
    let path = client::resolve(target)?;
    for _ in 0..100 {
        if std::os::unix::net::UnixStream::connect(&path).is_err() {
            println!("switch {} stopped", s.name);
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    bail!("switch {} did not stop within 5 s (pid {})", s.name, s.pid)
}

pub fn switch_restart(target: &Target) -> Result<()> {
    let mut c = Client::for_target(target)?;
    let before: SwitchSummary = c.call(&Request::Hello)?;
    c.call_final(&Request::Restart)?;
    drop(c);
    // Wait for the daemon to answer again (the same process, started anew).
    let path = client::resolve(target)?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while std::time::Instant::now() < deadline {
        if let Ok(s) = Client::connect(&path).and_then(|mut c| c.call::<SwitchSummary>(&Request::Hello))
            && s.started_ns != before.started_ns
        {
            println!("switch {} restarted (pid {})", s.name, s.pid);
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    bail!(
        "switch {} did not come back within 15 s after its restart (pid {}); see its log, and start it again with `sluice switch run`",
        before.name,
        before.pid
    )
}

pub fn port_add(a: PortAddArgs) -> Result<()> {
    let spec = PortSpec {
        name: a.name,
        kind: match a.kind {
            KindArg::Tap => PortKind::Tap,
            KindArg::Uplink => PortKind::Uplink,
            KindArg::Veth => PortKind::Veth,
            KindArg::Stream => PortKind::Stream,
            KindArg::Vxlan => PortKind::Vxlan,
            KindArg::VhostUser => PortKind::VhostUser,
        },
        netns: a.netns,
        mtu: a.mtu,
        offload: !a.no_offload,
        vlan: a.vlan,
        trunk: a.trunk,
        native: a.native,
        isolated: a.isolated,
        mac: a.mac,
        ips: a.ips,
        drop_ethertypes: a.drop_ethertypes,
        forward_link_local: a.forward_link_local,
        storm_broadcast_pps: a.storm_broadcast_pps,
        storm_multicast_pps: a.storm_multicast_pps,
        storm_burst: a.storm_burst,
        rate_in: a.rate_in,
        rate_out: a.rate_out,
        burst: a.burst,
        mirror: a.mirror,
        backups: a.backups,
        path: a.path,
        local: a.local,
        remotes: a.remotes,
        remotes_only: a.remotes_only,
        evpn: false,
        vni: a.vni,
        vni_map: if a.vni_map.is_empty() {
            None
        } else {
            Some(
                a.vni_map
                    .iter()
                    .map(|kv| {
                        let (k, v) = kv.split_once('=').filter(|(k, _)| !k.is_empty()).ok_or_else(|| {
                            anyhow::anyhow!("--vni-map {kv:?}: write VLAN=VNI pairs, e.g. 10=5010,20=5020")
                        })?;
                        let v = v
                            .parse::<u32>()
                            .map_err(|_| anyhow::anyhow!("--vni-map {kv:?}: {v:?} is not a VNI (0 to 16777215)"))?;
                        Ok((k.to_string(), v))
                    })
                    .collect::<Result<_>>()?,
            )
        },
        dstport: a.dstport,
        socket: a.socket,
        client: a.client,
        ifname: a.ifname,
        mcast_router: match a.mcast_router {
            McastRouterArg::Auto => sluice_api::config::McastRouterSpec::Auto,
            McastRouterArg::Always => sluice_api::config::McastRouterSpec::Always,
            McastRouterArg::Never => sluice_api::config::McastRouterSpec::Never,
        },
    };
    spec.validate().map_err(anyhow::Error::msg)?;
    let mut c = Client::for_target(&a.target.into())?;
    let name = spec.name.clone();
    let answer = c.call_value(&Request::PortAdd { port: Box::new(spec), may_exist: a.may_exist })?;
    if answer["existed"] == true {
        println!("port {name} is attached already, as described");
    } else {
        println!("port {name} added");
    }
    Ok(())
}

pub fn port_del(target: &Target, name: String, if_exists: bool) -> Result<()> {
    let mut c = Client::for_target(target)?;
    let answer = c.call_value(&Request::PortDel { name: name.clone(), if_exists })?;
    if answer["existed"] == false {
        println!("no port {name} is attached; nothing to delete");
    } else {
        println!("port {name} deleted");
    }
    Ok(())
}

/// Arguments of `sluice port set`.
#[derive(Debug, clap::Args)]
pub struct PortSetArgs {
    /// Port name.
    pub name: String,
    /// Rate limit of what the port's guest sends, Mbit/s on the wire (0 removes it).
    #[arg(long, value_name = "MBIT")]
    pub rate_in: Option<f64>,
    /// Rate limit of what the port's guest is sent, Mbit/s on the wire (0 removes it;
    /// shaped: frames wait; not on an uplink or a tunnel on the kernel datapath).
    #[arg(long, value_name = "MBIT")]
    pub rate_out: Option<f64>,
    /// The rate limits' burst in KiB (at least 64; 0: the default, the larger of 2 × 64
    /// KiB and half a second of the rate).
    #[arg(long, value_name = "KIB")]
    pub burst: Option<u64>,
    /// Storm control: broadcast frames a second (0 removes it).
    #[arg(long, value_name = "PPS")]
    pub storm_broadcast_pps: Option<u32>,
    /// Storm control: multicast frames a second (0 removes it).
    #[arg(long, value_name = "PPS")]
    pub storm_multicast_pps: Option<u32>,
    /// Storm control: frames of each kind at once (0: the default).
    #[arg(long, value_name = "FRAMES")]
    pub storm_burst: Option<u32>,
    /// The IEEE link-local addresses the port's frames may go to, replacing the list, e.g.
    /// 0e (LLDP); `none` for none. Pause (01) and LACP (02) are never forwarded.
    #[arg(long = "forward-link-local", value_name = "ADDR,…|none", value_delimiter = ',')]
    pub forward_link_local: Option<Vec<String>>,
    #[command(flatten)]
    pub target: client::TargetByName,
}

pub fn port_set(a: PortSetArgs) -> Result<()> {
    let set = PortSettings {
        rate_in: a.rate_in,
        rate_out: a.rate_out,
        burst: a.burst,
        storm_broadcast_pps: a.storm_broadcast_pps,
        storm_multicast_pps: a.storm_multicast_pps,
        storm_burst: a.storm_burst,
        forward_link_local: a.forward_link_local.map(|l| l.into_iter().filter(|x| x != "none").collect()),
    };
    if set == PortSettings::default() {
        bail!("nothing to change: give --rate-in, --rate-out, --burst, --storm-… or --forward-link-local (see --help)");
    }
    let mut c = Client::for_target(&a.target.into())?;
    let spec: PortSpec = c.call(&Request::PortSet { name: a.name.clone(), set })?;
    let mbit = |r: Option<f64>| r.map_or("none".to_string(), |r| format!("{r} Mbit/s"));
    println!(
        "port {}: rate_in {}, rate_out {}, storm broadcast {}, multicast {} pps, forward_link_local [{}]",
        a.name,
        mbit(spec.rate_in),
        mbit(spec.rate_out),
        spec.storm_broadcast_pps.map_or("-".into(), |p| p.to_string()),
        spec.storm_multicast_pps.map_or("-".into(), |p| p.to_string()),
        spec.forward_link_local.join(", ")
    );
    Ok(())
}

pub fn port_list(target: &Target, json: bool) -> Result<()> {
    let mut c = Client::for_target(target)?;
    let r: StatsReport = c.call(&Request::PortList)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    let mut t = table();
    t.set_header(["PORT", "TYPE", "NETNS", "VLAN", "MTU", "OFFLOAD", "LOSSLESS", "STATE"]);
    for p in &r.ports {
        t.add_row([
            p.name.clone(),
            p.kind.clone(),
            p.netns.clone().unwrap_or_else(|| "-".into()),
            p.vlan.clone(),
            p.mtu.to_string(),
            if p.offload { "on" } else { "off" }.into(),
            lossless_column(p).into(),
            match (&p.failed, &p.link) {
                (Some(why), _) => format!("failed: {why}"),
                (None, _) if p.paused => "paused".into(),
                (None, Some(l)) => l.clone(),
                (None, None) => "up".into(),
            },
        ]);
    }
    println!("switch {}: {} port(s)", r.switch.name, r.ports.len());
    if !r.ports.is_empty() {
        println!("{t}");
    }
    Ok(())
}

pub fn fib_show(target: &Target, vlan: Option<u16>, json: bool) -> Result<()> {
    let mut c = Client::for_target(target)?;
    let mut r: FibReport = c.call(&Request::FibShow)?;
    if let Some(v) = vlan {
        r.entries.retain(|e| e.vlan == v);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    let mut t = table();
    let tunnels = r.entries.iter().any(|e| e.endpoint.is_some());
    let mut head = vec!["VLAN", "MAC", "PORT", "AGE", "ORIGIN"];
    if tunnels {
        head.push("ENDPOINT");
    }
    t.set_header(head);
    for e in &r.entries {
        let mut row = vec![
            e.vlan.to_string(),
            e.mac.clone(),
            e.port.clone(),
            e.age_s.map_or("-".into(), |a| format!("{a:.0}s")),
            e.origin.clone(),
        ];
        if tunnels {
            row.push(e.endpoint.clone().unwrap_or_default());
        }
        t.add_row(row);
    }
    right(&mut t, 3);
    println!(
        "{} entries (max {}, aging {} s, {} moves, {} refused when full)",
        r.summary.entries, r.summary.max_entries, r.summary.aging_s, r.summary.moves, r.summary.full_refusals
    );
    if !r.entries.is_empty() {
        println!("{t}");
    }
    Ok(())
}

pub fn evpn_show(target: &Target, json: bool) -> Result<()> {
    let r: sluice_api::proto::EvpnReport = Client::for_target(target)?.call(&Request::EvpnShow)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    let sp = &r.speaker;
    let pid = sp.pid.map(|p| format!(", pid {p}")).unwrap_or_default();
    println!(
        "EVPN on port {}: AS {}, router id {}; speaker {} ({}{pid}, {} restarts), API {} ({})",
        r.port,
        sp.asn,
        sp.router_id,
        sp.mode,
        sp.state,
        sp.restarts,
        sp.api,
        if sp.connected { "connected" } else { "not connected" }
    );
    if let Some(e) = &sp.last_error
        && !sp.connected
    {
        println!("last error: {e}");
    }
    let mut t = table();
    t.set_header(vec!["PEER", "AS", "STATE"]);
    for p in &r.peers {
        t.add_row(vec![p.address.clone(), p.asn.to_string(), p.state.clone()]);
    }
    if !r.peers.is_empty() {
        println!("{t}");
    }
    for (what, routes) in [("sent", &r.sent), ("received", &r.received)] {
        println!("{} route(s) {what}", routes.len());
        if routes.is_empty() {
            continue;
        }
        let mut t = table();
        t.set_header(vec!["TYPE", "VNI", "MAC", "IP", "ENDPOINT", "SEQ", "STATUS"]);
        for x in routes.iter() {
            let seq = if x.sticky { format!("{} sticky", x.seq) } else { x.seq.to_string() };
            t.add_row(vec![
                x.route_type.to_string(),
                x.vni.to_string(),
                x.mac.clone().unwrap_or_else(|| "-".into()),
                x.ip.clone().unwrap_or_else(|| "-".into()),
                x.endpoint.clone(),
                seq,
                x.status.clone(),
            ]);
        }
        println!("{t}");
    }
    if !r.duplicates.is_empty() {
        println!("{} station(s) duplicate (moved between hosts too often): frozen", r.duplicates.len());
        let mut t = table();
        t.set_header(vec!["VNI", "MAC", "MOVES", "HOSTS", "FROZEN", "RECOVERS IN"]);
        for d in &r.duplicates {
            t.add_row(vec![
                d.vni.to_string(),
                d.mac.clone(),
                d.moves.to_string(),
                d.hosts.join(" "),
                format!("{} s", d.frozen_s),
                d.recovers_in_s.map_or_else(|| "when cleared".into(), |s| format!("{s} s")),
            ]);
        }
        println!("{t}");
    }
    let nonzero: Vec<String> = r.counters.iter().filter(|(_, v)| **v > 0).map(|(k, v)| format!("{k} {v}")).collect();
    if !nonzero.is_empty() {
        println!("counters: {}", nonzero.join(", "));
    }
    Ok(())
}

pub fn evpn_clear_duplicates(target: &Target, vni: Option<u32>, mac: Option<String>) -> Result<()> {
    let r: sluice_api::proto::EvpnCleared =
        Client::for_target(target)?.call(&Request::EvpnClearDuplicates { vni, mac })?;
    println!("{} duplicate station(s) cleared", r.cleared);
    Ok(())
}

pub fn mdb_show(target: &Target, json: bool) -> Result<()> {
    let r: sluice_api::proto::MdbReport = Client::for_target(target)?.call(&Request::MdbShow)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    if !r.enabled {
        println!("IGMP/MLD snooping is off (mcast_snooping = false): every group frame floods");
        return Ok(());
    }
    let who = |q: &sluice_api::proto::MdbQuerierReport| match (&q.address, &q.port) {
        (Some(a), Some(p)) => format!("{a} on {p}"),
        _ => "this switch".into(),
    };
    println!("snooping on; querier: IGMP {}, MLD {}", who(&r.querier_v4), who(&r.querier_v6));
    let mut t = table();
    t.set_header(vec!["VLAN", "GROUP", "PORT", "EXPIRES"]);
    for g in &r.groups {
        for m in &g.ports {
            t.add_row(vec![g.vlan.to_string(), g.group.clone(), m.port.clone(), format!("{:.0}s", m.expires_s)]);
        }
    }
    println!("{} group(s)", r.groups.len());
    if !r.groups.is_empty() {
        println!("{t}");
    }
    for p in &r.routers {
        match p.expires_s {
            Some(s) => println!("router port {} (learned, {s:.0}s left)", p.port),
            None => println!("router port {} (configured)", p.port),
        }
    }
    Ok(())
}

pub fn fib_add(target: &Target, mac: String, port: String, vlan: u16) -> Result<()> {
    Client::for_target(target)?.call_value(&Request::FibAdd { mac, vlan, port })?;
    Ok(())
}

/// `sluice grant add|del`.
pub fn grant(target: &Target, req: Request) -> Result<()> {
    Client::for_target(target)?.call_value(&req)?;
    Ok(())
}

/// `sluice grant list`.
pub fn grant_list(target: &Target, json: bool) -> Result<()> {
    let v = Client::for_target(target)?.call_value(&Request::GrantList)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if v["enforced"] != true {
        println!("grants are not enforced on this switch: any port may join any VLAN");
    } else if v["grants"].as_object().is_none_or(|m| m.is_empty())
        && v["promiscuous"].as_array().is_none_or(|a| a.is_empty())
    {
        println!("grants are enforced and no port has any: every port add will be refused");
    } else {
        let promisc: Vec<&str> = v["promiscuous"].as_array().into_iter().flatten().filter_map(|p| p.as_str()).collect();
        let mut ports: Vec<&str> = v["grants"].as_object().into_iter().flatten().map(|(p, _)| p.as_str()).collect();
        ports.extend(promisc.iter().filter(|p| v["grants"].get(**p).is_none()));
        ports.sort();
        for port in ports {
            let list: Vec<String> = v["grants"][port].as_array().into_iter().flatten().map(|x| x.to_string()).collect();
            let vl = if list.is_empty() { "no VLAN".to_string() } else { format!("VLAN {}", list.join(",")) };
            println!("{port:16} {vl}{}", if promisc.contains(&port) { ", promiscuous" } else { "" });
        }
    }
    Ok(())
}

pub fn fib_del(target: &Target, mac: String, vlan: u16) -> Result<()> {
    Client::for_target(target)?.call_value(&Request::FibDel { mac, vlan })?;
    Ok(())
}

pub fn stats(a: StatsArgs) -> Result<()> {
    if let Some(StatsSub::Reset { target }) = a.reset {
        let t = if target.switch.is_some() || target.socket.is_some() { target } else { a.target };
        Client::for_target(&t)?.call_value(&Request::StatsReset)?;
        println!("counters reset");
        return Ok(());
    }
    let mut c = Client::for_target(&a.target)?;
    let r: StatsReport = c.call(&Request::Stats { port: a.port.clone() })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    print!("{}", render_stats(&r, a.port.is_some()));
    Ok(())
}

/// The stats table (or one port's details) as text.
pub fn render_stats(r: &StatsReport, detail: bool) -> String {
    let s = &r.switch;
    let mut out = format!(
        "switch {} ({}, {}, {}{}): {} port(s), counters of the last {:.1} s\n",
        s.name,
        s.mode,
        if s.lossless { "lossless" } else { "lossy" },
        if s.poll { "polling" } else { "event-driven" },
        if s.datapath == "kernel" { ", kernel datapath" } else { "" },
        r.ports.len(),
        r.counters_age_s
    );
    if detail {
        for p in &r.ports {
            out += &render_port(p);
        }
        return out;
    }
    let mut t = table();
    t.set_header([
        "PORT",
        "VLAN",
        "RX FRAMES",
        "RX BYTES",
        "TX FRAMES",
        "TX BYTES",
        "GSO IN",
        "GSO OUT",
        "FLOODED",
        "DROPS",
        "KERNEL DROPS",
        "QUEUED",
    ]);
    for p in &r.ports {
        let c = &p.counters;
        let drops = c.rx_drops.total() + c.tx_drops.total();
        t.add_row([
            p.name.clone(),
            p.vlan.clone(),
            si(c.rx_frames),
            bytes(c.rx_bytes),
            si(c.tx_frames),
            bytes(c.tx_bytes),
            si(c.rx_gso),
            format!(
                "{}{}",
                si(c.tx_gso),
                if c.tx_segmented > 0 { format!("+{}cut", si(c.tx_segmented)) } else { String::new() }
            ),
            si(c.flooded),
            si(drops),
            p.device_drops.map_or("-".into(), |d| format!("{}/{}", si(d.to_guest), si(d.from_guest))),
            p.queued.to_string(),
        ]);
    }
    right(&mut t, 2);
    out += &t.to_string();
    out += "\nDROPS: dropped by the switch (see `sluice stats PORT` for causes). KERNEL DROPS: \
dropped by the TAP device in the kernel, to guest / from guest.\n";
    if let Some(k) = &r.kernel {
        out += &format!(
            "Kernel datapath: upcalls through {}, {} dropped there for a full queue, {} refused (no port), \
             {} sent there by others refused; {} map updates refused (those frames go up).\n",
            k.upcall_device,
            k.upcall_queue_drops.map_or("?".into(), si),
            si(k.upcalls_refused),
            si(k.upcall_egress_refused),
            si(k.map_updates_failed)
        );
    }
    out
}

/// Whether a port's sender can be held back, and where its frames can be lost if not (the
/// `LOSSLESS` column of `sluice port list`).
fn lossless_column(p: &PortStats) -> &'static str {
    match (p.lossless_input, p.kind.as_str()) {
        (true, _) => "yes",
        (false, "uplink") => "no: the LAN drops",
        (false, "tap" | "veth") => "no: kernel drops",
        (false, _) => "no",
    }
}

/// The causes with a non-zero count, by name.
fn nonzero(d: &sluice_switch::counters::DropCounts) -> impl Iterator<Item = (&'static str, u64)> + '_ {
    sluice_switch::DropCause::ALL.into_iter().map(|c| (c.name(), d.get(c))).filter(|&(_, n)| n > 0)
}

fn render_port(p: &PortStats) -> String {
    let c = &p.counters;
    let mut t = table();
    let mut row = |k: &str, v: String| {
        t.add_row([k.to_string(), v]);
    };
    row(
        "port",
        format!("{} ({}, {}, MTU {}, offload {})", p.name, p.kind, p.vlan, p.mtu, if p.offload { "on" } else { "off" }),
    );
    if let Some(ns) = &p.netns {
        row("netns", ns.clone());
    }
    if let Some(f) = &p.failed {
        row("FAILED", f.clone());
    }
    row("rx frames / bytes", format!("{} / {}", c.rx_frames, c.rx_bytes));
    if let Some(k) = &p.kernel {
        row(
            "  in the kernel",
            format!(
                "{} forwarded, {} flooded, {} dropped, {} sent up to the core ({} of a new kind, {} on the way)",
                k.forwarded, k.flooded, k.drops, k.upcalls, k.misses, p.upcall
            ),
        );
    }
    row("  GSO frames", c.rx_gso.to_string());
    row("  forwarded / flooded", format!("{} / {}", c.forwarded, c.flooded));
    row("  copies to outputs", c.copies.to_string());
    for (cause, n) in nonzero(&c.rx_drops) {
        row(&format!("  dropped: {cause}"), n.to_string());
    }
    row("  held (lossless)", format!("{} now{}, {} pauses", p.held, if p.paused { " (paused)" } else { "" }, c.pauses));
    if c.consumed > 0 || c.generated > 0 || p.resolving > 0 {
        row("  taken by the switch", format!("{} (ARP/ND; on an uplink, frames for its own address)", c.consumed));
        row("  waiting for resolution", p.resolving.to_string());
    }
    if c.failovers > 0 {
        row("  failovers", c.failovers.to_string());
    }
    row("tx offered", c.tx_offered.to_string());
    if c.generated > 0 {
        row("  written by the switch", format!("{} (ARP/ND answers and requests, announcements)", c.generated));
    }
    row("tx frames / bytes", format!("{} / {}", c.tx_frames, c.tx_bytes));
    row("  GSO whole", c.tx_gso.to_string());
    row("  GSO cut in software", format!("{} frames → {} segments", c.tx_segmented, c.tx_segments));
    row("  checksums completed", c.tx_csum_filled.to_string());
    for (cause, n) in nonzero(&c.tx_drops) {
        row(&format!("  dropped: {cause}"), n.to_string());
    }
    row("  queued", p.queued.to_string());
    // Classes: shown when there are several, or the one there is saw its watchdog.
    if p.classes.len() > 1 || p.classes.iter().any(|k| k.stuck || k.counters.watchdog_trips > 0) {
        for k in &p.classes {
            let kc = &k.counters;
            row(
                &format!("class {}", k.name),
                format!(
                    "{}: in {}, out {} / {} bytes, queued {}{}",
                    if k.lossless { "lossless" } else { "lossy" },
                    kc.rx_frames,
                    kc.tx_frames,
                    kc.tx_bytes,
                    k.queued,
                    if k.stuck { ", STUCK (watchdog)" } else { "" }
                ),
            );
            if kc.watchdog_trips > 0 {
                row("  watchdog trips", kc.watchdog_trips.to_string());
            }
            for (cause, n) in nonzero(&kc.tx_drops) {
                row(&format!("  dropped: {cause}"), n.to_string());
            }
        }
    }
    if let Some(d) = p.device_drops {
        row("kernel drops to guest", d.to_guest.to_string());
        row("kernel drops from guest", d.from_guest.to_string());
    }
    format!("{t}\n")
}

/// An EtherType: hexadecimal with `0x` (as Wireshark and `ip link` print them) or decimal.
fn ethertype_arg(s: &str) -> Result<u16, String> {
    let n = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u16::from_str_radix(hex, 16),
        None => s.parse::<u16>(),
    }
    .map_err(|_| format!("{s:?} is not an EtherType: write it as 0x88cc"))?;
    if n < 0x0600 {
        return Err(format!("{s} is a frame length, not an EtherType (EtherTypes start at 0x0600)"));
    }
    Ok(n)
}

/// How logs are written (the global `--log-format`).
#[derive(Debug, Default, clap::Args)]
pub struct LogArgs {
    /// How logs on stderr look: `plain` text, one `json` object per line (for journald or a
    /// log shipper), or `auto`: plain, coloured only when stderr is a terminal. Default:
    /// $SLUICE_LOG_FORMAT, else auto. RUST_LOG chooses how much (e.g. RUST_LOG=debug).
    #[arg(long, global = true, value_enum, value_name = "FORMAT")]
    pub log_format: Option<LogFormat>,
}

/// A log format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Plain text, coloured only when stderr is a terminal.
    Auto,
    /// Plain text, never coloured.
    Plain,
    /// One JSON object per line.
    Json,
}

/// Starts the log subscriber as `a` (or $SLUICE_LOG_FORMAT) says.
pub fn init_logs(a: &LogArgs) {
    use std::io::IsTerminal;
    let mut bad_env = None;
    let format = a.log_format.unwrap_or_else(|| match std::env::var("SLUICE_LOG_FORMAT").as_deref() {
        Err(_) | Ok("") | Ok("auto") => LogFormat::Auto,
        Ok("plain") => LogFormat::Plain,
        Ok("json") => LogFormat::Json,
        Ok(other) => {
            bad_env = Some(other.to_string());
            LogFormat::Auto
        }
    });
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false);
    match format {
        LogFormat::Json => b.json().with_current_span(false).init(),
        LogFormat::Plain => b.with_ansi(false).init(),
        LogFormat::Auto => {
            let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
            b.with_ansi(colour).init()
        }
    }
    if let Some(v) = bad_env {
        tracing::warn!("SLUICE_LOG_FORMAT={v:?} is not a log format (auto, plain or json): using auto");
    }
}

/// `sluice switch check FILE`: checks it as `switch run` would and prints a summary.
pub fn switch_check(file: &std::path::Path) -> Result<()> {
    let src = sluice_daemon::Source {
        file: file.to_path_buf(),
        poll: false,
        datapath: None,
        metrics: None,
        vhost_allow_users: None,
        vhost_allow_groups: None,
    };
    let s = src.read().map_err(anyhow::Error::msg)?;
    println!(
        "{}: ok: switch {}, {} mode, {} datapath, {} ports, {} static MAC entries{}; control socket {}",
        file.display(),
        s.name,
        s.mode.as_str(),
        s.datapath.as_str(),
        s.ports.len(),
        s.macs.len(),
        if s.grants.is_some() { ", grants enforced" } else { "" },
        s.socket.display()
    );
    Ok(())
}

/// `sluice switch reload`: sends the switch's daemon SIGHUP. Its process is the one the
/// kernel says is at the other end of its control socket (not what the daemon says).
pub fn switch_reload(target: &Target) -> Result<()> {
    let path = client::resolve(target)?;
    let mut c = Client::connect(&path)?;
    let s: SwitchSummary = c.call(&Request::Hello)?;
    let peer = std::os::unix::net::UnixStream::connect(&path)
        .and_then(|p| sluice_sys::peer_cred(&p))
        .map_err(|e| anyhow::anyhow!("cannot tell which process serves {}: {e}", path.display()))?;
    let pid = u32::try_from(peer.0).ok().filter(|&p| p > 1);
    let Some(pid) = pid.filter(|&p| p == s.pid) else {
        bail!(
            "the process at {} (pid {}) is not the one switch {} says it is (pid {}); restart the switch",
            path.display(),
            peer.0,
            s.name,
            s.pid
        );
    };
    sluice_sys::kill(pid, sluice_sys::proc::RELOAD_SIGNAL)
        .map_err(|e| anyhow::anyhow!("cannot signal switch {} (pid {pid}): {e}", s.name))?;
    println!("switch {} (pid {pid}) reloads its configuration file; its log says what changed", s.name);
    Ok(())
}

/// `sluice api`: about the control API itself.
#[derive(Debug, clap::Subcommand)]
pub enum ApiCmd {
    /// Print the control API's JSON Schema (the one checked in as docs/api.schema.json),
    /// generated from the types the daemon and this CLI use.
    ///
    /// Example:
    ///   sluice api schema > docs/api.schema.json
    #[command(verbatim_doc_comment)]
    Schema,
}

/// Prints the control API's JSON Schema.
pub fn api_schema() -> Result<()> {
    println!("{}", serde_json::to_string_pretty(&sluice_api::proto::schema())?);
    Ok(())
}

/// `sluice events`'s arguments.
#[derive(Debug, clap::Args)]
pub struct EventsArgs {
    /// Only events of this kind (repeat for several): port_up, port_down, station_learned,
    /// station_moved, station_aged, station_removed, uplink_failover, events_lost. Default:
    /// all.
    #[arg(long = "kind", value_name = "KIND")]
    pub kinds: Vec<String>,
    /// Print each event as the JSON object the switch sent (the notification's params).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

/// Follows a switch's events until Ctrl-C (or the switch goes away).
pub fn events(a: EventsArgs) -> Result<()> {
    use std::io::{BufRead, Write};
    for k in &a.kinds {
        if !EVENT_KINDS.contains(&k.as_str()) {
            bail!("no event kind {k:?}; the kinds are {}", EVENT_KINDS.join(", "));
        }
    }
    let mut lines = Client::for_target(&a.target)?.into_events(a.kinds)?;
    let mut out = std::io::stdout().lock();
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line)? == 0 {
            bail!("the switch closed the connection (it stopped, or found this reader too slow)");
        }
        let v: serde_json::Value = serde_json::from_str(&line)?;
        let params = &v["params"];
        if a.json {
            writeln!(out, "{params}")?;
        } else {
            match serde_json::from_value::<Event>(params.clone()) {
                Ok(e) => writeln!(out, "{}", event_text(&e))?,
                // (A kind newer than this sluice: shown as it came.)
                Err(_) => writeln!(out, "{params}")?,
            }
        }
        out.flush()?;
    }
}

/// One event as `sluice events` prints it: the time (UTC), the kind, what it concerns.
fn event_text(e: &Event) -> String {
    let secs = e.time as u64;
    let (h, m, s, ms) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60, ((e.time.fract()) * 1000.0) as u64);
    let what = match &e.what {
        EventKind::PortUp { port, reason } | EventKind::PortDown { port, reason } => format!("{port} ({reason})"),
        EventKind::StationLearned { mac, vlan, port, is_static } => {
            format!("{mac} vlan {vlan} on {port}{}", if *is_static { " (static)" } else { "" })
        }
        EventKind::StationMoved { mac, vlan, port, from } => format!("{mac} vlan {vlan} from {from} to {port}"),
        EventKind::StationAged { mac, vlan, port } => format!("{mac} vlan {vlan} on {port}"),
        EventKind::StationRemoved { mac, vlan, port, .. } => format!("{mac} vlan {vlan} on {port}"),
        EventKind::UplinkFailover { port, what } => format!("{port}: {what}"),
        EventKind::EventsLost { count } => format!("{count} event(s) lost"),
    };
    format!("{h:02}:{m:02}:{s:02}.{ms:03}Z {:<16} {what}", e.what.name())
}

// ---- `sluice status`: the switch and its gateway (docs/policy.md, "A gateway"). ----

/// Arguments of `sluice status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Print JSON (the `hello` answer: the switch's summary, its `gateway` within).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

/// `sluice status`: what the switch runs, and its gateway's dnsmasq.
pub fn status(a: &StatusArgs) -> Result<()> {
    let s: SwitchSummary = Client::for_target(&a.target)?.call(&Request::Hello)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    print!("{}", render_status(&s));
    Ok(())
}

/// `sluice status` as text.
pub fn render_status(s: &SwitchSummary) -> String {
    let mut t = table();
    let mut row = |k: &str, v: String| {
        t.add_row([k.to_string(), v]);
    };
    row("switch", format!("{} (pid {}, {} datapath, {} mode, {} ports)", s.name, s.pid, s.datapath, s.mode, s.ports));
    match &s.gateway {
        None => row("gateway", "none (set `gateway = \"10.77.0.254/24\"` in the switch's file)".into()),
        Some(g) => {
            let v6 = g.address6.as_ref().map(|a| format!(", {a} (router advertisements)")).unwrap_or_default();
            row("gateway", format!("{}{v6} on {} (port {})", g.address, g.interface, g.port));
            row("dhcp", format!("{}{}", g.dhcp_range, if g.dns { ", DNS" } else { ", no DNS" }));
            let out = g.uplink.as_deref().unwrap_or("any interface");
            row("masquerade", format!("out of {out} (nftables table ip {})", g.nft_table));
            let pid = g.pid.map(|p| format!(", pid {p}")).unwrap_or_default();
            row("dnsmasq", format!("{}{pid}, {} restarts", g.dnsmasq, g.restarts));
            if let Some(e) = &g.last_exit {
                row("last exit", e.clone());
            }
        }
    }
    format!("{t}\n")
}

// Security groups (`sluice acl`).

/// `sluice acl`: security groups, stateful rules per port (docs/policy.md).
#[derive(Debug, clap::Subcommand)]
pub enum AclCmd {
    /// Add a rule to PORT (attached or not); prints the rule's id.
    ///
    /// `in` is what the port's guest sends, `out` what the switch sends to it. Rules are
    /// tried by priority, higher first; the first match decides, else the port's default
    /// (allow unless set). `allow-related` also lets the connection's return traffic pass.
    ///
    /// Examples:
    ///   sluice acl add vm1 --dir in --action allow-related --proto tcp --dport 80
    ///   sluice acl add vm1 --dir out --action allow --proto tcp --src 10.0.0.0/24 --dport 22
    ///   sluice acl add vm1 --dir out --action allow --proto icmp --icmp-type 8
    ///   sluice acl default vm1 --dir out deny
    #[command(verbatim_doc_comment)]
    Add {
        /// Port name.
        port: String,
        /// in (what the guest sends) or out (what it is sent).
        #[arg(long)]
        dir: String,
        /// allow, deny or allow-related.
        #[arg(long)]
        action: String,
        /// tcp, udp, icmp or icmp6.
        #[arg(long)]
        proto: Option<String>,
        /// Source prefix, e.g. 10.0.0.0/8 or fd00::/64.
        #[arg(long, value_name = "CIDR")]
        src: Option<String>,
        /// Destination prefix.
        #[arg(long, value_name = "CIDR")]
        dst: Option<String>,
        /// Destination port or range (tcp, udp), e.g. 22 or 8000-8080.
        #[arg(long, value_name = "N[-M]")]
        dport: Option<String>,
        /// ICMP type (icmp, icmp6), e.g. 8 for an echo request.
        #[arg(long, value_name = "N")]
        icmp_type: Option<u8>,
        /// EtherType: ipv4, ipv6, arp or a number (implied by the prefixes and protocol).
        #[arg(long)]
        ethertype: Option<String>,
        /// Higher first (default 0).
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        priority: i32,
        #[command(flatten)]
        target: Target,
    },
    /// Delete a rule: `sluice acl del PORT ID`, or `sluice acl del ID`.
    ///
    /// Example:
    ///   sluice acl del vm1 3
    #[command(verbatim_doc_comment)]
    Del {
        /// [PORT] ID.
        #[arg(num_args = 1..=2, required = true, value_name = "PORT ID")]
        what: Vec<String>,
        #[command(flatten)]
        target: Target,
    },
    /// Show the rules (of PORT, or all) with their hits, the defaults and the connection
    /// table.
    ///
    /// Examples:
    ///   sluice acl list
    ///   sluice acl list vm1 --json | jq '.rules[] | {id, hits}'
    #[command(verbatim_doc_comment)]
    List {
        /// Only this port.
        port: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Set PORT's default action for a direction (allow unless set).
    ///
    /// Example:
    ///   sluice acl default vm1 --dir in deny
    #[command(verbatim_doc_comment)]
    Default {
        /// Port name.
        port: String,
        /// in or out.
        #[arg(long)]
        dir: String,
        /// allow or deny.
        action: String,
        #[command(flatten)]
        target: Target,
    },
}

/// `sluice acl …`.
pub fn acl(cmd: AclCmd) -> Result<()> {
    match cmd {
        AclCmd::Add { port, dir, action, proto, src, dst, dport, icmp_type, ethertype, priority, target } => {
            let rule =
                sluice_switch::acl::AclRuleSpec { dir, action, proto, src, dst, dport, icmp_type, ethertype, priority };
            let r: AclAdded = Client::for_target(&target)?.call(&Request::AclAdd { port, rule })?;
            println!("{}", r.id);
        }
        AclCmd::Del { what, target } => {
            let (port, id) = match what.as_slice() {
                [id] => (None, id),
                [port, id] => (Some(port.clone()), id),
                _ => bail!("usage: sluice acl del [PORT] ID"),
            };
            let Ok(id) = id.parse::<u32>() else { bail!("{id:?} is not a rule id; see `sluice acl list`") };
            Client::for_target(&target)?.call_value(&Request::AclDel { port, id })?;
        }
        AclCmd::List { port, json, target } => {
            let v = Client::for_target(&target)?.call_value(&Request::AclList { port })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            let r: AclReport = serde_json::from_value(v)?;
            let mut t = Table::new();
            t.load_style(comfy_table::presets::NOTHING);
            t.set_header(["PORT", "ID", "PRIO", "DIR", "ACTION", "MATCH", "HITS"]);
            for l in &r.rules {
                let s = &l.rule;
                let mut m = Vec::new();
                for (k, v) in [
                    ("ethertype", s.ethertype.clone()),
                    ("proto", s.proto.clone()),
                    ("src", s.src.clone()),
                    ("dst", s.dst.clone()),
                    ("dport", s.dport.clone()),
                    ("icmp-type", s.icmp_type.map(|t| t.to_string())),
                ] {
                    if let Some(v) = v {
                        m.push(format!("{k} {v}"));
                    }
                }
                let m = if m.is_empty() { "any".to_string() } else { m.join(" ") };
                t.add_row([
                    l.port.clone(),
                    l.id.to_string(),
                    s.priority.to_string(),
                    s.dir.clone(),
                    s.action.clone(),
                    m,
                    l.hits.to_string(),
                ]);
            }
            if !r.rules.is_empty() {
                println!("{t}");
            }
            for d in &r.defaults {
                println!("port {}: default in {}, out {}", d.port, d.dir_in, d.out);
            }
            let c = &r.conntrack;
            match c.kernel_zone {
                Some(z) => println!(
                    "connections: TCP and UDP in the kernel's conntrack, zone {z} (`conntrack -L -w {z}`); ICMP echo and ports in user space: {} of {} ({} refused when full)",
                    c.entries, c.max, c.full
                ),
                None => println!("connections: {} of {} ({} refused when full)", c.entries, c.max, c.full),
            }
        }
        AclCmd::Default { port, dir, action, target } => {
            Client::for_target(&target)?.call_value(&Request::AclDefault { port, dir, action })?;
        }
    }
    Ok(())
}
