//! `fib-flush`: the path's switch forgets every station it learned, every
//! [`FLUSH_EVERY`], so the cell's frames keep being the first between stations it does
//! not know — flooded until it learns them again. On sluice's kernel datapath each such
//! frame is an upcall to the user-space core and back: what a first packet costs.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use sluice_api::client::Client;
use sluice_api::proto::{FibReport, Request};

use super::{Clock, Shared, Tally};

/// How often the switch forgets what it learned.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// Sleeps to the next flush; false once the cell is over.
fn next(at: &mut Instant, sh: &Shared) -> bool {
    *at += FLUSH_EVERY;
    while Instant::now() < *at {
        if sh.over() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    !sh.over()
}

/// Removes every learned (not static) entry of the sluice switch at `socket` every
/// [`FLUSH_EVERY`] until the cell ends; counts the flushes and the entries removed.
pub fn flush_switch(socket: &Path, sh: &Shared, mut clock: Clock) -> io::Result<Tally> {
    let mut t = Tally::default();
    let mut at = Instant::now();
    while next(&mut at, sh) {
        let mut c = Client::connect(socket).map_err(io::Error::other)?;
        let fib: FibReport = c.call(&Request::FibShow).map_err(io::Error::other)?;
        for e in fib.entries.iter().filter(|e| !e.is_static) {
            match c.call_value(&Request::FibDel { mac: e.mac.clone(), vlan: e.vlan }) {
                Ok(_) => t.add("entries_removed", 1),
                // Aged out or removed meanwhile.
                Err(_) => t.add("entries_gone", 1),
            }
        }
        t.add("flushes", 1);
        clock.tick();
    }
    clock.tick();
    Ok(t)
}

/// Flushes the dynamic entries of bridge `br0` in namespace `ns` (`bridge fdb flush`)
/// every [`FLUSH_EVERY`] until the cell ends; counts the flushes. The `bridge` processes'
/// CPU is the study's children's, not this thread's.
pub fn flush_bridge(ns: &str, sh: &Shared, mut clock: Clock) -> io::Result<Tally> {
    let mut t = Tally::default();
    let mut at = Instant::now();
    while next(&mut at, sh) {
        let ok = std::process::Command::new("bridge")
            .args(["-n", ns, "fdb", "flush", "dev", "br0", "dynamic"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()?
            .success();
        t.add(if ok { "flushes" } else { "failed_flushes" }, 1);
        clock.tick();
    }
    clock.tick();
    Ok(t)
}
