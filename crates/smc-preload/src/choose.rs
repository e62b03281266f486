//! Which connections try shared memory: the operator's rules (`--tcp`) and the automatic
//! rule for short connections (docs/architecture.md, "Which connections move"; the logic
//! is `sluice_smc::rules` and `sluice_smc::auto`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use sluice_smc::auto::{Auto, Choice};
use sluice_smc::msg::Reason;
use sluice_smc::rules::{Rule, Rules};

static RULES: OnceLock<Rules> = OnceLock::new();
static AUTO: Mutex<Option<Auto>> = Mutex::new(None);
/// A rule names this program: every connection of it stays on TCP.
static PROGRAM_KEPT: AtomicBool = AtomicBool::new(false);

/// Takes the settings `SLUICE_SMC` gave: the rules as written (`tcp=`; one that does not
/// parse is passed by — the launcher refuses it first) and the threshold (`short=`).
pub(crate) fn set_up(rules: &[&str], short_bytes: u64) {
    let mut rs = Rules::default();
    for r in rules {
        if let Ok(r) = Rule::parse(r) {
            rs.push(r);
        }
    }
    let kept = std::fs::read_to_string("/proc/self/comm").is_ok_and(|n| rs.name_program(n.trim_end()))
        || std::env::current_exe()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .is_some_and(|n| rs.name_program(&n));
    PROGRAM_KEPT.store(kept, Ordering::Relaxed);
    let _ = RULES.set(rs);
    *AUTO.lock().unwrap_or_else(|p| p.into_inner()) = Some(Auto::new(short_bytes));
}

/// Why a client's connection to `dst` stays on TCP before anything else is looked at, if
/// it does.
pub(crate) fn client(dst: SocketAddr) -> Option<Reason> {
    if PROGRAM_KEPT.load(Ordering::Relaxed) || RULES.get().is_some_and(|r| r.cover(dst)) {
        return Some(Reason::Rule);
    }
    let mut g = AUTO.lock().unwrap_or_else(|p| p.into_inner());
    match g.as_mut().map(|a| a.decide(dst)) {
        Some(Choice::Stay) => Some(Reason::Short),
        _ => None,
    }
}

/// True if a listener on `local` stays on TCP (it is not registered: no client meets it).
pub(crate) fn listener_kept(local: SocketAddr) -> bool {
    PROGRAM_KEPT.load(Ordering::Relaxed) || RULES.get().is_some_and(|r| r.cover(local))
}

/// A client connection to `dst` on shared memory ended in this process, having moved
/// `bytes` in `moves` transfers.
pub(crate) fn ended(dst: SocketAddr, bytes: u64, moves: u64) {
    if let Some(a) = AUTO.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
        a.ended(dst, bytes, moves);
    }
}
