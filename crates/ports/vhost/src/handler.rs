//! The vhost-user protocol, as the device (backend) answers QEMU: features, the guest's
//! memory table, the vrings — on the `vhost` crate's request handler, one connection at a
//! time, on the port's serving thread.
//!
//! Why not `vhost-user-backend`'s daemon: QEMU (7.2) disables the rings with
//! SET_VRING_ENABLE before it sends SET_FEATURES, and that daemon refuses the message as an
//! inactive feature and ends the connection; without vhost-user's protocol features QEMU
//! does not start a vhost-user network device at all. This handler accepts the early
//! SET_VRING_ENABLE. It also puts each ring's kick eventfd straight into one of the port's
//! two wait sets (transmit rings: frames to read; receive rings: room to write), so a kick
//! wakes the datapath thread itself — no worker thread in between.
//!
//! Everything the frontend sends is checked: queue indexes and sizes, ring addresses
//! (translated from QEMU's addresses through the memory table, refused when outside it),
//! memory regions (one regular file each, as long as announced, a memfd sealed against
//! shrinking, mapped shared under the SIGBUS guard: [`crate::memory`]), and the rings'
//! kick, call and error descriptors (eventfds only: [`crate::eventfd`]). A message that
//! fails a check ends the connection; why is kept for `sluice port list`.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use vhost::VhostUserMemoryRegionBase;
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags, VhostUserInflight, VhostUserLog,
    VhostUserMemoryRegion, VhostUserProtocolFeatures, VhostUserShMemConfig, VhostUserSharedMsg,
    VhostUserSingleMemoryRegion, VhostUserVirtioFeatures, VhostUserVringAddrFlags, VhostUserVringState,
};
use vhost::vhost_user::{Error as VuError, GpuBackend, Result as VuResult, VhostUserBackendReqHandlerMut};
use vhost_user_backend::{VringRwLock, VringT};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use vm_memory::{GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap, GuestRegionMmap};

use crate::backend::{MAX_QUEUE_SIZE, NUM_QUEUES, OFFERED_FEATURES};
use crate::port::Shared;

/// One connection's device state.
pub(crate) struct NetHandler {
    shared: Arc<Shared>,
    vrings: Vec<VringRwLock>,
    mem: GuestMemoryAtomic<GuestMemoryMmap>,
    /// QEMU's address of each region, its size, its guest-physical base.
    mappings: Vec<(u64, u64, u64)>,
    acked: u64,
    protocol: u64,
    /// Set (by the SIGBUS guard) when a page of this connection's guest memory went away
    /// under the switch.
    faulted: Arc<AtomicBool>,
}

fn bad<T>(why: &'static str) -> VuResult<T> {
    Err(VuError::InvalidOperation(why))
}

/// The peer sent something the switch refuses: `why`, a sentence for the log and `sluice
/// port list`.
fn refuse<T>(shared: &Shared, why: String) -> VuResult<T> {
    shared.rejected.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    shared.end_with(why.clone());
    Err(VuError::ReqHandlerError(std::io::Error::new(std::io::ErrorKind::InvalidInput, why)))
}

/// Refuses descriptor `fd` for ring `index`'s `what` unless it is an eventfd.
fn eventfd_only(shared: &Shared, what: &str, index: u8, fd: Option<&File>) -> VuResult<()> {
    match fd {
        Some(f) if !crate::eventfd::is_eventfd(f.as_raw_fd()) => {
            let is =
                crate::peer::fd_target(f.as_raw_fd()).map_or_else(|_| "unknown".into(), |t| t.display().to_string());
            refuse(
                shared,
                format!(
                    "the {what} descriptor of ring {index} is not an eventfd ({is}); QEMU sends eventfds, so the peer is not QEMU or not a supported version"
                ),
            )
        }
        _ => Ok(()),
    }
}

impl NetHandler {
    /// A device with no memory and `NUM_QUEUES` vrings, its kicks going to `shared`'s wait
    /// sets.
    pub(crate) fn new(shared: Arc<Shared>) -> std::io::Result<NetHandler> {
        let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let vrings = (0..NUM_QUEUES)
            .map(|_| VringRwLock::new(mem.clone(), MAX_QUEUE_SIZE as u16))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| std::io::Error::other(format!("making the vrings: {e:?}")))?;
        let faulted = Arc::new(AtomicBool::new(false));
        Ok(NetHandler { shared, vrings, mem, mappings: Vec::new(), acked: 0, protocol: 0, faulted })
    }

    /// The vrings and memory the port uses (the same objects this handler changes).
    pub(crate) fn link(&self) -> crate::port::Link {
        crate::port::Link { vrings: self.vrings.clone(), mem: self.mem.clone(), faulted: self.faulted.clone() }
    }

    /// Whether a page of this connection's guest memory went away under the switch.
    pub(crate) fn faulted(&self) -> &Arc<AtomicBool> {
        &self.faulted
    }

    fn vring(&self, index: u32) -> VuResult<&VringRwLock> {
        self.vrings.get(index as usize).ok_or(VuError::InvalidParam)
    }

    fn va_to_gpa(&self, va: u64) -> VuResult<GuestAddress> {
        self.mappings
            .iter()
            .find(|&&(vmm, size, _)| va >= vmm && va - vmm < size)
            .map(|&(vmm, _, gpa)| GuestAddress(va - vmm + gpa))
            .ok_or(VuError::InvalidParam)
    }

    /// Stops watching ring `index`'s kick.
    fn forget_kick(&self, index: usize) {
        if let Some(k) = self.vrings[index].get_ref().get_kick() {
            self.shared.unwatch_kick(index, k.as_raw_fd());
        }
    }

    /// Stops every ring (a reset, or the connection's end).
    pub(crate) fn stop_all(&mut self) {
        for i in 0..self.vrings.len() {
            self.forget_kick(i);
            let v = &self.vrings[i];
            v.set_queue_ready(false);
            v.set_enabled(false);
            v.set_kick(None);
            v.set_call(None);
            self.shared.ring_set_up(i);
        }
        self.shared.nudge();
    }
}

impl VhostUserBackendReqHandlerMut for NetHandler {
    fn set_owner(&mut self) -> VuResult<()> {
        Ok(())
    }

    fn reset_owner(&mut self) -> VuResult<()> {
        self.acked = 0;
        self.protocol = 0;
        self.shared.set_acked(0);
        Ok(())
    }

    fn reset_device(&mut self) -> VuResult<()> {
        self.stop_all();
        self.acked = 0;
        self.shared.set_acked(0);
        Ok(())
    }

    fn get_features(&mut self) -> VuResult<u64> {
        Ok(OFFERED_FEATURES)
    }

    fn set_features(&mut self, features: u64) -> VuResult<()> {
        if features & !OFFERED_FEATURES != 0 {
            return Err(VuError::InvalidParam);
        }
        self.acked = features;
        // Without vhost-user's protocol features a ring is enabled from the start.
        let protocol = features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0;
        let event_idx = features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;
        for v in &self.vrings {
            if !protocol {
                v.set_enabled(true);
            }
            v.set_queue_event_idx(event_idx);
        }
        self.shared.set_acked(features);
        self.shared.nudge();
        Ok(())
    }

    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        postcopy: Option<bool>,
    ) -> VuResult<Option<Vec<VhostUserMemoryRegionBase>>> {
        if postcopy.is_some() {
            return bad("postcopy migration is not supported");
        }
        if ctx.len() != files.len() {
            return Err(VuError::InvalidParam);
        }
        let mut regions = Vec::new();
        let mut mappings = Vec::new();
        for (i, (r, f)) in ctx.iter().zip(files).enumerate() {
            let page = match crate::memory::check(i, r, &f) {
                Ok(p) => p,
                Err(e) => return refuse(&self.shared, e.to_string()),
            };
            let region = GuestRegionMmap::new(r.mmap_region(f)?, GuestAddress(r.guest_phys_addr))
                .ok_or(VuError::InvalidParam)?;
            mappings.push((r.user_addr, r.memory_size, r.guest_phys_addr));
            regions.push((r.guest_phys_addr, region, page));
        }
        // The table keeps its regions sorted by guest address: the page sizes follow them.
        regions.sort_by_key(|&(gpa, _, _)| gpa);
        let (regions, pages): (Vec<_>, Vec<_>) = regions.into_iter().map(|(_, r, p)| (r, p)).unzip();
        let mem = GuestMemoryMmap::from_regions(regions).map_err(|_| VuError::InvalidParam)?;
        let guarded = match crate::memory::guard(&mem, &pages, &self.faulted) {
            Ok(g) => g,
            Err(e) => return refuse(&self.shared, e.to_string()),
        };
        // The vrings and the port see the new table at their next `memory()`; the old one is
        // unmapped once nothing holds it.
        self.mem.lock().map_err(|_| VuError::BackendInternalError)?.replace(mem);
        crate::memory::adopt(self.mem.memory().into_inner(), guarded);
        self.mappings = mappings;
        Ok(None)
    }

    fn set_vring_num(&mut self, index: u32, num: u32) -> VuResult<()> {
        if num == 0 || num as usize > MAX_QUEUE_SIZE || !num.is_power_of_two() {
            return Err(VuError::InvalidParam);
        }
        self.vring(index)?.set_queue_size(num as u16);
        self.shared.ring_set_up(index as usize);
        Ok(())
    }

    fn set_vring_addr(
        &mut self,
        index: u32,
        _flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        _log: u64,
    ) -> VuResult<()> {
        let (d, a, u) = (self.va_to_gpa(descriptor)?, self.va_to_gpa(available)?, self.va_to_gpa(used)?);
        let v = self.vring(index)?;
        v.set_queue_info(d.0, a.0, u.0).map_err(|_| VuError::InvalidParam)?;
        // After a guest reboot the used index starts where the guest's ring says.
        if let Ok(idx) = v.queue_used_idx() {
            v.set_queue_next_used(idx);
        }
        self.shared.ring_set_up(index as usize);
        Ok(())
    }

    fn set_vring_base(&mut self, index: u32, base: u32) -> VuResult<()> {
        let v = self.vring(index)?;
        v.set_queue_next_avail(base as u16);
        v.set_queue_next_used(base as u16);
        self.shared.ring_set_up(index as usize);
        Ok(())
    }

    fn get_vring_base(&mut self, index: u32) -> VuResult<VhostUserVringState> {
        let v = self.vring(index)?.clone();
        // The ring stops here (the frontend stops the device).
        v.set_queue_ready(false);
        self.forget_kick(index as usize);
        v.set_kick(None);
        v.set_call(None);
        self.shared.ring_set_up(index as usize);
        self.shared.nudge();
        Ok(VhostUserVringState::new(index, u32::from(v.queue_next_avail())))
    }

    fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        let i = usize::from(index);
        let v = self.vring(u32::from(index))?.clone();
        eventfd_only(&self.shared, "kick", index, fd.as_ref())?;
        self.forget_kick(i);
        if let Some(f) = &fd {
            crate::peer::set_nonblocking(f.as_raw_fd()).map_err(VuError::ReqHandlerError)?;
        }
        v.set_kick(fd);
        if let Some(k) = v.get_ref().get_kick() {
            self.shared.watch_kick(i, k.as_raw_fd()).map_err(VuError::ReqHandlerError)?;
        }
        // The ring starts on its kick (a fresh set-up for the port: counted before the ring
        // is ready); without protocol features it is enabled already.
        self.shared.ring_set_up(i);
        v.set_queue_ready(true);
        if self.acked & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() == 0 {
            v.set_enabled(true);
        }
        self.shared.nudge();
        Ok(())
    }

    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        let v = self.vring(u32::from(index))?;
        eventfd_only(&self.shared, "call", index, fd.as_ref())?;
        if let Some(f) = &fd {
            crate::peer::set_nonblocking(f.as_raw_fd()).map_err(VuError::ReqHandlerError)?;
        }
        v.set_call(fd);
        Ok(())
    }

    fn set_vring_err(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        let v = self.vring(u32::from(index))?;
        eventfd_only(&self.shared, "error", index, fd.as_ref())?;
        v.set_err(fd);
        Ok(())
    }

    fn get_protocol_features(&mut self) -> VuResult<VhostUserProtocolFeatures> {
        Ok(VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::REPLY_ACK)
    }

    fn set_protocol_features(&mut self, features: u64) -> VuResult<()> {
        self.protocol = features;
        Ok(())
    }

    fn get_queue_num(&mut self) -> VuResult<u64> {
        Ok(NUM_QUEUES as u64)
    }

    fn set_vring_enable(&mut self, index: u32, enable: bool) -> VuResult<()> {
        // Accepted before SET_FEATURES too: QEMU sends it then.
        self.vring(index)?.set_enabled(enable);
        self.shared.nudge();
        Ok(())
    }

    fn get_config(&mut self, _: u32, _: u32, _: VhostUserConfigFlags) -> VuResult<Vec<u8>> {
        bad("the device has no config space of its own")
    }

    fn set_config(&mut self, _: u32, _: &[u8], _: VhostUserConfigFlags) -> VuResult<()> {
        bad("the device has no config space of its own")
    }

    fn set_gpu_socket(&mut self, _: GpuBackend) -> VuResult<()> {
        bad("not a GPU")
    }

    fn get_shared_object(&mut self, _: VhostUserSharedMsg) -> VuResult<File> {
        bad("no shared objects")
    }

    fn get_inflight_fd(&mut self, _: &VhostUserInflight) -> VuResult<(VhostUserInflight, File)> {
        bad("inflight descriptors are not tracked")
    }

    fn set_inflight_fd(&mut self, _: &VhostUserInflight, _: File) -> VuResult<()> {
        bad("inflight descriptors are not tracked")
    }

    fn get_max_mem_slots(&mut self) -> VuResult<u64> {
        bad("memory slots are not supported")
    }

    fn add_mem_region(
        &mut self,
        _: &VhostUserSingleMemoryRegion,
        _: File,
        _: Option<bool>,
    ) -> VuResult<Option<VhostUserMemoryRegionBase>> {
        bad("memory slots are not supported")
    }

    fn remove_mem_region(&mut self, _: &VhostUserSingleMemoryRegion) -> VuResult<()> {
        bad("memory slots are not supported")
    }

    fn set_device_state_fd(
        &mut self,
        _: VhostTransferStateDirection,
        _: VhostTransferStatePhase,
        _: File,
    ) -> VuResult<Option<File>> {
        bad("migration is not supported")
    }

    fn check_device_state(&mut self) -> VuResult<()> {
        bad("migration is not supported")
    }

    fn get_shmem_config(&mut self) -> VuResult<VhostUserShMemConfig> {
        bad("no shared memory regions")
    }

    fn set_log_base(&mut self, _: &VhostUserLog, _: File) -> VuResult<()> {
        bad("dirty-page logging (migration) is not supported")
    }
}
