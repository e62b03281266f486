//! IGMP/MLD snooping with real receivers: guests in namespaces join groups with the
//! kernel's own membership (its IGMP/MLD reports, its answers to the switch's queries); a
//! sender sends datagrams to the group; a packet socket on each guest's interface counts
//! what the switch delivered there (member or not). On both datapaths.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command};

use common::*;
use serde_json::Value;

/// The switch's snooping timers, short so that aging shows within a test: queries every
/// 2 s (1 s to answer), memberships forgotten after 5 s without a report.
const TIMERS: &str = "mcast_query_interval = 2\nmcast_query_response_interval = 1\nmcast_membership_interval = 5\n";

fn helper() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcast.py"))
}

/// A switch of the test's own with `n` guests `SWITCHtI` (TAPs, or veths on the kernel
/// datapath), IPv4 10.78.0.I/24, IPv6 on (no duplicate address detection).
struct Switch(FileSwitch);

impl std::ops::Deref for Switch {
    type Target = FileSwitch;
    fn deref(&self) -> &FileSwitch {
        &self.0
    }
}

impl Switch {
    fn new(tag: &str, n: usize, dp: Dp) -> Switch {
        Switch::with(tag, n, dp, TIMERS)
    }

    /// The same with switch settings `extra`.
    fn with(tag: &str, n: usize, dp: Dp, extra: &str) -> Switch {
        let name = unique(&match dp {
            Dp::User => tag.to_string(),
            Dp::Kernel => format!("{}k", &tag[..tag.len().min(4)]),
        });
        let sw = Switch(FileSwitch::start(name, dp, extra, &vec![""; n], ""));
        for i in 1..=n {
            let t = sw.iface(i);
            ns_ok(
                &sw.namespaces[i - 1],
                &format!(
                    "sysctl -qw net.ipv6.conf.{t}.accept_dad=0 && ip link set {t} up && ip addr add 10.78.0.{i}/24 dev {t}"
                ),
            );
        }
        sw
    }

    fn mdb(&self) -> Value {
        serde_json::from_str(&sluice_ok(&["mdb", "show", "--json", "--switch", &self.name])).unwrap()
    }

    /// The ports that are members of `group` now.
    fn members(&self, group: &str) -> Vec<String> {
        let m = self.mdb();
        let mut v: Vec<String> = m["groups"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| g["group"] == group)
            .flat_map(|g| g["ports"].as_array().unwrap().iter().map(|p| p["port"].as_str().unwrap().to_string()))
            .collect();
        v.sort();
        v
    }

    /// Starts a listener on guest `i` (joined to `join` = (group, UDP port) if given).
    fn listen(&self, i: usize, join: Option<(&str, u16)>) -> Child {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.namespaces[i - 1], "python3"]).arg(helper()).arg("listen").arg(self.iface(i));
        if let Some((g, p)) = join {
            c.args([g, &p.to_string()]);
        }
        spawn_ready(&mut c, &format!("the listener on guest {i}"))
    }

    /// Guest `i` sends `n` datagrams to `group`:`port`.
    fn send(&self, i: usize, group: &str, port: u16, n: u32) {
        ns_ok(
            &self.namespaces[i - 1],
            &format!("python3 {} send {} {group} {port} {n}", helper().display(), self.iface(i)),
        );
    }

    /// Guest `i` joins `group` (the kernel's membership) and reads nothing; [`counted`]
    /// ends it.
    fn joined(&self, i: usize, group: &str, port: u16) -> Child {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.namespaces[i - 1], "python3"]).arg(helper());
        c.args(["join", &self.iface(i), group, &port.to_string()]);
        spawn_ready(&mut c, &format!("guest {i}'s join"))
    }

    /// Guest `i`'s received frames and bytes so far (its interface's counters).
    fn rx(&self, i: usize) -> (u64, u64) {
        let t = self.iface(i);
        let out = ns_ok(
            &self.namespaces[i - 1],
            &format!("cat /sys/class/net/{t}/statistics/rx_packets /sys/class/net/{t}/statistics/rx_bytes"),
        );
        let v: Vec<u64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
        (v[0], v[1])
    }

    /// Snooping prunes from the start: no window of flooding after the switch starts.
    fn assert_pruning(&self) {
        let m = self.mdb();
        assert_eq!(m["pruning"], true, "snooping prunes from the start: {m}");
    }
}

/// Ends a listener (closing its socket: the kernel's leave) and returns what it counted,
/// by group.
fn counted(mut c: Child) -> HashMap<String, u64> {
    drop(c.stdin.take());
    let out = c.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("listener output {text:?}: {e}"))
}

fn n(c: &HashMap<String, u64>, g: &str) -> u64 {
    c.get(g).copied().unwrap_or(0)
}

/// Waits for the frames in flight to arrive.
fn settle() {
    std::thread::sleep(std::time::Duration::from_millis(500));
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, veths with BPF programs for the kernel datapath) and python3; scripts/test.sh runs it"]
    fn igmp_a_group_reaches_its_members_only_and_a_leave_stops_it(dp: Dp) {
        if !root() {
            return;
        }
        let sw = Switch::new("igmp", 3, dp);
        sw.assert_pruning();
        let member = sw.listen(2, Some(("239.1.2.3", 5000)));
        let other = sw.listen(3, None);
        assert!(
            wait_for(5, || sw.members("239.1.2.3") == [sw.iface(2)]),
            "the kernel's report made guest 2 a member: {}",
            sw.mdb()
        );
        sw.send(1, "239.1.2.3", 5000, 20);
        sw.send(1, "239.9.9.9", 5001, 20);
        sw.send(1, "224.0.0.251", 5353, 20);
        settle();
        let (m, o) = (counted(member), counted(other));
        assert_eq!(n(&m, "239.1.2.3"), 20, "the member gets the group: {m:?}");
        assert_eq!(n(&o, "239.1.2.3"), 0, "a non-member sees none of it: {o:?}");
        assert_eq!((n(&m, "239.9.9.9"), n(&o, "239.9.9.9")), (0, 0), "an unregistered group goes to router ports only");
        assert_eq!((n(&m, "224.0.0.251"), n(&o, "224.0.0.251")), (20, 20), "a link-local group reaches everyone");
        // The member's socket closed: the kernel's leave removes it at once (a guest port
        // leaves fast), and the group is unregistered again.
        assert!(wait_for(3, || sw.members("239.1.2.3").is_empty()), "the leave: {}", sw.mdb());
        let after = sw.listen(2, None);
        sw.send(1, "239.1.2.3", 5000, 20);
        settle();
        assert_eq!(n(&counted(after), "239.1.2.3"), 0, "nothing after the leave");
        let m = sw.mdb();
        let c = m["counters"].as_array().unwrap().iter().find(|c| c["port"] == sw.iface(2)).unwrap().clone();
        assert!(c["reports"].as_u64().unwrap() >= 1 && c["leaves"].as_u64().unwrap() >= 1, "{m}");
        assert_eq!(m["querier_v4"]["who"], "switch", "no other querier: the switch queries: {m}");
        let text = sluice_ok(&["mdb", "show", "--switch", &sw.name]);
        assert!(text.contains("querier: IGMP this switch"), "{text}");
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, veths with BPF programs for the kernel datapath) and python3; scripts/test.sh runs it"]
    fn igmp_a_membership_nobody_refreshes_ages_and_a_refreshed_one_stays(dp: Dp) {
        if !root() {
            return;
        }
        let sw = Switch::new("igage", 3, dp);
        sw.assert_pruning();
        // Guest 2 joins for real (it answers the switch's queries); guest 3 only sends a
        // report, with no membership behind it.
        let member = sw.listen(2, Some(("239.4.4.4", 5004)));
        ns_ok(&sw.namespaces[2], &format!("python3 {} report {} 239.7.7.7", helper().display(), sw.iface(3)));
        assert!(wait_for(5, || sw.members("239.7.7.7") == [sw.iface(3)]), "the forged report: {}", sw.mdb());
        let listing = sluice_ok(&["mdb", "show", "--switch", &sw.name]);
        assert!(listing.contains("239.7.7.7") && listing.contains(&sw.iface(3)), "{listing}");
        // The membership interval is 5 s; three queries pass meanwhile.
        assert!(wait_for(12, || sw.members("239.7.7.7").is_empty()), "the forged membership aged: {}", sw.mdb());
        assert_eq!(sw.members("239.4.4.4"), [sw.iface(2)], "the real one is refreshed by the queries");
        counted(member);
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, veths with BPF programs for the kernel datapath) and python3; scripts/test.sh runs it"]
    fn mld_a_group_reaches_its_members_only(dp: Dp) {
        if !root() {
            return;
        }
        let sw = Switch::new("mld", 3, dp);
        sw.assert_pruning();
        let member = sw.listen(2, Some(("ff0e::1:3", 5000)));
        let other = sw.listen(3, None);
        assert!(wait_for(6, || sw.members("ff0e::1:3") == [sw.iface(2)]), "the kernel's MLD report: {}", sw.mdb());
        sw.send(1, "ff0e::1:3", 5000, 20);
        sw.send(1, "ff05::9:9", 5001, 20);
        sw.send(1, "ff02::fb", 5353, 20);
        settle();
        let (m, o) = (counted(member), counted(other));
        assert_eq!((n(&m, "ff0e::1:3"), n(&o, "ff0e::1:3")), (20, 0), "member {m:?}, non-member {o:?}");
        assert_eq!((n(&m, "ff05::9:9"), n(&o, "ff05::9:9")), (0, 0), "unregistered");
        assert_eq!((n(&m, "ff02::fb"), n(&o, "ff02::fb")), (20, 20), "link-local scope floods");
        assert!(wait_for(3, || sw.members("ff0e::1:3").is_empty()), "the MLD done: {}", sw.mdb());
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, veths with BPF programs for the kernel datapath) and python3; scripts/test.sh runs it"]
    fn a_group_stream_with_one_of_five_joined_costs_the_others_nothing(dp: Dp) {
        if !root() {
            return;
        }
        let sw = Switch::new("five", 6, dp);
        sw.assert_pruning();
        let member = sw.listen(2, Some(("239.5.5.5", 5005)));
        let others: Vec<Child> = (3..=6).map(|i| sw.listen(i, None)).collect();
        assert!(wait_for(5, || sw.members("239.5.5.5") == [sw.iface(2)]), "{}", sw.mdb());
        sw.send(1, "239.5.5.5", 5005, 500);
        settle();
        assert_eq!(n(&counted(member), "239.5.5.5"), 500);
        for (i, c) in (3..=6).zip(others) {
            assert_eq!(n(&counted(c), "239.5.5.5"), 0, "guest {i} got none of the stream");
        }
    }
}

/// What one guest received over an interval: UDP datagrams to the stream's group, IGMP
/// and ICMPv6 frames (the switch's general queries), any other frame, and all frames
/// (its interface's counter).
#[derive(Debug)]
struct Seen {
    group: u64,
    control: u64,
    other: u64,
    rx: u64,
}

impl Seen {
    fn of(c: &HashMap<String, u64>, group: &str) -> Seen {
        Seen { group: n(c, group), control: n(c, "_control"), other: n(c, "_other"), rx: n(c, "_rx") }
    }
}

/// The host's CPU time stolen by the hypervisor, and all of it (ticks; /proc/stat).
fn cpu_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let v: Vec<u64> =
        stat.lines().next().unwrap().split_whitespace().skip(1).take(8).map(|x| x.parse().unwrap()).collect();
    (v[7], v.iter().sum())
}

/// The multicast figure on one switch: guest 1 streams to a group guest 2 joined; guests
/// 3–6 are the non-members.
#[derive(Debug)]
struct Figure {
    /// Datagrams sent, and in how long (ms).
    sent: u64,
    ms: u64,
    /// The member's received frames and bytes over the stream.
    member: (u64, u64),
    /// Each non-member over a quiet interval, then over the stream.
    quiet: Vec<Seen>,
    stream: Vec<Seen>,
    /// Host CPU steal over the stream (%).
    steal: f64,
}

const STREAM_GROUP: &str = "239.6.6.6";

impl Switch {
    /// Measures the figure: a quiet interval of `seconds`, then a 100 Mbit/s stream of
    /// `seconds`; with `snooping`, once guest 2's membership is registered. The guests'
    /// IPv6 is off, so that nothing but the switch's queries and the stream reaches them.
    fn figure(&self, snooping: bool, seconds: u32) -> Figure {
        for i in 1..=6 {
            ns_ok(&self.namespaces[i - 1], &format!("sysctl -qw net.ipv6.conf.{}.disable_ipv6=1", self.iface(i)));
        }
        let member = self.joined(2, STREAM_GROUP, 5006);
        if snooping {
            assert!(wait_for(5, || self.members(STREAM_GROUP) == [self.iface(2)]), "guest 2 joined: {}", self.mdb());
        }
        let span = std::time::Duration::from_millis(u64::from(seconds) * 1000 + 500);
        let listeners: Vec<Child> = (3..=6).map(|i| self.listen(i, None)).collect();
        std::thread::sleep(span);
        let quiet = listeners.into_iter().map(|c| Seen::of(&counted(c), STREAM_GROUP)).collect();
        let listeners: Vec<Child> = (3..=6).map(|i| self.listen(i, None)).collect();
        let (m0, c0) = (self.rx(2), cpu_ticks());
        let out = ns_ok(
            &self.namespaces[0],
            &format!("python3 {} stream {} {STREAM_GROUP} 5006 100 {seconds}", helper().display(), self.iface(1)),
        );
        settle();
        let (m1, c1) = (self.rx(2), cpu_ticks());
        let stream = listeners.into_iter().map(|c| Seen::of(&counted(c), STREAM_GROUP)).collect();
        counted(member);
        let sent: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("the sender said {out:?}: {e}"));
        let f = Figure {
            sent: sent["sent"].as_u64().unwrap(),
            ms: sent["ms"].as_u64().unwrap(),
            member: (m1.0 - m0.0, m1.1 - m0.1),
            quiet,
            stream,
            steal: 100.0 * (c1.0 - c0.0) as f64 / (c1.1 - c0.1).max(1) as f64,
        };
        println!(
            "multicast figure ({}, snooping {}): sent {} datagrams in {} ms ({:.1} Mbit/s of payload); member: {} frames, {:.1} Mbit/s; steal {:.1} %",
            self.name,
            if snooping { "on" } else { "off" },
            f.sent,
            f.ms,
            f.sent as f64 * 1400.0 * 8.0 / (f.ms.max(1) as f64 * 1000.0),
            f.member.0,
            f.member.1 as f64 * 8.0 / (f.ms.max(1) as f64 * 1000.0),
            f.steal
        );
        for (i, (q, s)) in (3..).zip(f.quiet.iter().zip(&f.stream)) {
            println!("  guest {i}: quiet {q:?}; stream {s:?}");
        }
        f
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, veths with BPF programs for the kernel datapath) and python3; scripts/test.sh runs it"]
    fn a_100_mbit_group_stream_to_one_of_five_guests_costs_the_other_four_nothing(dp: Dp) {
        if !root() {
            return;
        }
        let sw = Switch::new("mfig", 6, dp);
        sw.assert_pruning();
        let f = sw.figure(true, 5);
        assert!(f.member.0 >= f.sent / 2, "the member receives the stream: {f:?}");
        for (i, s) in (3..).zip(&f.stream) {
            assert_eq!((s.group, s.other), (0, 0), "guest {i} received none of the stream: {f:?}");
            assert_eq!(s.rx, s.control, "guest {i} received nothing but the switch's queries during the stream: {f:?}");
        }
    }
}

both_datapaths! {
    #[ignore = "system tier: needs root (network namespaces, TAP devices, veths with BPF programs for the kernel datapath) and python3; scripts/test.sh runs it"]
    fn with_snooping_off_a_group_stream_reaches_every_guest(dp: Dp) {
        if !root() {
            return;
        }
        let sw = Switch::with("moff", 6, dp, "mcast_snooping = false\n");
        assert_eq!(sw.mdb()["pruning"], false);
        let f = sw.figure(false, 5);
        for (i, (q, s)) in (3..).zip(f.quiet.iter().zip(&f.stream)) {
            assert!(s.rx >= q.rx + f.sent / 2, "guest {i} received the stream: {f:?}");
        }
    }
}
