//! The core's connection tracker: which connections a security group's `allow-related`
//! rule let open, so that their return traffic passes (the user-space datapath's; the
//! kernel datapath uses the kernel's tracker with the same rules).
//!
//! Simplified on purpose, as the kernel datapath's must be (its frames never pass
//! netfilter's state machine): a connection is its 5-tuple (TCP, UDP; ICMP echo by its
//! identifier); a frame finds it in its original direction (`established`) or the reverse
//! (`reply`), else it is `new` (`invalid`: a TCP segment that is not a SYN). No window
//! tracking. Timeouts: TCP 120 s until a reply is seen, then 5 days, 10 s once a FIN or RST
//! passed; UDP 30 s, 120 s once replied; ICMP 30 s. Each frame of a connection refreshes
//! its timeout. The table is bounded: full, a new connection is refused (the caller drops
//! the frame as `ct_full`). The clock is the caller's (milliseconds), so tests inject it.

use std::collections::HashMap;
use std::net::IpAddr;

use crate::acl::CtState;

/// The table's size unless configured.
pub const DEFAULT_CT_MAX: usize = 65_536;

/// TCP until a reply is seen (ms).
pub const TCP_UNREPLIED_MS: u64 = 120_000;
/// TCP once replied (ms).
pub const TCP_ESTABLISHED_MS: u64 = 5 * 24 * 3600 * 1000;
/// TCP after a FIN or RST (ms).
pub const TCP_CLOSING_MS: u64 = 10_000;
/// UDP until a reply is seen (ms).
pub const UDP_UNREPLIED_MS: u64 = 30_000;
/// UDP once replied (ms).
pub const UDP_REPLIED_MS: u64 = 120_000;
/// ICMP echo (ms).
pub const ICMP_MS: u64 = 30_000;

const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;

/// A connection's identity in its direction: protocol, addresses, ports (ICMP echo: the
/// identifier as the request's source port, 0 as its destination port).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tuple {
    /// The IP protocol.
    pub proto: u8,
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
}

impl Tuple {
    /// The same connection seen from the other end.
    pub fn reversed(&self) -> Tuple {
        Tuple { proto: self.proto, src: self.dst, dst: self.src, sport: self.dport, dport: self.sport }
    }
}

/// What the tracker reads of an IP frame: its tuple (when trackable) and TCP flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow {
    /// The tuple; `None` for a frame no connection is made of.
    pub tuple: Option<Tuple>,
    /// TCP flags (0 otherwise).
    pub tcp_flags: u8,
}

/// One remembered connection.
#[derive(Clone, Copy, Debug)]
struct Entry {
    orig: Tuple,
    expires_ms: u64,
    seen_reply: bool,
    closing: bool,
}

impl Entry {
    fn timeout(&self) -> u64 {
        timeout_ms(self.orig.proto, self.seen_reply, self.closing)
    }
}

/// How long a connection of IP protocol `proto` lives without a frame (ms): until a reply
/// is seen, once one was, once a FIN or RST passed (TCP).
pub fn timeout_ms(proto: u8, replied: bool, closing: bool) -> u64 {
    match proto {
        6 if closing => TCP_CLOSING_MS,
        6 if replied => TCP_ESTABLISHED_MS,
        6 => TCP_UNREPLIED_MS,
        17 if replied => UDP_REPLIED_MS,
        17 => UDP_UNREPLIED_MS,
        _ => ICMP_MS,
    }
}

/// The timeouts of the connections a kernel tracks (TCP and UDP), for its executor, by
/// `(TCP ? 4 : 0) | (replied ? 2 : 0) | (closing ? 1 : 0)` (ms; UDP never closes).
pub fn kernel_timeouts_ms() -> [u32; 8] {
    std::array::from_fn(|i| {
        let proto = if i & 4 != 0 { 6 } else { 17 };
        timeout_ms(proto, i & 2 != 0, i & 1 != 0).min(u64::from(u32::MAX)) as u32
    })
}

/// Whether a kernel datapath tracks IP protocol `proto`'s connections itself (its
/// conntrack's lookups take TCP and UDP); others (ICMP echo) are the core's.
pub fn kernel_tracks(proto: u8) -> bool {
    matches!(proto, 6 | 17)
}

/// What a kernel's tracker found of a frame it handed up ([`kernel_tracks`] its protocol):
/// the core decides the frame in that state instead of looking it up itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// Not tracked (not read: a later fragment, cut short, or tracking off).
    Untracked,
    /// No connection: [`miss`] says whether the frame may open one.
    Miss,
    /// A connection, in the direction it was opened.
    Original,
    /// A connection's return traffic.
    Reply,
}

impl Found {
    /// The state a frame of flow `f` is decided in.
    pub fn state(self, f: &Flow) -> CtState {
        match (self, f.tuple) {
            (Found::Miss, Some(t)) => miss(&t, f.tcp_flags),
            (Found::Original, Some(_)) => CtState::Established,
            (Found::Reply, Some(_)) => CtState::Reply,
            _ => CtState::Untracked,
        }
    }
}

/// A kernel's connection tracker, for the frames of the protocols it tracks
/// ([`kernel_tracks`]) that reach the core without its answer (from a port in user space)
/// or that the core decides to remember.
pub trait KernelTracker: Send {
    /// Looks frame `frame` (untagged; its headers) up, as the kernel's datapath would (the
    /// connection refreshed).
    fn lookup(&mut self, frame: &[u8]) -> Found;
    /// Remembers `frame`'s connection; `Err` when the table is full.
    fn commit(&mut self, frame: &[u8]) -> Result<(), CtFull>;
}

/// The TCP flags that say whether a segment with no connection may open one.
pub const MISS_FLAGS: u8 = TCP_SYN | TCP_ACK | TCP_RST;

/// The state of a frame of tuple `t` with TCP flags `flags` that no connection holds: a
/// TCP segment other than a SYN is invalid, anything else new.
pub fn miss(t: &Tuple, flags: u8) -> CtState {
    if t.proto == 6 && flags & MISS_FLAGS != TCP_SYN { CtState::Invalid } else { CtState::New }
}

/// The table was full: the connection was not remembered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtFull;

/// The tracker: connections by their original tuple, and their reply tuples.
#[derive(Debug)]
pub struct Tracker {
    max: usize,
    by_orig: HashMap<Tuple, Entry>,
    /// Reply tuple → original tuple.
    by_reply: HashMap<Tuple, Tuple>,
    /// Connections refused for want of room, since the start.
    full: u64,
}

impl Tracker {
    /// A tracker of at most `max` connections (at least 1).
    pub fn new(max: usize) -> Self {
        Tracker { max: max.max(1), by_orig: HashMap::new(), by_reply: HashMap::new(), full: 0 }
    }

    /// Connections remembered now (some may have expired and not been swept yet).
    pub fn len(&self) -> usize {
        self.by_orig.len()
    }

    /// None remembered.
    pub fn is_empty(&self) -> bool {
        self.by_orig.is_empty()
    }

    /// The table's size.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Connections refused because the table was full.
    pub fn refused(&self) -> u64 {
        self.full
    }

    /// Changes the table's size; connections past a smaller size stay until they end.
    pub fn set_max(&mut self, max: usize) {
        self.max = max.max(1);
    }

    /// Looks frame `f` up at `now_ms`: its connection's state, the connection refreshed
    /// (a reply marks it replied; a FIN or RST shortens it).
    pub fn lookup(&mut self, f: &Flow, now_ms: u64) -> CtState {
        let Some(t) = f.tuple else { return CtState::Untracked };
        let (orig, reply) = if self.by_orig.contains_key(&t) {
            (t, false)
        } else if let Some(&o) = self.by_reply.get(&t) {
            (o, true)
        } else {
            return miss(&t, f.tcp_flags);
        };
        let e = self.by_orig.get_mut(&orig).expect("indexes agree");
        if e.expires_ms <= now_ms {
            self.forget(&orig);
            return miss(&t, f.tcp_flags);
        }
        if reply {
            e.seen_reply = true;
        }
        if t.proto == 6 && f.tcp_flags & (TCP_FIN | TCP_RST) != 0 {
            e.closing = true;
        }
        e.expires_ms = now_ms + e.timeout();
        if reply { CtState::Reply } else { CtState::Established }
    }

    /// Remembers frame `f`'s connection at `now_ms` (a new one its rules allowed); a
    /// full table first forgets what has expired.
    pub fn commit(&mut self, f: &Flow, now_ms: u64) -> Result<(), CtFull> {
        let Some(t) = f.tuple else { return Ok(()) };
        if self.by_orig.contains_key(&t) || self.by_reply.contains_key(&t) {
            return Ok(());
        }
        if self.by_orig.len() >= self.max {
            self.expire(now_ms);
            if self.by_orig.len() >= self.max {
                self.full += 1;
                return Err(CtFull);
            }
        }
        let mut e = Entry { orig: t, expires_ms: 0, seen_reply: false, closing: false };
        e.expires_ms = now_ms + e.timeout();
        self.by_orig.insert(t, e);
        self.by_reply.insert(t.reversed(), t);
        Ok(())
    }

    /// Forgets the connections that expired by `now_ms`.
    pub fn expire(&mut self, now_ms: u64) {
        let gone: Vec<Tuple> = self.by_orig.values().filter(|e| e.expires_ms <= now_ms).map(|e| e.orig).collect();
        for t in gone {
            self.forget(&t);
        }
    }

    /// Forgets every connection.
    pub fn clear(&mut self) {
        self.by_orig.clear();
        self.by_reply.clear();
    }

    fn forget(&mut self, orig: &Tuple) {
        if self.by_orig.remove(orig).is_some() {
            self.by_reply.remove(&orig.reversed());
        }
    }
}

/// Reads an untagged Ethernet frame's flow: TCP and UDP by their ports, ICMP echo by its
/// identifier; `None` for a frame that is not IPv4 or IPv6 or is cut short. Also returns
/// the protocol, destination port (TCP, UDP) and ICMP type, which the rules read.
pub fn read_flow(frame: &[u8]) -> Option<(Flow, u8, IpAddr, IpAddr, u16, u8)> {
    let ethertype = u16::from_be_bytes(frame.get(12..14)?.try_into().ok()?);
    let ip = frame.get(14..)?;
    let (proto, src, dst, l4, first): (u8, IpAddr, IpAddr, &[u8], bool) = match ethertype {
        0x0800 => {
            if ip.len() < 20 || ip[0] >> 4 != 4 {
                return None;
            }
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            let frag = u16::from_be_bytes([ip[6], ip[7]]);
            let src = IpAddr::from(<[u8; 4]>::try_from(&ip[12..16]).ok()?);
            let dst = IpAddr::from(<[u8; 4]>::try_from(&ip[16..20]).ok()?);
            (ip[9], src, dst, ip.get(ihl..).unwrap_or(&[]), frag & 0x1fff == 0)
        }
        0x86dd => {
            if ip.len() < 40 {
                return None;
            }
            let src = IpAddr::from(<[u8; 16]>::try_from(&ip[8..24]).ok()?);
            let dst = IpAddr::from(<[u8; 16]>::try_from(&ip[24..40]).ok()?);
            (ip[6], src, dst, &ip[40..], true)
        }
        _ => return None,
    };
    let mut flow = Flow { tuple: None, tcp_flags: 0 };
    let (mut dport, mut icmp_type) = (0, 0);
    // (A fragment past the first has no ports: untracked, and in no port class but 0's.)
    if first {
        match proto {
            6 | 17 if l4.len() >= 4 => {
                let sport = u16::from_be_bytes([l4[0], l4[1]]);
                dport = u16::from_be_bytes([l4[2], l4[3]]);
                if proto == 6 {
                    flow.tcp_flags = l4.get(13).copied().unwrap_or(0);
                }
                if proto == 17 || l4.len() >= 14 {
                    flow.tuple = Some(Tuple { proto, src, dst, sport, dport });
                }
            }
            1 | 58 if !l4.is_empty() => {
                icmp_type = l4[0];
                let id = l4.get(4..6).map(|b| u16::from_be_bytes([b[0], b[1]]));
                let (request, reply) = if proto == 1 { (8, 0) } else { (128, 129) };
                flow.tuple = match id {
                    Some(id) if icmp_type == request => Some(Tuple { proto, src, dst, sport: id, dport: 0 }),
                    Some(id) if icmp_type == reply => Some(Tuple { proto, src, dst, sport: 0, dport: id }),
                    _ => None,
                };
            }
            _ => {}
        }
    }
    Some((flow, proto, src, dst, dport, icmp_type))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(flags: u8) -> Flow {
        let t = Tuple {
            proto: 6,
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            sport: 40000,
            dport: 80,
        };
        Flow { tuple: Some(t), tcp_flags: flags }
    }

    fn reply(f: Flow, flags: u8) -> Flow {
        Flow { tuple: f.tuple.map(|t| t.reversed()), tcp_flags: flags }
    }

    #[test]
    fn states_and_timeouts_with_a_fake_clock() {
        let mut ct = Tracker::new(8);
        let syn = tcp(TCP_SYN);
        // (step, frame, time, commit after it?, expected state)
        let rows: &[(&str, Flow, u64, bool, CtState)] = &[
            ("a SYN, nothing remembered", syn, 0, true, CtState::New),
            ("the SYN again", syn, 1, false, CtState::Established),
            ("the SYN-ACK", reply(syn, TCP_SYN | TCP_ACK), 2, false, CtState::Reply),
            ("data", tcp(TCP_ACK), TCP_ESTABLISHED_MS, false, CtState::Established),
            ("a FIN", tcp(TCP_ACK | TCP_FIN), TCP_ESTABLISHED_MS + 1, false, CtState::Established),
            ("the reply, within 10 s", reply(syn, TCP_ACK), TCP_ESTABLISHED_MS + 9_000, false, CtState::Reply),
            ("after 10 s more: gone", tcp(TCP_ACK), TCP_ESTABLISHED_MS + 19_001, false, CtState::Invalid),
            ("a SYN opens it again", syn, TCP_ESTABLISHED_MS + 20_000, false, CtState::New),
        ];
        for &(what, f, now, commit, want) in rows {
            assert_eq!(ct.lookup(&f, now), want, "{what}");
            if commit {
                ct.commit(&f, now).unwrap();
            }
        }
        // Unreplied: 120 s.
        let mut ct = Tracker::new(8);
        ct.commit(&syn, 0).unwrap();
        assert_eq!(ct.lookup(&syn, TCP_UNREPLIED_MS - 1), CtState::Established);
        assert_eq!(ct.lookup(&reply(syn, TCP_ACK), 2 * TCP_UNREPLIED_MS), CtState::Invalid);
    }

    #[test]
    fn a_full_table_refuses_and_counts_until_something_expires() {
        let mut ct = Tracker::new(2);
        let udp = |sport| Flow {
            tuple: Some(Tuple {
                proto: 17,
                src: "10.0.0.1".parse().unwrap(),
                dst: "10.0.0.2".parse().unwrap(),
                sport,
                dport: 53,
            }),
            tcp_flags: 0,
        };
        ct.commit(&udp(1), 0).unwrap();
        ct.commit(&udp(2), 10).unwrap();
        assert_eq!(ct.commit(&udp(3), 20), Err(CtFull));
        assert_eq!(ct.refused(), 1);
        ct.commit(&udp(1), 30).unwrap();
        assert_eq!(ct.commit(&udp(3), UDP_UNREPLIED_MS + 1), Ok(()), "the first expired");
        assert_eq!(ct.len(), 2);
    }

    #[test]
    fn frames_are_read() {
        let mut f = vec![0u8; 14 + 20 + 8];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[14 + 9] = 1;
        f[14 + 12..14 + 16].copy_from_slice(&[10, 0, 0, 1]);
        f[14 + 16..14 + 20].copy_from_slice(&[10, 0, 0, 2]);
        f[34] = 8;
        f[38..40].copy_from_slice(&[0x12, 0x34]);
        let (flow, proto, ..) = read_flow(&f).unwrap();
        assert_eq!(proto, 1);
        let t = flow.tuple.unwrap();
        assert_eq!((t.sport, t.dport), (0x1234, 0));
        f[34] = 0;
        let (back, ..) = read_flow(&f).unwrap();
        let b = back.tuple.unwrap();
        assert_eq!((b.sport, b.dport), (0, 0x1234), "a reply: the identifier as its destination port");
        assert_eq!(read_flow(&f[..20]), None);
    }
}
