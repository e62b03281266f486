//! Loading the kernel datapath into a real kernel: a program the verifier refuses is
//! reported with the verifier's own reason. (What the executor does with frames is held
//! to the core by tests/exec.rs and tests/differential.rs; on real devices, with the
//! daemon, by crates/sluice's scenario tests on both datapaths.)

mod common;

use common::{Bpffs, root};
use sluice_ebpf::exec::{Executor, Sizes};

#[test]
#[ignore = "system tier: needs root (BPF: a program loaded for the verifier to refuse); scripts/test.sh runs it"]
fn a_program_the_verifier_refuses_is_reported_with_its_reason() {
    if !root() {
        return;
    }
    static REJECTED: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/rejected.o"));
    let pins = Bpffs::new("sluice-ebpf-rej");
    let e = Executor::open_object(REJECTED, &pins.0, Sizes { stations: 16, verdicts: 16 })
        .err()
        .expect("the verifier refuses it");
    drop(pins);
    let msg = e.to_string();
    assert!(msg.contains("loading the kernel datapath") && msg.contains("verifier said"), "{msg}");
    assert!(msg.contains("invalid access to packet"), "the verifier's own words: {msg}");
}
