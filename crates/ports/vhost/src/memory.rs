//! The guest's memory as the peer shares it: checked before it is mapped, and guarded so
//! that the peer cannot take a page away under the switch.
//!
//! QEMU sends one file per memory region (SET_MEM_TABLE): a memfd (`memory-backend-memfd`) or
//! a file on hugetlbfs, tmpfs or a disk (`memory-backend-file`). The switch maps it shared and
//! reads and writes the guest's rings and buffers there. A page of such a mapping with no
//! page of the file behind it — past the end of a file shorter than the region, of one shrunk
//! since, a hole punched in a huge-page file, a huge page the pool could not supply — is a
//! SIGBUS for whoever touches it, and that would be the whole switch. So:
//! - [`check`]: a region's file must be a regular file holding `mmap_offset + memory_size`
//!   bytes (`fstat`), and a memfd must be sealed against shrinking (`F_SEAL_SHRINK`; QEMU
//!   seals its memfds unless told `seal=off`). A file that is no memfd cannot be sealed, and
//!   is taken as it is: the guard covers it.
//! - [`guard`]: every mapped region is in a process-wide table that a SIGBUS handler reads. A
//!   SIGBUS inside a region puts zero-filled private memory over the page (the access then
//!   completes and reads zeros; the guest loses what it had there) and sets the
//!   connection's `faulted` flag, and the port ends the connection. A SIGBUS anywhere else
//!   goes to the handler that was there before (by default the process ends, as without the
//!   guard).
//! - [`adopt`] and [`sweep`]: a memory table leaves the guard's table only once nothing can
//!   touch it any more — no `memory()` of it is held but the sweep's own — just before it is
//!   unmapped; so the handler never covers an address that is no longer the guest's.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock};

use vhost::vhost_user::message::VhostUserMemoryRegion;
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

/// Regions the guard can hold at once, over every port (QEMU sends at most 8 per table, and
/// a port holds one table, two while it replaces one).
pub const GUARDED_REGIONS: usize = 1024;

/// What the switch refuses in a memory table, and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// fstat or fstatfs failed.
    #[error("the file of guest memory region {index} could not be examined ({source})")]
    Stat {
        /// The region's place in the table.
        index: usize,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// Not a regular file.
    #[error(
        "guest memory region {index} is not in a regular file ({what}): QEMU's memory must be `memory-backend-memfd,share=on` (or `memory-backend-file,share=on`)"
    )]
    NotAFile {
        /// The region's place in the table.
        index: usize,
        /// What it is.
        what: String,
    },
    /// The file is shorter than the region.
    #[error(
        "guest memory region {index} needs {needed} bytes of its file (offset {offset} + size {size}) but the file holds {len}: the switch would fault past its end"
    )]
    Short {
        /// The region's place in the table.
        index: usize,
        /// `mmap_offset + memory_size`.
        needed: u64,
        /// `mmap_offset`.
        offset: u64,
        /// `memory_size`.
        size: u64,
        /// The file's size.
        len: u64,
    },
    /// A memfd its owner could shrink.
    #[error(
        "guest memory region {index} is a memfd not sealed against shrinking (seals {seals:#x}): QEMU could shrink it under the switch; use `memory-backend-memfd,share=on` without `seal=off` (QEMU seals it by default)"
    )]
    Unsealed {
        /// The region's place in the table.
        index: usize,
        /// Its seals (`F_GET_SEALS`).
        seals: i32,
    },
    /// The guard's table is full.
    #[error(
        "the switch already maps {GUARDED_REGIONS} regions of guests' memory: no more can be guarded; detach other VMs first"
    )]
    Full,
}

/// Checks region `index`'s file before it is mapped; returns the size of its pages (the
/// huge page size on hugetlbfs), which the guard covers one at a time.
pub(crate) fn check(index: usize, r: &VhostUserMemoryRegion, file: &impl AsRawFd) -> Result<usize, Refused> {
    let fd = file.as_raw_fd();
    let st = crate::sys::fstat(fd).map_err(|source| Refused::Stat { index, source })?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        let what = crate::peer::fd_target(fd).map_or_else(|_| "unknown".to_string(), |t| t.display().to_string());
        return Err(Refused::NotAFile { index, what });
    }
    let (offset, size) = (r.mmap_offset, r.memory_size);
    let len = st.st_size as u64;
    match offset.checked_add(size) {
        Some(needed) if needed <= len => {}
        needed => return Err(Refused::Short { index, needed: needed.unwrap_or(u64::MAX), offset, size, len }),
    }
    if is_memfd(fd) {
        let seals = crate::sys::seals(fd).unwrap_or(-1);
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(Refused::Unsealed { index, seals });
        }
    }
    page_size(fd).map_err(|source| Refused::Stat { index, source })
}

/// Whether `fd` is a memfd: the kernel names every memfd `/memfd:NAME (deleted)`, a path no
/// file of this process's file system can have (it would be in `/`, which only root writes).
fn is_memfd(fd: RawFd) -> bool {
    crate::peer::fd_target(fd).is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:"))
}

/// The size of the pages that back `fd`'s file when mapped.
fn page_size(fd: RawFd) -> io::Result<usize> {
    let sf = crate::sys::fstatfs(fd)?;
    let huge = sf.f_type == libc::HUGETLBFS_MAGIC && sf.f_bsize > 0 && (sf.f_bsize as u64).is_power_of_two();
    Ok(if huge { sf.f_bsize as usize } else { crate::sys::page_size() })
}

/// One guarded region: where it is mapped, its page size, and the flag of the connection it
/// belongs to. `start` is 0 while the slot is free; it is written last when a region comes
/// and first when it goes.
struct Slot {
    claimed: AtomicBool,
    start: AtomicUsize,
    len: AtomicUsize,
    page: AtomicUsize,
    faulted: AtomicPtr<AtomicBool>,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    claimed: AtomicBool::new(false),
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    page: AtomicUsize::new(0),
    faulted: AtomicPtr::new(std::ptr::null_mut()),
};
static SLOTS: [Slot; GUARDED_REGIONS] = [FREE; GUARDED_REGIONS];
/// The SIGBUS disposition before the guard's (where a fault outside guest memory goes).
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Regions of one memory table in the guard, given back (before the table is unmapped)
/// when this is dropped.
pub(crate) struct Guarded {
    slots: Vec<usize>,
    /// Keeps the flag the slots point at alive as long as they do.
    _faulted: Arc<AtomicBool>,
}

impl Drop for Guarded {
    fn drop(&mut self) {
        for &i in &self.slots {
            let s = &SLOTS[i];
            s.start.store(0, Ordering::Release);
            s.faulted.store(std::ptr::null_mut(), Ordering::Release);
            s.claimed.store(false, Ordering::Release);
        }
    }
}

/// Puts every region of `mem` under the guard, for the connection whose flag is `faulted`;
/// `pages` are the regions' page sizes, in the table's order.
pub(crate) fn guard(mem: &GuestMemoryMmap, pages: &[usize], faulted: &Arc<AtomicBool>) -> Result<Guarded, Refused> {
    install();
    let mut g = Guarded { slots: Vec::new(), _faulted: faulted.clone() };
    for (r, &page) in mem.iter().zip(pages) {
        let i = SLOTS
            .iter()
            .position(|s| s.claimed.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok())
            .ok_or(Refused::Full)?;
        g.slots.push(i);
        let s = &SLOTS[i];
        s.len.store(r.len() as usize, Ordering::Relaxed);
        s.page.store(page, Ordering::Relaxed);
        s.faulted.store(Arc::as_ptr(faulted).cast_mut(), Ordering::Relaxed);
        s.start.store(r.as_ptr() as usize, Ordering::Release);
    }
    Ok(g)
}

/// Memory tables handed to the guard, each with its regions' slots.
static TABLES: Mutex<Vec<(Arc<GuestMemoryMmap>, Guarded)>> = Mutex::new(Vec::new());

/// Keeps table `mem` (the same `Arc` the connection's `GuestMemoryAtomic` holds) and its
/// guard until nothing else holds it ([`sweep`]).
pub(crate) fn adopt(mem: Arc<GuestMemoryMmap>, guarded: Guarded) {
    TABLES.lock().unwrap_or_else(|p| p.into_inner()).push((mem, guarded));
    sweep();
}

/// Unmaps the tables nobody uses any more: their regions leave the guard first, then the
/// mappings go.
pub(crate) fn sweep() {
    let done: Vec<_> = {
        let mut t = TABLES.lock().unwrap_or_else(|p| p.into_inner());
        let (done, keep) = t.drain(..).partition(|(m, _)| Arc::strong_count(m) == 1);
        *t = keep;
        done
    };
    for (mem, guarded) in done {
        drop(guarded);
        drop(mem);
    }
}

/// Installs the SIGBUS handler, once per process; the disposition it replaces is kept for
/// faults outside guest memory.
fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: sigaction is plain data; all zeroes is a valid value. `sa` is fully
        // initialized before it is installed (handler, flags, an empty mask); `old` receives
        // the previous disposition.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old);
            let _ = PREVIOUS.set(old);
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
        }
    });
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for a SA_SIGINFO handler; si_addr is the
    // faulting address for SIGBUS.
    let addr = unsafe { (*info).si_addr() } as usize;
    if cover(addr) {
        return;
    }
    forward(sig, info, ctx);
}

/// Puts private zero pages over the guest page holding `addr`, if a guarded region holds it,
/// and flags its connection. Only atomics and `mmap`: fit for a signal handler.
fn cover(addr: usize) -> bool {
    for s in &SLOTS {
        let start = s.start.load(Ordering::Acquire);
        let len = s.len.load(Ordering::Relaxed);
        if start == 0 || addr < start || addr - start >= len {
            continue;
        }
        let page = s.page.load(Ordering::Relaxed).max(1);
        let at = start + (addr - start) / page * page;
        let n = page.min(start + len - at);
        // SAFETY: errno is this thread's; saved and restored around the mmap so that the
        // interrupted code does not see it change.
        let errno = unsafe { *libc::__errno_location() };
        // SAFETY: [at, at + n) lies inside a guest region this process mapped and still
        // maps (its slot is cleared before it is unmapped); replacing it with anonymous
        // memory only changes what the switch reads there.
        let p = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                n,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = errno };
        if p == libc::MAP_FAILED {
            return false;
        }
        let flag = s.faulted.load(Ordering::Acquire);
        if !flag.is_null() {
            // SAFETY: the flag lives as long as the slot points at it (`Guarded` holds it).
            unsafe { (*flag).store(true, Ordering::Release) };
        }
        return true;
    }
    false
}

/// A SIGBUS outside guest memory: to the handler that was there before, or the default
/// action (the fault repeats once the handler returns, and the process ends as it would
/// have without the guard).
fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let prev = PREVIOUS.get().map(|p| (p.sa_sigaction, p.sa_flags));
    match prev {
        Some((h, flags)) if h != libc::SIG_DFL && h != libc::SIG_IGN => {
            if flags & libc::SA_SIGINFO != 0 {
                // SAFETY: a SA_SIGINFO disposition's handler has this signature.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(h) };
                f(sig, info, ctx);
            } else {
                // SAFETY: a plain disposition's handler takes the signal number.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
                f(sig);
            }
        }
        _ => {
            // SAFETY: `sa` is fully initialized: the default disposition, an empty mask.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = libc::SIG_DFL;
                libc::sigemptyset(&mut sa.sa_mask);
                libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use vm_memory::{Bytes, FileOffset, GuestAddress};

    fn memfd(size: u64, seals: i32) -> File {
        let f = crate::sys::memfd(c"sluice-test").unwrap();
        f.set_len(size).unwrap();
        if seals != 0 {
            crate::sys::add_seals(f.as_raw_fd(), seals).unwrap();
        }
        f
    }

    fn region(size: u64, offset: u64) -> VhostUserMemoryRegion {
        VhostUserMemoryRegion::new(0, size, 0x7000_0000, offset)
    }

    #[test]
    fn a_sealed_memfd_as_large_as_the_region_is_taken() {
        let f = memfd(1 << 20, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW);
        assert!(check(0, &region(1 << 20, 0), &f).unwrap() >= 4096);
        assert!(check(0, &region(1 << 19, 1 << 19), &f).is_ok());
    }

    #[test]
    fn a_short_file_an_unsealed_memfd_and_a_pipe_are_refused() {
        let f = memfd(1 << 20, libc::F_SEAL_SHRINK);
        let e = check(2, &region(2 << 20, 0), &f).unwrap_err();
        assert!(matches!(e, Refused::Short { index: 2, .. }), "{e}");
        assert!(e.to_string().contains("holds 1048576"), "{e}");
        assert!(matches!(check(0, &region(1 << 20, 4096), &f), Err(Refused::Short { .. })));
        assert!(matches!(check(0, &region(u64::MAX, 4096), &f), Err(Refused::Short { .. })));

        let e = check(0, &region(1 << 20, 0), &memfd(1 << 20, libc::F_SEAL_GROW)).unwrap_err();
        assert!(matches!(e, Refused::Unsealed { .. }) && e.to_string().contains("seal=off"), "{e}");

        let (r, _w) = std::io::pipe().unwrap();
        let e = check(0, &region(4096, 0), &r).unwrap_err();
        assert!(e.to_string().contains("pipe:["), "{e}");
    }

    /// A file that is no memfd cannot be sealed: taken when large enough; then truncated
    /// under the mapping, a read there reads zeros and flags the connection instead of
    /// killing the process.
    #[test]
    fn a_file_shrunk_under_the_switch_reads_zeros_and_flags_the_connection() {
        let path = std::env::temp_dir().join(format!("sluice-memory.{}", std::process::id()));
        let file = File::options().read(true).write(true).create_new(true).open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        file.set_len(4 << 20).unwrap();
        let page = check(0, &region(4 << 20, 0), &file).unwrap();
        let keep = file.try_clone().unwrap();
        let mem =
            GuestMemoryMmap::from_ranges_with_files(&[(GuestAddress(0), 4 << 20, Some(FileOffset::new(file, 0)))])
                .unwrap();
        mem.write_obj(0x5a5a_u16, GuestAddress(3 << 20)).unwrap();
        let faulted = Arc::new(AtomicBool::new(false));
        let g = guard(&mem, &[page], &faulted).unwrap();
        keep.set_len(1 << 20).unwrap();
        assert_eq!(mem.read_obj::<u16>(GuestAddress(3 << 20)).unwrap(), 0, "the page past the end reads zeros");
        assert!(faulted.load(Ordering::Acquire), "the connection is flagged");
        assert_eq!(mem.read_obj::<u16>(GuestAddress((3 << 20) + 2)).unwrap(), 0);
        mem.write_obj(1u8, GuestAddress(3 << 20)).unwrap();
        // Below the new end the file is still the guest's.
        mem.write_obj(7u8, GuestAddress(0)).unwrap();
        assert_eq!(mem.read_obj::<u8>(GuestAddress(0)).unwrap(), 7);
        drop(g);
    }

    #[test]
    fn a_table_leaves_the_guard_when_nothing_holds_it() {
        let f = memfd(1 << 20, libc::F_SEAL_SHRINK);
        let mem = GuestMemoryMmap::from_ranges_with_files(&[(GuestAddress(0), 1 << 20, Some(FileOffset::new(f, 0)))])
            .unwrap();
        let start = mem.iter().next().unwrap().as_ptr() as usize;
        let faulted = Arc::new(AtomicBool::new(false));
        let g = guard(&mem, &[4096], &faulted).unwrap();
        let held = |a: usize| SLOTS.iter().any(|s| s.start.load(Ordering::Acquire) == a);
        assert!(held(start));
        let mem = Arc::new(mem);
        let user = mem.clone();
        adopt(mem, g);
        sweep();
        assert!(held(start), "still in use");
        drop(user);
        sweep();
        assert!(!held(start), "unmapped and out of the guard");
    }
}
