//! The system calls the crate makes beyond aya's, each a safe function over one call: the
//! program's clock, the bpffs the maps are pinned on, and a program's test run
//! (`BPF_PROG_TEST_RUN`, with the kernel's structs it takes).

use std::ffi::CStr;
use std::io;
use std::os::fd::RawFd;

/// The file system type of a bpffs (`statfs`'s `f_type`).
pub(crate) const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// The type of the file system `path` is on (`statfs`'s `f_type`).
pub(crate) fn fs_type(path: &CStr) -> io::Result<i64> {
    // SAFETY: statfs is plain data; all zeroes is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated; `st` is valid for writes of its size.
    if unsafe { libc::statfs(path.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_type as i64)
}

/// Mounts a bpffs on directory `target`, with mount options `options`.
pub(crate) fn mount_bpffs(target: &CStr, options: &CStr) -> io::Result<()> {
    // SAFETY: every string is NUL-terminated and outlives the call.
    let r = unsafe { libc::mount(c"bpf".as_ptr(), target.as_ptr(), c"bpf".as_ptr(), 0, options.as_ptr().cast()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `CLOCK_MONOTONIC` now, in nanoseconds: the program's clock (`bpf_ktime_get_ns`), which
/// its last-seen stamps are read against.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec the call writes; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `struct __sk_buff` of linux/bpf.h (UAPI, so it only grows at the end): the context a
/// test run takes and gives back. Only `mark`, `priority`, `ingress_ifindex`, `ifindex`,
/// `cb`, `tstamp`, `wire_len`, `gso_segs`, `gso_size` and `hwtstamp` may be nonzero.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct SkBuff {
    pub(crate) len: u32,
    pub(crate) pkt_type: u32,
    pub(crate) mark: u32,
    pub(crate) queue_mapping: u32,
    pub(crate) protocol: u32,
    pub(crate) vlan_present: u32,
    pub(crate) vlan_tci: u32,
    pub(crate) vlan_proto: u32,
    pub(crate) priority: u32,
    pub(crate) ingress_ifindex: u32,
    pub(crate) ifindex: u32,
    pub(crate) tc_index: u32,
    pub(crate) cb: [u32; 5],
    pub(crate) hash: u32,
    pub(crate) tc_classid: u32,
    pub(crate) data: u32,
    pub(crate) data_end: u32,
    pub(crate) napi_id: u32,
    pub(crate) family: u32,
    pub(crate) remote_ip4: u32,
    pub(crate) local_ip4: u32,
    pub(crate) remote_ip6: [u32; 4],
    pub(crate) local_ip6: [u32; 4],
    pub(crate) remote_port: u32,
    pub(crate) local_port: u32,
    pub(crate) data_meta: u32,
    pub(crate) flow_keys: u64,
    pub(crate) tstamp: u64,
    pub(crate) wire_len: u32,
    pub(crate) gso_segs: u32,
    pub(crate) sk: u64,
    pub(crate) gso_size: u32,
    pub(crate) tstamp_type: u32,
    pub(crate) hwtstamp: u64,
}

const _: () = {
    assert!(std::mem::size_of::<SkBuff>() == 192);
    assert!(std::mem::offset_of!(SkBuff, ifindex) == 40);
    assert!(std::mem::offset_of!(SkBuff, gso_segs) == 164);
    assert!(std::mem::offset_of!(SkBuff, gso_size) == 176);
};

/// The `test` member of `union bpf_attr` (`BPF_PROG_TEST_RUN`), with its tail padding.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    pad: u32,
}

/// `bpf(2)`'s command for a test run.
const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// Runs program `prog` once on `data` with context `skb` (`BPF_PROG_TEST_RUN`; aya 0.13
/// has no call for it). Returns the program's return code and how many bytes of the frame
/// it left were written to `out`; `skb` gets the context it left.
pub(crate) fn prog_test_run(prog: RawFd, data: &[u8], out: &mut [u8], skb: &mut SkBuff) -> io::Result<(u32, usize)> {
    let skb_ptr: *mut SkBuff = skb;
    let mut attr = TestRunAttr {
        prog_fd: prog as u32,
        data_size_in: data.len() as u32,
        data_size_out: out.len() as u32,
        data_in: data.as_ptr() as u64,
        data_out: out.as_mut_ptr() as u64,
        repeat: 1,
        ctx_size_in: std::mem::size_of::<SkBuff>() as u32,
        ctx_size_out: std::mem::size_of::<SkBuff>() as u32,
        ctx_in: skb_ptr as u64,
        ctx_out: skb_ptr as u64,
        ..TestRunAttr::default()
    };
    // SAFETY: `attr` is the `test` member of `union bpf_attr` with every field the kernel
    // reads set and the rest zero; the kernel reads `data_size_in` bytes at `data_in` and
    // 192 at `ctx_in`, and writes at most `data_size_out` bytes at `data_out` and 192 at
    // `ctx_out` (the same `skb`, read before it is written): all point into live buffers
    // of those sizes, borrowed for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            &mut attr as *mut TestRunAttr,
            std::mem::size_of::<TestRunAttr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((attr.retval, (attr.data_size_out as usize).min(out.len())))
}
