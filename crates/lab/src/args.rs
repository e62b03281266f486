//! What `sluice lab up` asks for: its arguments, which the demo and the studies fill in
//! without a command line.

use std::path::PathBuf;

/// Arguments of `sluice lab up`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// Lab name: 1 to 10 lowercase letters, digits or '-'.
    #[arg(long, default_value = "lab")]
    pub name: String,
    /// Number of guests (1 to 99).
    #[arg(long, default_value_t = 2)]
    pub guests: u32,
    /// MTU of the switch and the guests' interfaces, 68 to 9000.
    #[arg(long, default_value_t = 1500, value_parser = sluice_api::config::mtu_arg)]
    pub mtu: u16,
    /// Use this running switch instead of one named after the lab.
    #[arg(long, value_name = "NAME")]
    pub switch: Option<String>,
    /// Start the switch in lossless mode.
    #[arg(long)]
    pub lossless: bool,
    /// Start the switch busy-polling.
    #[arg(long)]
    pub poll: bool,
    /// Turn offloads off on the guests' ports (software segmentation).
    #[arg(long)]
    pub no_offload: bool,
    /// Add a LAN: an external host `lan` (10.77.0.200, fd77::c8) in a namespace of its
    /// own, reached through the switch's uplink port (a veth end opened with AF_PACKET).
    #[arg(long)]
    pub lan: bool,
    /// With --lan: how many uplink interfaces lead to the LAN (1 to 3); the first is
    /// active, the others are backups that take over when it goes down.
    #[arg(long, default_value_t = 1, requires = "lan", value_parser = clap::value_parser!(u8).range(1..=3))]
    pub uplinks: u8,
    /// Transport mode of the switch the lab starts: l2 (ports known by MAC address) or l3
    /// (ports known by IP address: each guest's port owns its two addresses, the switch
    /// answers ARP and neighbour discovery, and on the LAN every guest sits behind the
    /// uplink's MAC). A running switch of the other mode is refused.
    #[arg(long, value_enum, default_value = "l2")]
    pub mode: ModeArg,
    /// Which datapath the switch the lab starts runs: kernel (guests on veth pairs, TC
    /// programs forward in the kernel, the core in user space decides) or user (guests on
    /// TAP ports, one user-space thread forwards). Default: kernel, unless the lab is
    /// lossless (the kernel datapath cannot hold a sender back), this sluice was built without
    /// it, or the kernel refuses it (then user, with a note); with --switch, the running
    /// switch's.
    #[arg(long, value_enum)]
    pub datapath: Option<sluice_api::config::DatapathArg>,
    /// How guests attach: tap (a port of their own each: a veth pair on the kernel datapath,
    /// a TAP on the user-space one) or stream (each guest's TAP is behind a
    /// `sluice port relay` process on a stream port: a program that can be stopped, so the
    /// switch can hold frames back for it and its pause watchdog can see it stop; user-space
    /// datapath).
    #[arg(long, value_enum, default_value = "tap")]
    pub attach: AttachArg,
    /// Hosts (1 to 4): with more than one, each host is a namespace of its own with its own
    /// sluice switch (on --datapath, as a lab of one host chooses it) and --guests guests
    /// `hKgJ`, the hosts joined by a veth underlay (192.168.77.K, fd78::K) and their switches
    /// by VXLAN tunnels (VNI 5000): one LAN, 10.77.0.0/24, across hosts. Lab names are then
    /// at most 8 characters.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub hosts: u32,
    /// With --hosts: the last host is plain Linux instead of sluice — a kernel `vxlan`
    /// device and a bridge, its guests on veth pairs (needs ethtool: its underlay fills
    /// checksums in software, as a NIC would).
    #[arg(long, requires = "hosts")]
    pub peer_kernel: bool,
    /// With --hosts: the hosts find each other's stations over BGP EVPN instead of
    /// flooding and learning. Each sluice host's switch runs a GoBGP speaker (`gobgpd`)
    /// peering with a route reflector, FRR's `bgpd` in namespace `sluice-LAB-rr`
    /// (192.168.77.254); the tunnels learn nothing from datagrams and list no remotes.
    /// Either datapath (`--datapath`; the kernel one by default). Needs Debian's gobgpd and frr.
    #[arg(long, requires = "hosts", conflicts_with = "peer_kernel")]
    pub evpn: bool,
    /// With --evpn: the last host is plain Linux with FRR — a kernel `vxlan` device and a
    /// bridge, zebra and bgpd with `advertise-all-vni` — interoperating with the sluice hosts
    /// over the route reflector.
    #[arg(long, requires = "evpn")]
    pub peer_frr: bool,
    /// Small QEMU VMs (0 to 8) next to the namespace guests, each attached by a vhost-user
    /// port: `vm1`… with the next addresses of the lab's table, Debian's kernel and an
    /// initramfs the lab builds (busybox, iperf3), under KVM where it works and TCG where
    /// not (--accel). `sluice lab exec vm1 -- CMD` runs CMD on the VM's serial console.
    /// Needs qemu-system-x86, linux-image-amd64 and busybox-static; picks the user-space
    /// datapath unless told otherwise.
    #[arg(long = "vm", value_name = "N", default_value_t = 0)]
    pub vms: u32,
    /// With --vm, how the VMs run: `auto` boots a small probe VM under KVM (when /dev/kvm
    /// opens; once, the verdict kept while labs with VMs are up) and uses KVM if it answers
    /// within 20 s, TCG (QEMU's emulator) if not — on some machines KVM guests hang at
    /// boot; `kvm` or `tcg` to choose.
    #[arg(long, value_enum, default_value = "auto")]
    pub accel: crate::vm::Accel,
    /// Which host of a multi-host lab this (sub-)lab is (0: a lab of one host).
    #[arg(skip)]
    pub host: u32,
    /// Print the guest table as JSON.
    #[arg(long)]
    pub json: bool,
    /// Give the lab's switch a gateway, as libvirt's default network: 10.77.0.254 on the
    /// host, dnsmasq handing out 10.77.0.100–199, the subnet masqueraded out of the host.
    /// The guests get their IPv4 addresses by DHCP (busybox udhcpc; needs dnsmasq-base and
    /// busybox) and reach beyond the host through it. Sets net.ipv4.ip_forward.
    #[arg(long)]
    pub gateway: bool,
    /// The sluice executable the lab starts its switch and relays with, when not this one
    /// (a study comparing two builds of sluice in one run).
    #[arg(skip)]
    pub exe: Option<PathBuf>,
}

/// `--attach` values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum AttachArg {
    /// A port per guest: a veth pair on the kernel datapath, a TAP on the user-space one.
    #[default]
    Tap,
    /// A stream port per guest, through a relay process.
    Stream,
}

/// `--mode` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    /// Layer 2: ports known by MAC address.
    L2,
    /// Layer 3: ports known by IP address.
    L3,
}

impl ModeArg {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ModeArg::L2 => "l2",
            ModeArg::L3 => "l3",
        }
    }
}

impl UpArgs {
    /// A lab of two guests with every other setting at its default (for the demo and
    /// the studies, which build labs without a command line).
    pub fn two_guests(name: &str, mtu: u16) -> UpArgs {
        UpArgs {
            name: name.into(),
            guests: 2,
            mtu,
            switch: None,
            lossless: false,
            poll: false,
            no_offload: false,
            lan: false,
            uplinks: 1,
            mode: ModeArg::L2,
            datapath: None,
            attach: AttachArg::Tap,
            hosts: 1,
            peer_kernel: false,
            evpn: false,
            peer_frr: false,
            vms: 0,
            accel: crate::vm::Accel::Auto,
            host: 0,
            json: false,
            exe: None,
            gateway: false,
        }
    }
}
