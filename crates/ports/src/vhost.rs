//! vhost-user ports as the event loop attaches them: the backend itself is
//! `sluice_vhost`; here its two descriptors are handed over (frames to read, and the
//! doorbell the guest rings when it gives room to send). Who may be the peer comes from
//! the switch's settings (`vhost_allow_users`, `vhost_allow_groups`).

use sluice_api::config::{PortSpec, VhostAllow};
use sluice_sys::error::Context;

use crate::{Attachment, Kind, Result};

/// Opens the vhost-user socket of port `spec`: listening for the VM's front end, or
/// connecting to it when the spec says `client`; peers are let in as `allow` says.
pub fn attach(spec: &PortSpec, allow: &VhostAllow) -> Result<Attachment> {
    let path = spec.socket.clone().unwrap_or_default();
    let role = if spec.client { sluice_vhost::Role::Client } else { sluice_vhost::Role::Server };
    let p = sluice_vhost::open_allowing(&spec.name, &path, role, spec.offload, &allowed(allow))
        .with_context(|| format!("opening vhost-user port {:?}", spec.name))?;
    let (fd, room_fd) = (p.frames_fd(), p.room_fd());
    Ok(Attachment { port: Box::new(p), fd, kind: Kind::Vhost { room_fd } })
}

/// The switch's settings as the port checks them, with the socket file's group.
fn allowed(a: &VhostAllow) -> sluice_vhost::Allow {
    sluice_vhost::Allow { users: a.users.clone(), groups: a.groups.clone(), socket_group: a.socket_group() }
}
