//! The backend driven by rust-vmm's own vhost-user frontend over a temporary socket, as
//! QEMU would drive it — no VM needed: features negotiated, guest memory (a memfd) and
//! vrings handed over, and a kick on the transmit queue rings the port's doorbell.

use std::fs::File;
use std::os::fd::FromRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_vhost::{NetBackend, OFFERED_FEATURES, RX_QUEUE, TX_QUEUE};
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::{Frontend, Listener, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryAtomic, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

const MEM_BASE: u64 = 0x10_0000;
const MEM_SIZE: usize = 0x40_0000;

/// Guest memory in a memfd, as QEMU's `memory-backend-memfd,share=on` gives it.
fn guest_memory() -> GuestMemoryMmap {
    // SAFETY: a NUL-terminated name and no flags; the descriptor is owned by the File.
    let fd = unsafe { libc::memfd_create(c"sluice-test-guest".as_ptr(), 0) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` was just created and is owned by nothing else.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(MEM_SIZE as u64).unwrap();
    GuestMemoryMmap::from_ranges_with_files(&[(GuestAddress(MEM_BASE), MEM_SIZE, Some(FileOffset::new(file, 0)))])
        .unwrap()
}

/// Waits (at most 5 s) for `fd` to be readable.
fn readable(fd: &EventFd) -> bool {
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        if fd.read().is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

#[test]
fn a_frontend_negotiates_hands_over_memory_and_vrings_and_a_kick_rings_the_doorbell() {
    let path = std::env::temp_dir().join(format!("sluice-vhost-{}.sock", std::process::id()));
    let (backend, doorbell) = NetBackend::new().unwrap();
    let backend = Arc::new(Mutex::new(backend));
    let mut daemon =
        VhostUserDaemon::new("sluice-test".into(), backend.clone(), GuestMemoryAtomic::new(GuestMemoryMmap::new()))
            .unwrap();
    let mut listener = Listener::new(&path, true).unwrap();

    let p = path.clone();
    let frontend = std::thread::spawn(move || {
        let mut f = Frontend::connect(&p, 1).unwrap();
        let offered = f.get_features().unwrap();
        assert_eq!(offered, OFFERED_FEATURES);
        f.set_features(offered).unwrap();
        let proto = f.get_protocol_features().unwrap();
        assert!(proto.contains(VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::REPLY_ACK));
        f.set_protocol_features(proto).unwrap();
        f.set_owner().unwrap();
        assert_eq!(f.get_queue_num().unwrap(), 2, "one queue pair");

        let mem = guest_memory();
        let region = mem.find_region(GuestAddress(MEM_BASE)).unwrap();
        let host = mem.get_host_address(GuestAddress(MEM_BASE)).unwrap() as u64;
        f.set_mem_table(&[VhostUserMemoryRegionInfo::from_guest_region(region).unwrap()]).unwrap();

        let mut kicks = Vec::new();
        for q in [RX_QUEUE, TX_QUEUE] {
            // Each queue's rings in its own 64 KiB of guest memory.
            let base = MEM_BASE + 0x1_0000 * 3 * q as u64;
            let to_host = |g: u64| host + (g - MEM_BASE);
            f.set_vring_num(q, 256).unwrap();
            let cfg = VringConfigData {
                queue_max_size: 256,
                queue_size: 256,
                flags: 0,
                desc_table_addr: to_host(base),
                used_ring_addr: to_host(base + 0x1_0000),
                avail_ring_addr: to_host(base + 0x2_0000),
                log_addr: None,
            };
            f.set_vring_addr(q, &cfg).unwrap();
            f.set_vring_base(q, 0).unwrap();
            let kick = EventFd::new(libc::EFD_NONBLOCK).unwrap();
            let call = EventFd::new(libc::EFD_NONBLOCK).unwrap();
            f.set_vring_call(q, &call).unwrap();
            f.set_vring_kick(q, &kick).unwrap();
            f.set_vring_enable(q, true).unwrap();
            kicks.push((kick, call));
        }
        // The guest posts a frame to send: a kick on its transmit queue.
        kicks[TX_QUEUE].0.write(1).unwrap();
        (f, mem, kicks)
    });
    daemon.start(&mut listener).unwrap();
    let (_f, _mem, _kicks) = frontend.join().unwrap();

    assert!(readable(&doorbell), "the kick rang the port's doorbell");
    let b = backend.lock().unwrap();
    assert!(b.kicks >= 1);
    assert_eq!(b.acked() & OFFERED_FEATURES, OFFERED_FEATURES, "every offered feature accepted");
    assert!(b.has_memory(), "the guest's memory was handed over");
    drop(b);
    let _ = std::fs::remove_file(&path);
}
