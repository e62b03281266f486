//! `sluice`: a user-space virtual switch for Linux hosts and their guests.

mod bench;
mod capture;
mod cli;
mod demo;
mod manpages;
mod report;
mod top;

// The parts that read what the outside writes, in the library (fuzzed from fuzz/).
use sluice_api::config::{self, DatapathArg};
use sluice_daemon as daemon;
use sluice_lab::guests as lab;
use sluice_ports as port;
use sluice_smc_launch as smc;
use sluice_study as study;
use sluice_sys as sys;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use sluice_api::client::Target;
use sluice_api::proto::Request;

/// A user-space virtual switch for Linux hosts and their guests.
///
/// sluice connects guests — network namespaces, containers, VMs — to each other and to the
/// LAN: through veth pairs forwarded by TC programs in the kernel (the kernel datapath) or
/// TAP ports forwarded by a user-space thread, switching at Layer 2 or 3 with MAC learning,
/// VLANs, jumbo frames and GSO offloads, in lossy or lossless mode; every decision is its
/// user-space core's. One daemon runs per switch (`sluice switch run`); the other commands
/// talk to it over its control socket.
///
/// First steps:
///   sluice demo                     a two-guest lab: ping, transfer, bench, counters
///   sluice lab up --guests 3        keep a lab running; then `sluice stats`, `sluice fib show`
///   sluice lab exec g1 -- ping 10.77.0.2
///   sluice lab down
#[derive(Parser, Debug)]
#[command(name = "sluice", version, verbatim_doc_comment, propagate_version = true)]
#[command(after_help = EXIT_STATUS)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    #[command(flatten)]
    log: cli::LogArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run or list switch daemons.
    #[command(subcommand)]
    Switch(SwitchCmd),
    /// Attach, detach and list ports of a running switch.
    #[command(subcommand)]
    Port(PortCmd),
    /// Show and edit the MAC forwarding table.
    #[command(subcommand)]
    Fib(FibCmd),
    /// IGMP/MLD snooping's multicast database.
    ///
    /// Examples:
    ///   sluice mdb show
    ///   sluice mdb show --json --switch sw0
    #[command(subcommand)]
    Mdb(MdbCmd),
    /// EVPN: the BGP speaker, its sessions, and the routes the switch announced and
    /// received (a switch with an `[evpn]` table; docs/evpn.md).
    ///
    /// Examples:
    ///   sluice evpn show
    ///   sluice evpn show --json --switch h1
    #[command(subcommand, verbatim_doc_comment)]
    Evpn(EvpnCmd),
    /// Show per-port counters (`sluice stats reset` zeroes them).
    Stats(cli::StatsArgs),
    /// A live view of the switch: each port's and traffic class's frames and bits per
    /// second, drops per second by cause, queue depths and the datapath's CPU, refreshed in
    /// place every second (`q` quits). `--once` prints one table for scripts.
    ///
    /// Examples:
    ///   sluice top
    ///   sluice top --switch sw0 --interval 2
    ///   sluice top --once
    #[command(verbatim_doc_comment)]
    Top(top::TopArgs),
    /// Capture a port's frames as pcap, for tcpdump, tshark or Wireshark: as the port
    /// delivers them (in) and as the switch sends them (out, VLAN-tagged as on the wire).
    /// A FILTER in libpcap's syntax keeps only the frames it matches. Stops at Ctrl-C or
    /// after -c N frames; prints how many it kept and how many the switch could not copy.
    ///
    /// Examples:
    ///   sluice capture tap1 -w tap1.pcap
    ///   sluice capture tap1 -c 10 icmp or arp | tshark -r -
    ///   sluice capture uplink0 --direction in -w in.pcap vlan 10 and tcp port 80
    #[command(verbatim_doc_comment)]
    Capture(capture::CaptureArgs),
    /// Monitor records: every counter of the switch written to a file each interval (one
    /// JSON line per record, rotated), for `sluice report`.
    ///
    /// Examples:
    ///   sluice monitor start --file /var/log/sluice/sw0.monitor --interval 1s
    ///   sluice monitor status
    ///   sluice monitor stop
    #[command(subcommand, verbatim_doc_comment)]
    Monitor(report::MonitorCmd),
    /// Reduce a monitor file to per-interval tables (rates, drops, CPU per MB) and charts
    /// over time: FILE-report/report.md, intervals.csv and charts/*.png.
    ///
    /// Example:
    ///   sluice report /var/log/sluice/sw0.monitor --out sw0-report
    #[command(verbatim_doc_comment)]
    Report(report::ReportArgs),
    /// Throw-away guests in network namespaces, attached to a switch.
    #[command(subcommand)]
    Lab(lab::LabCmd),
    /// Show sluice at work: a two-guest lab, ping, a TCP transfer, a workload-modeler run,
    /// the counters.
    Demo(demo::DemoArgs),
    /// The workload modeler: RR, CRR and streaming workloads from uperf profiles, measured
    /// as transactions/s, MB/s, latency percentiles and CPU per transaction.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
    /// Compare network paths side by side on this host: build them from
    /// namespaces (sluice, Linux bridge, router, direct veth), run the workloads through
    /// each, and write tables of rates and CPU per unit with ratios, CSV and charts.
    #[command(subcommand)]
    Study(study::StudyCmd),
    /// The shared-memory fast path for TCP between programs on this host (SMC-D in user
    /// space): `sluice smc run -- PROGRAM`.
    #[command(subcommand)]
    Smc(smc::SmcCmd),
    /// Print a completion script for a shell, generated from this command line's own
    /// definition.
    ///
    /// Examples:
    ///   sluice completion bash > /etc/bash_completion.d/sluice
    ///   sluice completion zsh > /usr/local/share/zsh/site-functions/_sluice
    ///   sluice completion fish > /etc/fish/completions/sluice.fish
    #[command(verbatim_doc_comment)]
    Completion(manpages::CompletionArgs),
    /// Write the manual pages: sluice.1 and one per command (sluice-port-add.1, …),
    /// generated from this command line's own definition.
    ///
    /// Example:
    ///   sluice man --out /usr/local/share/man/man1 && man sluice
    #[command(verbatim_doc_comment)]
    Man(manpages::ManArgs),
    /// Which VLANs each port may join, and which may be promiscuous (a mirror), on a switch
    /// with `grants = true` (as z/VM's virtual switch grants access): anything else is
    /// refused.
    #[command(subcommand)]
    Grant(GrantCmd),
    /// The control API's description, for programs that talk to a switch (docs/api.md).
    #[command(subcommand)]
    Api(cli::ApiCmd),
    /// Follow a switch's events as they happen: ports up and down, stations learned,
    /// moved and aged, uplink failovers, one line each, until Ctrl-C.
    ///
    /// Examples:
    ///   sluice events
    ///   sluice events --switch sw0 --kind station_learned --kind station_moved
    ///   sluice events --json | jq .kind
    #[command(verbatim_doc_comment)]
    Events(cli::EventsArgs),
    /// What a switch runs, and its gateway: the address, the DHCP range, the masquerade, and
    /// dnsmasq's state (running, its pid, how many times it was restarted, how it last
    /// exited).
    ///
    /// Examples:
    ///   sluice status --switch sw0
    ///   sluice status --json | jq .gateway.restarts
    #[command(verbatim_doc_comment)]
    Status(cli::StatusArgs),
    /// Security groups: stateful allow/deny rules per port and direction, with hit
    /// counters (docs/policy.md).
    #[command(subcommand)]
    Acl(cli::AclCmd),
}

#[derive(Subcommand, Debug)]
enum GrantCmd {
    /// Let PORT join VLANs, or be promiscuous (the port need not exist yet).
    Add {
        /// Port name.
        port: String,
        /// VLANs, e.g. 10,20.
        #[arg(long = "vlan", value_name = "VID,…", value_delimiter = ',', required_unless_present = "promiscuous")]
        vlans: Vec<u16>,
        /// Let it be promiscuous: a mirror of other ports' traffic (`port add --mirror`).
        #[arg(long)]
        promiscuous: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Take VLANs or promiscuous mode back from PORT (everything without --vlan or
    /// --promiscuous); refused while the port uses them.
    Del {
        /// Port name.
        port: String,
        /// VLANs, e.g. 10,20.
        #[arg(long = "vlan", value_name = "VID,…", value_delimiter = ',')]
        vlans: Vec<u16>,
        /// Revoke promiscuous mode.
        #[arg(long)]
        promiscuous: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Show the grants.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Subcommand, Debug)]
enum SwitchCmd {
    /// Run a switch in the foreground, as described by a TOML file.
    ///
    /// The control socket is /run/sluice/NAME.sock (mode 0600) unless the file sets
    /// `socket`. Stop with Ctrl-C, SIGTERM or `sluice switch stop`. Logs go to stderr;
    /// RUST_LOG=debug shows every control request. See docs/config.md for the format.
    /// SIGHUP (`sluice switch reload`, `systemctl reload sluice@NAME`) applies the edited
    /// file; as a systemd service see docs/service.md.
    ///
    /// A gateway for the guests, as libvirt's default network (DHCP and router
    /// advertisements by dnsmasq, the subnet masqueraded; docs/policy.md):
    ///   name = "sw0"
    ///   gateway = "10.77.0.254/24"
    ///   gateway_uplink = "eth0"
    /// then `sluice status --switch sw0` shows it and its dnsmasq.
    #[command(verbatim_doc_comment)]
    Run {
        /// The switch's configuration file.
        #[arg(long, short = 'c', value_name = "FILE")]
        config: PathBuf,
        /// Busy-poll the ports instead of sleeping until one is ready: lower latency, but
        /// one core stays 100% busy.
        #[arg(long)]
        poll: bool,
        /// Which datapath forwards, overriding the file's `datapath`: `user` (one thread
        /// moves every frame; TAP and uplink ports) or `kernel` (TC programs forward
        /// between veth ports in the kernel; the core decides what they execute).
        #[arg(long, value_enum, value_name = "KIND")]
        datapath: Option<DatapathArg>,
        /// Serve Prometheus / OpenMetrics metrics at http://ADDR/metrics, e.g.
        /// 127.0.0.1:9750, overriding the file's `metrics_listen` (off by default).
        #[arg(long, value_name = "ADDR:PORT")]
        metrics: Option<String>,
        /// Users (names or uids, comma-separated or repeated) whose programs may drive the
        /// vhost-user ports, replacing the file's `vhost_allow_users`; root and the switch's
        /// own user always may. E.g. --vhost-allow-user libvirt-qemu
        #[arg(long, value_name = "USER", value_delimiter = ',')]
        vhost_allow_user: Option<Vec<String>>,
        /// Groups (names or gids) whose members' programs may drive the vhost-user ports,
        /// replacing the file's `vhost_allow_groups` (default: the group libvirt runs QEMU
        /// in). E.g. --vhost-allow-group libvirt-qemu
        #[arg(long, value_name = "GROUP", value_delimiter = ',')]
        vhost_allow_group: Option<Vec<String>>,
    },
    /// List running switches.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check a configuration file without running it: everything `switch run` checks
    /// before it touches the system (not whether namespaces or devices exist). Exits 0
    /// with a one-line summary, or 1 naming the file, the line and what to fix.
    ///
    /// Example:
    ///   sluice switch check /etc/sluice/sw0.toml && systemctl reload sluice@sw0
    #[command(verbatim_doc_comment)]
    Check {
        /// The configuration file.
        file: PathBuf,
    },
    /// Make a running switch read its configuration file again and apply the difference
    /// (SIGHUP, as `systemctl reload sluice@NAME` sends): ports removed, changed or added
    /// in the file; its other ports keep forwarding. The switch's log says what changed;
    /// a bad file changes nothing. See docs/service.md.
    ///
    /// Example:
    ///   sluice switch reload --switch sw0
    #[command(verbatim_doc_comment)]
    Reload {
        #[command(flatten)]
        target: Target,
    },
    /// Stop a running switch (its ports and their TAP devices go with it, and on the kernel
    /// datapath its programs, maps and upcall TAP: nothing is left).
    Stop {
        #[command(flatten)]
        target: Target,
    },
    /// Start a running switch's daemon again in place (same process id, the program read
    /// anew: an upgraded binary takes over). On the kernel datapath frames keep flowing
    /// between veth guests meanwhile and the new daemon takes the kernel's state over;
    /// TAP guests keep their interfaces (sluice's TAPs are persistent) and the new daemon
    /// adopts them: their TCP connections retransmit, never reset. After a crash, any later
    /// `sluice switch run` of the same switch does the same.
    Restart {
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Subcommand, Debug)]
enum PortCmd {
    /// Attach a port: a TAP it creates (the default), an uplink, a veth, a stream, a vxlan tunnel
    /// or a QEMU VM over vhost-user.
    ///
    /// Examples:
    ///   sluice port add tap0 --netns blue            access port of VLAN 1
    ///   sluice port add tap1 --vlan 10 --mtu 8992    access port of VLAN 10, jumbo frames
    ///   sluice port add tap2 --trunk 10,20 --native 1
    ///   sluice port add vx0 --type vxlan --netns host1 --local 192.168.77.1 --remote 192.168.77.2 --vni 5000
    ///   sluice port add c0 --type veth --netns /proc/4242/ns/net --ifname eth0 --may-exist
    ///   sluice port add vm1 --type vhost-user --socket /run/sluice/vm1.sock
    ///       then: qemu-system-x86_64 … -object memory-backend-memfd,id=mem,size=1G,share=on
    ///             -machine memory-backend=mem -chardev socket,id=c1,path=/run/sluice/vm1.sock,reconnect=1
    ///             -netdev vhost-user,id=n1,chardev=c1 -device virtio-net-pci,netdev=n1
    #[command(verbatim_doc_comment, after_help = EXIT_STATUS)]
    Add(Box<cli::PortAddArgs>),
    /// Change a running port's rate limits, storm control or link-local forwarding; the
    /// settings not given stay, a 0 removes one.
    ///
    /// Examples:
    ///   sluice port set vm1 --rate-in 100 --rate-out 50     Mbit/s on the wire
    ///   sluice port set vm1 --rate-in 0                     no rate-in limit
    ///   sluice port set vm1 --storm-broadcast-pps 1000 --storm-burst 200
    ///   sluice port set vm1 --forward-link-local 0e         the port's LLDP crosses
    #[command(verbatim_doc_comment, after_help = EXIT_STATUS)]
    Set(Box<cli::PortSetArgs>),
    /// Detach a port and delete its TAP device (or the veth pair the switch made for it).
    #[command(after_help = EXIT_STATUS)]
    Del {
        /// Port name.
        name: String,
        /// Succeed, doing nothing, when no port of that name is attached.
        #[arg(long)]
        if_exists: bool,
        #[command(flatten)]
        target: Target,
    },
    /// List ports with their VLAN, MTU, offloads, and whether the switch can hold their
    /// sender back (LOSSLESS: "no: kernel drops" for a TAP or veth, whose kernel side drops
    /// frames the switch does not read in time; see `sluice stats` for those drops).
    List {
        /// Print JSON (same schema as `sluice stats --json`).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Relay a TAP's frames over a unix socket that a stream port attaches to.
    ///
    /// Creates TAP `TAP` (in namespace --netns), listens on --listen (mode 0600), and once
    /// the switch connects (`sluice port add NAME --type stream --path PATH`, within 30 s)
    /// moves frames both ways until the switch lets go. The guest's frames then pass a
    /// program that can be stopped: `kill -STOP` makes a receiver that stops draining, which
    /// a lossless switch holds frames back for and its pause watchdog notices.
    ///
    /// Example:
    ///   sluice port relay r1 --netns blue --listen /run/sluice/r1.sock &
    ///   sluice port add r1 --type stream --path /run/sluice/r1.sock
    #[command(verbatim_doc_comment)]
    Relay {
        /// The TAP to create.
        tap: String,
        /// Create it in this network namespace (an `ip netns` name).
        #[arg(long, value_name = "NS")]
        netns: Option<String>,
        /// The unix socket to listen on (a socket an earlier relay left there is replaced;
        /// a live one, a link or any other file is refused).
        #[arg(long, value_name = "PATH")]
        listen: std::path::PathBuf,
        /// The TAP's MTU.
        #[arg(long, default_value_t = 1500, value_parser = sluice_api::config::mtu_arg)]
        mtu: u16,
    },
}

#[derive(Subcommand, Debug)]
enum EvpnCmd {
    /// Show the speaker (spawned or attached, its state), the BGP sessions, the routes
    /// announced (type 2: a local station; type 3: this host floods the VNI) and received
    /// (installed, lost to another route, or waiting for room), the stations declared
    /// duplicate, and the counters.
    Show {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Stations declared duplicate (they moved between hosts `dup_max_moves` times within
    /// `dup_window`) are decided afresh now, without waiting for `dup_hold`.
    ClearDuplicates {
        /// Only this VNI's.
        #[arg(long)]
        vni: Option<u32>,
        /// Only this station (aa:bb:cc:dd:ee:ff).
        #[arg(long)]
        mac: Option<String>,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Subcommand, Debug)]
enum MdbCmd {
    /// Show which ports joined which IP group (VLAN, group, member ports with the seconds
    /// left of each membership), the router ports and the querier.
    Show {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Subcommand, Debug)]
enum FibCmd {
    /// Show the MAC table: VLAN, MAC, port, static or age.
    Show {
        /// Only this VLAN.
        #[arg(long)]
        vlan: Option<u16>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Add a static entry (never ages, never moves).
    Add {
        /// Station MAC address, aa:bb:cc:dd:ee:ff.
        mac: String,
        /// Port the station is behind.
        port: String,
        /// VLAN of the entry.
        #[arg(long, default_value_t = 1)]
        vlan: u16,
        #[command(flatten)]
        target: Target,
    },
    /// Remove an entry.
    Del {
        /// Station MAC address.
        mac: String,
        /// VLAN of the entry.
        #[arg(long, default_value_t = 1)]
        vlan: u16,
        #[command(flatten)]
        target: Target,
    },
}

/// What `sluice` exits with, as its help says (scripts and runtimes branch on it).
const EXIT_STATUS: &str = "Exit status: 0 done; 1 refused or failed (the message says why); 2 usage \
(a wrong option or argument); 3 no switch answers on the control socket (none runs, or it is gone).";

/// The exit status of a failure: 3 when no switch answered, else 1.
fn failure_code(e: &anyhow::Error) -> ExitCode {
    let unreachable = e.chain().any(|c| {
        matches!(
            c.downcast_ref::<sluice_api::Error>(),
            Some(sluice_api::Error::Unreachable { .. } | sluice_api::Error::NoSwitch { .. })
        )
    });
    if unreachable { ExitCode::from(3) } else { ExitCode::FAILURE }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    cli::init_logs(&cli.log);
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sluice: {e:#}");
            failure_code(&e)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if matches!(
        cli.cmd,
        Cmd::Stats(_)
            | Cmd::Top(top::TopArgs { once: true, .. })
            | Cmd::Port(PortCmd::List { .. })
            | Cmd::Fib(FibCmd::Show { .. })
            | Cmd::Mdb(MdbCmd::Show { .. })
            | Cmd::Evpn(EvpnCmd::Show { .. })
            | Cmd::Switch(SwitchCmd::List { .. })
            | Cmd::Lab(lab::LabCmd::List { .. })
            | Cmd::Bench(bench::BenchCmd::Profiles { .. })
            | Cmd::Study(study::StudyCmd::List | study::StudyCmd::Show { .. })
    ) {
        sys::default_sigpipe();
    }
    match cli.cmd {
        Cmd::Switch(SwitchCmd::Run { config, poll, datapath, metrics, vhost_allow_user, vhost_allow_group }) => {
            let metrics =
                metrics.map(|m| config::parse_listen(&m).map_err(|e| anyhow::anyhow!("--metrics: {e}"))).transpose()?;
            let ids = |names: Option<Vec<String>>, flag: &str, resolve: fn(&str) -> Result<u32, String>| {
                names
                    .map(|n| n.iter().map(|n| resolve(n)).collect::<Result<Vec<_>, _>>())
                    .transpose()
                    .map_err(|e| anyhow::anyhow!("{flag}: {e}"))
            };
            let vhost_allow_users = ids(vhost_allow_user, "--vhost-allow-user", config::resolve_user)?;
            let vhost_allow_groups = ids(vhost_allow_group, "--vhost-allow-group", config::resolve_group)?;
            // (What a reload reads again, the command line's overrides with it.)
            let source = daemon::Source {
                file: config,
                poll,
                datapath: datapath.map(|d| d.kind()),
                metrics,
                vhost_allow_users,
                vhost_allow_groups,
            };
            let s = source.read().map_err(anyhow::Error::msg)?;
            daemon::run_from(s, Some(source))?;
        }
        Cmd::Switch(SwitchCmd::Check { file }) => cli::switch_check(&file)?,
        Cmd::Switch(SwitchCmd::Reload { target }) => cli::switch_reload(&target)?,
        Cmd::Switch(SwitchCmd::List { json }) => cli::switch_list(json)?,
        Cmd::Switch(SwitchCmd::Stop { target }) => cli::switch_stop(&target)?,
        Cmd::Switch(SwitchCmd::Restart { target }) => cli::switch_restart(&target)?,
        Cmd::Port(PortCmd::Add(a)) => cli::port_add(*a)?,
        Cmd::Port(PortCmd::Set(a)) => cli::port_set(*a)?,
        Cmd::Port(PortCmd::Del { name, if_exists, target }) => cli::port_del(&target, name, if_exists)?,
        Cmd::Port(PortCmd::List { json, target }) => cli::port_list(&target, json)?,
        Cmd::Port(PortCmd::Relay { tap, netns, listen, mtu }) => {
            port::relay::run(&tap, netns.as_deref(), &listen, mtu)?
        }
        Cmd::Fib(FibCmd::Show { vlan, json, target }) => cli::fib_show(&target, vlan, json)?,
        Cmd::Mdb(MdbCmd::Show { json, target }) => cli::mdb_show(&target, json)?,
        Cmd::Evpn(EvpnCmd::Show { json, target }) => cli::evpn_show(&target, json)?,
        Cmd::Evpn(EvpnCmd::ClearDuplicates { vni, mac, target }) => cli::evpn_clear_duplicates(&target, vni, mac)?,
        Cmd::Fib(FibCmd::Add { mac, port, vlan, target }) => cli::fib_add(&target, mac, port, vlan)?,
        Cmd::Fib(FibCmd::Del { mac, vlan, target }) => cli::fib_del(&target, mac, vlan)?,
        Cmd::Stats(a) => cli::stats(a)?,
        Cmd::Top(a) => top::run(a)?,
        Cmd::Capture(a) => capture::run(a)?,
        Cmd::Monitor(c) => report::monitor(c)?,
        Cmd::Report(a) => report::report(a)?,
        Cmd::Lab(c) => lab::run(c)?,
        Cmd::Demo(a) => demo::run(a)?,
        Cmd::Bench(c) => bench::run_cmd(c)?,
        Cmd::Study(c) => return Ok(study::run_cmd(c)?),
        Cmd::Smc(c) => smc::run_cmd(c)?,
        Cmd::Completion(a) => manpages::completion(<Cli as clap::CommandFactory>::command(), a.shell)?,
        Cmd::Man(a) => manpages::man(<Cli as clap::CommandFactory>::command(), &a)?,
        Cmd::Grant(GrantCmd::Add { port, vlans, promiscuous, target }) => {
            cli::grant(&target, Request::GrantAdd { port, vlans, promiscuous })?
        }
        Cmd::Grant(GrantCmd::Del { port, vlans, promiscuous, target }) => {
            cli::grant(&target, Request::GrantDel { port, vlans, promiscuous })?
        }
        Cmd::Grant(GrantCmd::List { json, target }) => cli::grant_list(&target, json)?,
        Cmd::Api(cli::ApiCmd::Schema) => cli::api_schema()?,
        Cmd::Events(a) => cli::events(a)?,
        Cmd::Status(a) => cli::status(&a)?,
        Cmd::Acl(c) => cli::acl(c)?,
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every command's options are distinct once the global ones reach it: clap checks that
    /// only in debug builds (and then panics at parse time), and the suite runs in release,
    /// so the walk is done here too.
    #[test]
    fn every_command_has_distinct_options() {
        fn walk(c: &clap::Command, path: &str, bad: &mut Vec<String>) {
            let mut ids = std::collections::HashSet::new();
            let mut longs = std::collections::HashSet::new();
            let mut shorts = std::collections::HashSet::new();
            for a in c.get_arguments() {
                if !ids.insert(a.get_id().as_str().to_string()) {
                    bad.push(format!("{path}: argument {:?} twice", a.get_id().as_str()));
                }
                if let Some(l) = a.get_long().filter(|l| !longs.insert(l.to_string())) {
                    bad.push(format!("{path}: --{l} twice"));
                }
                if let Some(s) = a.get_short().filter(|s| !shorts.insert(*s)) {
                    bad.push(format!("{path}: -{s} twice"));
                }
            }
            for s in c.get_subcommands() {
                walk(s, &format!("{path} {}", s.get_name()), bad);
            }
        }
        let mut c = super::Cli::command();
        c.build();
        let mut bad = Vec::new();
        walk(&c, "sluice", &mut bad);
        assert!(bad.is_empty(), "{bad:#?}");
        super::Cli::command().debug_assert();
    }
}
