//! The sluice forwarding core.
//!
//! This crate decides what happens to every frame and owns nothing that touches the
//! operating system: no sockets, no file descriptors, no clock. A driver (the daemon's event
//! loop, or a test) owns the [`Switch`], tells it which port is readable or writable and
//! what time it is, and applies the read/write interest the switch asks for. Ports are the
//! [`Port`] trait; [`mem::MemPort`] is an in-memory port for tests and benchmarks.
//!
//! The pipeline for each received frame is: validate (virtio header, Ethernet header) →
//! read its [`Key`] → learn the source → [`decide`] it once (VLAN admission, anti-spoofing,
//! the destination or the flood, each output's tag and MTU, mirrors, Layer 3 routing) →
//! execute the [`Verdict`]: enqueue into the outputs' bounded queues → transmit in
//! batches. Each stage is a file of `src/switch/`. Frames live in a preallocated
//! [`pool::FramePool`]; nothing is allocated per frame once the switch is warm.
//!
//! Invariant kept by every path: each received frame is counted exactly once by its fate
//! (forwarded, or dropped with a cause), and each copy offered to an output is counted
//! exactly once as transmitted, dropped with a cause, or still queued. See
//! [`counters::PortCounters`].

pub mod acl;
pub mod capture;
pub mod class;
mod config;
pub mod conntrack;
pub mod counters;
pub mod decide;
pub mod events;
pub mod evpn;
pub mod fastpath;
pub mod fib;
pub mod hold;
mod ids;
pub mod l3;
pub mod mdb;
pub mod mem;
pub mod meter;
pub mod pool;
pub mod port;
pub mod queue;
pub mod snoop;
mod switch;
pub mod tunnel;
pub mod vlan;

pub use class::{ClassConfig, ClassError, ClassMatch};
pub use config::{
    DEFAULT_HOLD_LEN, DEFAULT_ROUTER_MAC, DEFAULT_WATCHDOG_MS, PortConfig, PortPolicy, SwitchConfig, SwitchError,
};
pub use config::{LINK_LOCAL_NEVER, RateLimit, StormControl};
pub use counters::{ClassCounters, DropCause, PortCounters};
pub use decide::Storm;
pub use decide::{Action, Dest, Extras, Key, L3Extras, NdFacts, NextHop, Output, Station, Tunneled, Upcall, Verdict};
pub use events::{StationChange, StationEvent};
pub use fastpath::{FastChange, FastMac, FastPort};
pub use fib::{Fib, FibEntry};
pub use ids::PortId;
pub use l3::Mode;
pub use mdb::{GroupClass, McastRouter, MdbEntry, SnoopConfig, SnoopCounters};
pub use port::{OutFrame, Port, PortCaps, PortError, TxOutcome};
pub use switch::ingress::Handed;
pub use switch::ingress::{MAX_GSO_SEGMENTS, MIN_GSO_SIZE};
pub use switch::ports::{ClassInfo, PortInfo};
pub use switch::snooping::{MdbView, RouterPort};
pub use switch::transmit::FLOOD_DATAGRAMS_PER_FRAME;
pub use switch::{Interest, Switch, WatchdogEvent};
pub use vlan::VlanMode;

/// The MTUs a switch or port may have.
pub fn switch_mtu_range() -> std::ops::RangeInclusive<u16> {
    config::MTU_RANGE
}
