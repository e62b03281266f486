//! The preload library `sluice smc run` puts in front of a program (docs/architecture.md,
//! "The shared-memory fast path").
//!
//! It is inert unless `SLUICE_SMC` is set in the environment: every hook is then a
//! straight call to the function it replaces. Real functions come from
//! `dlsym(RTLD_NEXT, …)`, resolved once when the library is loaded and kept in atomics, so
//! no hook allocates or takes a lock to find them, and a hook never calls itself.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

mod real;

/// Set by the constructor when `SLUICE_SMC` asks for the fast path.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Runs when the library is loaded, before `main`.
extern "C" fn init() {
    real::resolve();
    // SAFETY: getenv with a NUL-terminated name; the constructor runs before the program
    // can start threads that change the environment.
    let v = unsafe { getenv(c"SLUICE_SMC".as_ptr()) };
    ACTIVE.store(!v.is_null(), Ordering::Relaxed);
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;

unsafe extern "C" {
    fn getenv(name: *const c_char) -> *const c_char;
}

/// True when the program runs under `sluice smc run`.
pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// The version of the library, for `sluice smc run --check` and tests: the sluice
/// version it was built with, NUL-terminated.
#[unsafe(no_mangle)]
pub extern "C" fn sluice_smc_version() -> *const c_char {
    static V: &CStr = match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => c"?",
    };
    V.as_ptr()
}

/// `connect(2)`: for now the real one; the handshake comes here (issue 6).
///
/// # Safety
/// As for `connect(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const c_void, len: u32) -> c_int {
    // SAFETY: the caller's arguments go unchanged to the real function.
    unsafe { real::connect(fd, addr, len) }
}
