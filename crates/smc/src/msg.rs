//! The side-door handshake, modelled on SMC's CLC: PROPOSAL (client), ACCEPT (server),
//! CONFIRM (client), or DECLINE with a reason from either side (docs/architecture.md,
//! "Capability: never a byte to a peer that is not sluice").
//!
//! Each message is one `SOCK_SEQPACKET` datagram with a fixed layout, little-endian:
//! `"SLCL"`, version, kind, two reserved bytes, the 16-byte connection token, then the
//! kind's fields. Descriptors travel beside it as `SCM_RIGHTS`: with a PROPOSAL the
//! client's ring memfd, its doorbell end and its TCP socket (the proof that the proposer
//! holds the connection); with an ACCEPT the server's ring memfd and doorbell end.
//! Version 2 added the TCP socket (docs/architecture.md, "The fast path's trust boundary").

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Protocol version spoken here.
pub const VERSION: u8 = 2;
const MAGIC: &[u8; 4] = b"SLCL";
const HDR: usize = 24;
const ADDR: usize = 19;

/// Why a connection stayed on TCP (or a handshake failed), as counted in the stats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Reason {
    /// No sluice listener is registered for the destination: the peer is not sluice.
    NoListener = 1,
    /// The listener's side door did not take the connection.
    DoorUnreachable = 2,
    /// No answer within the handshake's time limit.
    Timeout = 3,
    /// The peer speaks another protocol version.
    Version = 4,
    /// The listener found no TCP connection with the proposal's addresses in its namespace.
    NotOurConnection = 5,
    /// Two proposals named the same connection.
    Ambiguous = 6,
    /// Shared memory or a descriptor could not be had.
    NoMemory = 7,
    /// The peer declined (its reason is counted on its side).
    PeerDeclined = 8,
    /// A malformed or unexpected message.
    Protocol = 9,
    /// A sluice listener accepted a connection no proposal announced: the client is not
    /// sluice.
    NoProposal = 10,
    /// The peer's user may not use the fast path with this one (not root, not the same
    /// user, not in the fast path's group; across namespaces, root or the same user only).
    NotAllowed = 11,
    /// The proposal did not prove that the proposer holds the connection's client socket.
    Unproven = 12,
    /// The registered listener is not the one the connection reached (its process does not
    /// hold the listening socket, or another user owns it).
    WrongListener = 13,
    /// A shared segment without its seals, or smaller than the ring it should hold.
    BadSegment = 14,
    /// Not waited for: the client's user announced an earlier connection to this server
    /// and never proposed it, so its announcements are not believed for a while.
    Penalized = 15,
    /// Nothing in the listening program (nor in the processes it forked) accepted within
    /// half a second of the proposal.
    NotAccepting = 16,
    /// The socket asked for `MSG_ZEROCOPY` (`SO_ZEROCOPY`) before it connected or listened:
    /// its completions come with `POLLERR`, which a shared-memory socket cannot raise.
    ZeroCopy = 17,
}

impl Reason {
    /// Every reason, in display order.
    pub const ALL: [Reason; 17] = [
        Reason::NoListener,
        Reason::NoProposal,
        Reason::DoorUnreachable,
        Reason::Timeout,
        Reason::Version,
        Reason::NotOurConnection,
        Reason::Ambiguous,
        Reason::NoMemory,
        Reason::PeerDeclined,
        Reason::Protocol,
        Reason::NotAllowed,
        Reason::Unproven,
        Reason::WrongListener,
        Reason::BadSegment,
        Reason::Penalized,
        Reason::NotAccepting,
        Reason::ZeroCopy,
    ];

    /// The reason's name in stats and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Reason::NoListener => "no_listener",
            Reason::DoorUnreachable => "door_unreachable",
            Reason::Timeout => "timeout",
            Reason::Version => "version",
            Reason::NotOurConnection => "not_our_connection",
            Reason::Ambiguous => "ambiguous",
            Reason::NoMemory => "no_memory",
            Reason::PeerDeclined => "peer_declined",
            Reason::Protocol => "protocol",
            Reason::NoProposal => "no_proposal",
            Reason::NotAllowed => "not_allowed",
            Reason::Unproven => "unproven",
            Reason::WrongListener => "wrong_listener",
            Reason::BadSegment => "bad_segment",
            Reason::Penalized => "penalized",
            Reason::NotAccepting => "not_accepting",
            Reason::ZeroCopy => "zerocopy",
        }
    }

    /// True for a failure, false when the connection stayed on TCP because the peer is not
    /// sluice, is not the listener meant, or may not use the fast path with us.
    pub fn is_error(self) -> bool {
        !matches!(
            self,
            Reason::NoListener
                | Reason::NoProposal
                | Reason::NotOurConnection
                | Reason::PeerDeclined
                | Reason::NotAllowed
                | Reason::Penalized
                | Reason::NotAccepting
                | Reason::ZeroCopy
        )
    }

    fn from_u8(b: u8) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| *r as u8 == b)
    }
}

/// A connection's addresses as the client sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tuple {
    /// The client's address and port.
    pub client: SocketAddr,
    /// The server's address and port.
    pub server: SocketAddr,
}

/// One handshake message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Msg {
    /// The client offers shared memory for a connection (its receive ring and its end of
    /// the doorbell travel beside it).
    Proposal {
        /// Random token naming this connection's handshake.
        token: [u8; 16],
        /// The connection.
        tuple: Tuple,
        /// Inode of the client's network namespace.
        netns: u64,
        /// The client's process id (for `sluice smc info`).
        pid: u32,
        /// Size of the client's receive ring.
        rmem: u32,
        /// The send buffer the client wants (the server's receive ring is at least this).
        tmem: u32,
    },
    /// The server agrees (its receive ring and doorbell end travel beside it).
    Accept {
        /// The proposal's token.
        token: [u8; 16],
        /// Size of the server's receive ring.
        rmem: u32,
        /// The server's process id.
        pid: u32,
    },
    /// The client has mapped the server's ring: the connection is on shared memory.
    Confirm {
        /// The proposal's token.
        token: [u8; 16],
    },
    /// Either side refuses: the connection stays on TCP.
    Decline {
        /// The proposal's token.
        token: [u8; 16],
        /// Why.
        reason: Reason,
    },
    /// A forked child that accepted a connection on its parent's listener asks the parent
    /// for the connection its door prepared (over the parent's claim channel, with the
    /// answer's socket and the accepted TCP socket attached).
    Claim {
        /// The claim's own token (the answer carries it back).
        token: [u8; 16],
    },
    /// The parent's answer to a claim: the two rings' memfds (receive ring first), the
    /// peer's doorbell end and the application's end attached.
    Handover {
        /// The claim's token.
        token: [u8; 16],
        /// The receive ring's size.
        rmem: u32,
        /// The peer's receive ring's size.
        tmem: u32,
    },
}

/// A message that cannot be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Too short, wrong magic, unknown kind or reason, or bad addresses.
    Malformed,
    /// Another protocol version.
    Version(u8),
}

fn put_addr(out: &mut Vec<u8>, a: SocketAddr) {
    let (fam, ip) = match a.ip() {
        IpAddr::V4(v) => (4u8, v.to_ipv6_mapped().octets()),
        IpAddr::V6(v) => (6u8, v.octets()),
    };
    out.push(fam);
    out.extend_from_slice(&a.port().to_le_bytes());
    out.extend_from_slice(&ip);
}

fn get_addr(b: &[u8]) -> Option<SocketAddr> {
    let port = u16::from_le_bytes([b[1], b[2]]);
    let ip: [u8; 16] = b[3..19].try_into().ok()?;
    let v6 = Ipv6Addr::from(ip);
    let ip = match b[0] {
        4 => IpAddr::V4(v6.to_ipv4_mapped()?),
        6 => IpAddr::V6(v6),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl Msg {
    /// The message as one datagram.
    pub fn encode(&self) -> Vec<u8> {
        let (kind, token) = match self {
            Msg::Proposal { token, .. } => (1u8, token),
            Msg::Accept { token, .. } => (2, token),
            Msg::Confirm { token } => (3, token),
            Msg::Decline { token, .. } => (4, token),
            Msg::Claim { token } => (5, token),
            Msg::Handover { token, .. } => (6, token),
        };
        let mut out = Vec::with_capacity(HDR + 2 * ADDR + 20);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&[VERSION, kind, 0, 0]);
        out.extend_from_slice(token);
        match *self {
            Msg::Proposal { tuple, netns, pid, rmem, tmem, .. } => {
                put_addr(&mut out, tuple.client);
                put_addr(&mut out, tuple.server);
                out.extend_from_slice(&netns.to_le_bytes());
                out.extend_from_slice(&pid.to_le_bytes());
                out.extend_from_slice(&rmem.to_le_bytes());
                out.extend_from_slice(&tmem.to_le_bytes());
            }
            Msg::Accept { rmem, pid, .. } => {
                out.extend_from_slice(&rmem.to_le_bytes());
                out.extend_from_slice(&pid.to_le_bytes());
            }
            Msg::Confirm { .. } | Msg::Claim { .. } => {}
            Msg::Decline { reason, .. } => out.push(reason as u8),
            Msg::Handover { rmem, tmem, .. } => {
                out.extend_from_slice(&rmem.to_le_bytes());
                out.extend_from_slice(&tmem.to_le_bytes());
            }
        }
        out
    }

    /// Reads one datagram.
    pub fn decode(b: &[u8]) -> Result<Msg, DecodeError> {
        if b.len() < HDR || &b[..4] != MAGIC {
            return Err(DecodeError::Malformed);
        }
        if b[4] != VERSION {
            return Err(DecodeError::Version(b[4]));
        }
        let token: [u8; 16] = b[8..24].try_into().map_err(|_| DecodeError::Malformed)?;
        let body = &b[HDR..];
        let need = |n: usize| if body.len() == n { Ok(()) } else { Err(DecodeError::Malformed) };
        match b[5] {
            1 => {
                need(2 * ADDR + 20)?;
                let client = get_addr(&body[..ADDR]).ok_or(DecodeError::Malformed)?;
                let server = get_addr(&body[ADDR..2 * ADDR]).ok_or(DecodeError::Malformed)?;
                let r = &body[2 * ADDR..];
                let netns = u64::from_le_bytes(r[..8].try_into().map_err(|_| DecodeError::Malformed)?);
                Ok(Msg::Proposal {
                    token,
                    tuple: Tuple { client, server },
                    netns,
                    pid: u32_at(r, 8),
                    rmem: u32_at(r, 12),
                    tmem: u32_at(r, 16),
                })
            }
            2 => {
                need(8)?;
                Ok(Msg::Accept { token, rmem: u32_at(body, 0), pid: u32_at(body, 4) })
            }
            3 => {
                need(0)?;
                Ok(Msg::Confirm { token })
            }
            4 => {
                need(1)?;
                Ok(Msg::Decline { token, reason: Reason::from_u8(body[0]).ok_or(DecodeError::Malformed)? })
            }
            5 => {
                need(0)?;
                Ok(Msg::Claim { token })
            }
            6 => {
                need(8)?;
                Ok(Msg::Handover { token, rmem: u32_at(body, 0), tmem: u32_at(body, 4) })
            }
            _ => Err(DecodeError::Malformed),
        }
    }
}

/// The unspecified address of `a`'s family (for wildcard listeners).
pub fn unspecified_like(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips() {
        let tuple = Tuple { client: "10.77.0.1:40000".parse().unwrap(), server: "[fd77::2]:5201".parse().unwrap() };
        let msgs = [
            Msg::Proposal { token: [7; 16], tuple, netns: 4026531992, pid: 42, rmem: 65536, tmem: 16384 },
            Msg::Accept { token: [7; 16], rmem: 131072, pid: 43 },
            Msg::Confirm { token: [7; 16] },
            Msg::Decline { token: [7; 16], reason: Reason::NotOurConnection },
            Msg::Claim { token: [7; 16] },
            Msg::Handover { token: [7; 16], rmem: 65536, tmem: 262144 },
        ];
        for m in msgs {
            assert_eq!(Msg::decode(&m.encode()), Ok(m));
        }
    }

    #[test]
    fn bad_datagrams_are_refused() {
        let m = Msg::Confirm { token: [1; 16] }.encode();
        assert_eq!(Msg::decode(&m[..10]), Err(DecodeError::Malformed));
        let mut v = m.clone();
        v[4] = 9;
        assert_eq!(Msg::decode(&v), Err(DecodeError::Version(9)));
        let mut k = m.clone();
        k[5] = 77;
        assert_eq!(Msg::decode(&k), Err(DecodeError::Malformed));
        let mut long = m;
        long.push(0);
        assert_eq!(Msg::decode(&long), Err(DecodeError::Malformed));
        let mut d = Msg::Decline { token: [1; 16], reason: Reason::Timeout }.encode();
        *d.last_mut().unwrap() = 200;
        assert_eq!(Msg::decode(&d), Err(DecodeError::Malformed));
        for r in Reason::ALL {
            assert_eq!(Reason::from_u8(r as u8), Some(r));
        }
    }
}
