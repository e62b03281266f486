//! The kernel's connection tracker from a TC program loaded by aya 0.13: the probe's kfunc
//! calls, rewritten by the loader, pass this kernel's verifier, and `BPF_PROG_TEST_RUN` on
//! frames remembers a connection and finds it both ways, in a network namespace of the
//! test's own (its connection table goes with it).

#[allow(dead_code)] // (the bpffs helpers are the other tests')
mod common;

use common::root;
use sluice_ebpf::kfunc::{Probe, Probed};

/// An IPv4 frame of `proto` (6, 17) from `src:sport` to `dst:dport`.
fn frame(proto: u8, src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
    let l4 = if proto == 6 { 20 } else { 8 };
    let mut ip = vec![0x45, 0, 0, 20 + l4, 0, 0, 0x40, 0, 64, proto, 0, 0];
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    f.extend_from_slice(&ip);
    let mut t = vec![0u8; usize::from(l4)];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    if proto == 6 {
        t[12] = 0x50;
        t[13] = 0x02;
    }
    f.extend_from_slice(&t);
    f
}

#[test]
#[ignore = "system tier: needs root (BPF, a network namespace of its own) and a kernel with nf_conntrack and BTF; scripts/test.sh runs it"]
fn kfunc_calls_rewritten_by_the_loader_remember_a_connection_and_find_it_both_ways() {
    if !root() {
        return;
    }
    let t = std::thread::spawn(|| {
        // SAFETY: unshare(CLONE_NEWNET) moves only the calling thread into a new network
        // namespace; no memory is involved.
        let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "unshare(CLONE_NEWNET): {}", std::io::Error::last_os_error());
        let p = Probe::load().expect("the kernel takes the rewritten kfunc calls");
        let (a, b) = ([10, 0, 0, 1], [10, 0, 0, 2]);
        let rows = [
            ("a TCP SYN, nothing remembered", frame(6, a, b, 40000, 80), Probed::Committed),
            ("the same direction again", frame(6, a, b, 40000, 80), Probed::Original),
            ("the reply", frame(6, b, a, 80, 40000), Probed::Reply),
            ("another connection", frame(6, a, b, 40001, 80), Probed::Committed),
            ("UDP", frame(17, a, b, 5353, 53), Probed::Committed),
            ("UDP's reply", frame(17, b, a, 53, 5353), Probed::Reply),
            ("not IP", vec![0u8; 60], Probed::Other),
        ];
        for (what, f, want) in rows {
            assert_eq!(p.run(&f).unwrap(), want, "{what}");
        }
    });
    if let Err(panic) = t.join() {
        std::panic::resume_unwind(panic);
    }
}
