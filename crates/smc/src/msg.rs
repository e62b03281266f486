//! The side-door messages, modelled on SMC's CLC handshake but without its round trips
//! (docs/architecture.md, "Connections at TCP's cost"): the client's ANNOUNCE before its
//! SYN and PROOF after it; the server decides in `accept` and answers through the slot's
//! control word (crate::slot), not with a message. CLAIM, HANDOVER and DECLINE pass a
//! proposal from a pre-forking parent to the child that accepted its connection.
//!
//! Each message is one `SOCK_SEQPACKET` datagram with a fixed layout, little-endian:
//! `"SLCL"`, version, kind, two reserved bytes, a 16-byte token (claims; zero otherwise),
//! then the kind's fields. Descriptors travel beside it as `SCM_RIGHTS`: with ANNOUNCE the
//! arena's memfd and the server's end of the connection's socket pair; with PROOF the
//! client's TCP socket (the proof that the proposer holds the connection). Version 2 added
//! the TCP socket; version 3 is this shape.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::slot::{GEOMETRY_LEN, Geometry};

/// Protocol version spoken here.
pub const VERSION: u8 = 3;
const MAGIC: &[u8; 4] = b"SLCL";
const HDR: usize = 24;

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
    /// The server accepted the connection where the library could not take it (its end
    /// stayed plain TCP: an `accept` the library does not see, or another program): the
    /// client saw TCP bytes or an end before any decision, and stays on TCP too.
    TakenAsTcp = 18,
    /// The program uses io_uring, whose calls the library cannot see: its connections stay
    /// on TCP.
    IoUring = 19,
    /// The client closed the connection before its server decided, with nothing written:
    /// there was nothing to move.
    ClosedEarly = 20,
    /// A rule of the operator's (`sluice smc run --tcp`) keeps the connection, or the
    /// program, on TCP.
    Rule = 21,
    /// The automatic rule: this process's recent connections to the destination were too
    /// short to repay the handshake (sluice_smc::auto).
    Short = 22,
}

impl Reason {
    /// Every reason, in display order.
    pub const ALL: [Reason; 22] = [
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
        Reason::TakenAsTcp,
        Reason::IoUring,
        Reason::ClosedEarly,
        Reason::Rule,
        Reason::Short,
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
            Reason::TakenAsTcp => "taken_as_tcp",
            Reason::IoUring => "io_uring",
            Reason::ClosedEarly => "closed_early",
            Reason::Rule => "rule",
            Reason::Short => "short",
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
                | Reason::TakenAsTcp
                | Reason::IoUring
                | Reason::ClosedEarly
                | Reason::Rule
                | Reason::Short
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

/// One side-door message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Msg {
    /// The client is about to connect, and offers shared memory for the connection: sent
    /// before its SYN, with the arena's memfd and the server's end of the connection's
    /// socket pair attached.
    Announce {
        /// The cookie of the client's TCP socket (what PROOF and the server's `sock_diag`
        /// lookup match it by).
        cookie: u64,
        /// The slot of the arena this connection uses.
        slot: u32,
        /// The slot's generation for this connection (its control word says it).
        generation: u32,
        /// The client's process id (for `sluice smc info`).
        pid: u32,
        /// [`PROOF_FOLLOWS`]: the client is in another namespace than the listener, and its
        /// TCP socket follows its SYN (PROOF).
        flags: u64,
        /// The arena's shape.
        geometry: Geometry,
    },
    /// The client's proof that it holds the connection: its TCP socket, attached, sent
    /// once the SYN is out (a socket that has sent its SYN cannot be connected elsewhere).
    Proof {
        /// The cookie the announcement named.
        cookie: u64,
    },
    /// A claim's negative answer.
    Decline {
        /// The claim's token.
        token: [u8; 16],
        /// Why.
        reason: Reason,
    },
    /// A forked child that accepted a connection on its parent's listener asks the parent
    /// for the connection's proposal (over the parent's claim channel, with the answer's
    /// socket and the accepted TCP socket attached).
    Claim {
        /// The claim's own token (the answer carries it back).
        token: [u8; 16],
    },
    /// The parent's answer to a claim: the proposal, with the arena's memfd and the
    /// server's end of the socket pair attached. The child commits it itself.
    Handover {
        /// The claim's token.
        token: [u8; 16],
        /// The slot.
        slot: u32,
        /// Its generation.
        generation: u32,
        /// The client's process id.
        pid: u32,
        /// The arena's shape.
        geometry: Geometry,
    },
}

/// ANNOUNCE flag: a PROOF follows the SYN.
pub const PROOF_FOLLOWS: u64 = 1;

/// A message that cannot be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Too short, wrong magic, unknown kind or reason, or bad addresses.
    Malformed,
    /// Another protocol version.
    Version(u8),
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from(u32_at(b, at)) | u64::from(u32_at(b, at + 4)) << 32
}

impl Msg {
    /// The message as one datagram.
    pub fn encode(&self) -> Vec<u8> {
        let zero = [0u8; 16];
        let (kind, token) = match self {
            Msg::Announce { .. } => (1u8, &zero),
            Msg::Proof { .. } => (2, &zero),
            Msg::Decline { token, .. } => (4, token),
            Msg::Claim { token } => (5, token),
            Msg::Handover { token, .. } => (6, token),
        };
        let mut out = Vec::with_capacity(HDR + 64);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&[VERSION, kind, 0, 0]);
        out.extend_from_slice(token);
        match *self {
            Msg::Announce { cookie, slot, generation, pid, flags, geometry } => {
                out.extend_from_slice(&cookie.to_le_bytes());
                out.extend_from_slice(&slot.to_le_bytes());
                out.extend_from_slice(&generation.to_le_bytes());
                out.extend_from_slice(&pid.to_le_bytes());
                out.extend_from_slice(&flags.to_le_bytes());
                geometry.encode(&mut out);
            }
            Msg::Proof { cookie } => out.extend_from_slice(&cookie.to_le_bytes()),
            Msg::Claim { .. } => {}
            Msg::Decline { reason, .. } => out.push(reason as u8),
            Msg::Handover { slot, generation, pid, geometry, .. } => {
                out.extend_from_slice(&slot.to_le_bytes());
                out.extend_from_slice(&generation.to_le_bytes());
                out.extend_from_slice(&pid.to_le_bytes());
                geometry.encode(&mut out);
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
        let geometry = |at: usize| Geometry::decode(&body[at..]).ok_or(DecodeError::Malformed);
        match b[5] {
            1 => {
                need(28 + GEOMETRY_LEN)?;
                Ok(Msg::Announce {
                    cookie: u64_at(body, 0),
                    slot: u32_at(body, 8),
                    generation: u32_at(body, 12),
                    pid: u32_at(body, 16),
                    flags: u64_at(body, 20),
                    geometry: geometry(28)?,
                })
            }
            2 => {
                need(8)?;
                Ok(Msg::Proof { cookie: u64_at(body, 0) })
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
                need(12 + GEOMETRY_LEN)?;
                Ok(Msg::Handover {
                    token,
                    slot: u32_at(body, 0),
                    generation: u32_at(body, 4),
                    pid: u32_at(body, 8),
                    geometry: geometry(12)?,
                })
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
        let geometry = Geometry { slots: 64, cs_area: 1 << 25, sc_area: 1 << 25, cs_window: 65536, sc_window: 65536 };
        let msgs = [
            Msg::Announce { cookie: 0x1234_5678_9abc, slot: 3, generation: 9, pid: 42, flags: PROOF_FOLLOWS, geometry },
            Msg::Proof { cookie: 77 },
            Msg::Decline { token: [7; 16], reason: Reason::NotOurConnection },
            Msg::Claim { token: [7; 16] },
            Msg::Handover { token: [7; 16], slot: 1, generation: 2, pid: 3, geometry },
        ];
        for m in msgs {
            assert_eq!(Msg::decode(&m.encode()), Ok(m));
        }
    }

    #[test]
    fn bad_datagrams_are_refused() {
        let m = Msg::Claim { token: [1; 16] }.encode();
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
