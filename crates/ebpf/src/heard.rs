//! Stations the executor heard behind tunnels, handed to the core, which decides whether
//! to learn each (docs/architecture.md, "One brain", *As built: stations heard behind
//! tunnels*). The executor reads them off its ring buffer `sluice_heard`
//! ([`Executor::take_heard`], each a [`Heard`](crate::exec::Heard)).
//!
//! The program writes no forwarding state: a frame from a tunnel whose source the station
//! table has on the tunnel, from a sender the remote table does not have it behind, is
//! reported (a full ring is counted, `C_HEARD_LOST`, and the station's next frame reports
//! it again). [`hand_to_core`] gives each report to [`Switch::tunnel_heard`] and writes
//! what the core learns into the kernel's remote table, after which the program finds it
//! there and reports it no more.

use sluice_switch::{PortId, Switch};

use crate::exec::Executor;

/// Gives the core every station the executor reported since the last call, at most
/// `limit` (the rest waits in the ring for the next call): `port_of` says which of the
/// core's ports an input slot is. The core decides on each as for a frame
/// ([`Switch::tunnel_heard`]: the tunnel's stage 1 must give that origin that VLAN, and
/// the station must be the tunnel's); each it learns is written into the kernel's remote
/// table, so that frames to it leave for its endpoint from the kernel. Returns how many
/// reports were read and how many learned.
pub fn hand_to_core(
    ex: &mut Executor,
    sw: &mut Switch,
    port_of: impl Fn(u32) -> Option<PortId>,
    limit: usize,
) -> (usize, usize) {
    let reports = ex.take_heard(limit);
    let mut learned = 0;
    for h in &reports {
        let Some(id) = port_of(h.slot) else { continue };
        if sw.tunnel_heard(id, h.vni, h.vlan, h.mac, h.sender)
            && ex.set_remote(h.ifindex, h.vni, h.mac, h.sender).is_ok()
        {
            learned += 1;
        }
    }
    (reports.len(), learned)
}
