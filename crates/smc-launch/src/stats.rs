//! `sluice smc stats`: every user's statistics file in `smc/stats/`, summed and each on
//! its own, and `reset`, which writes zeros in place — never truncating a file that
//! programs map (docs/architecture.md, "The fast path's trust boundary").
//!
//! A file is counted only if it is a regular file named by a uid, owned by that uid, of
//! the segment's size and with its magic word; anything else is skipped with a note, so a
//! garbled or planted file never stops the view. A user's file says what that user's
//! programs counted — or what the user wrote into it: any member of the fast path's group
//! can misstate their own counts, never another user's. So every count is also shown by
//! user, and the sum only adds (saturating): no file can lower what the others counted
//! (docs/architecture.md, "The fast path under load, and its shared files").

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use crate::error::Result;
use sluice_smc::msg::Reason;
use sluice_smc::stats::{self, Counter};

use super::layout;

/// The most entries of `smc/stats/` one look reads: any allowed user can make files
/// there, and each that is not a statistics file costs a look before it is skipped.
const MAX_ENTRIES: usize = 65536;

fn dir() -> PathBuf {
    layout::smc_dir().join("stats")
}

/// The statistics files: (uid, path), those that look like one by name; and a note if
/// the directory holds more entries than are read.
fn files() -> (Vec<(u32, PathBuf)>, Option<String>) {
    let mut seen = 0usize;
    let mut out: Vec<(u32, PathBuf)> = std::fs::read_dir(dir())
        .into_iter()
        .flatten()
        .flatten()
        .take(MAX_ENTRIES)
        .inspect(|_| seen += 1)
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path())))
        .collect();
    out.sort();
    let more =
        (seen == MAX_ENTRIES).then(|| format!("{}: only its first {MAX_ENTRIES} entries were read", dir().display()));
    (out, more)
}

/// The words of one file, or why it is not a statistics file.
fn read_file(uid: u32, path: &std::path::Path) -> Result<Vec<u64>, String> {
    let f = layout::open_entry(path, false, Some(uid)).map_err(|e| e.to_string())?;
    let mut b = vec![0u8; stats::LEN];
    let n = f.read_at(&mut b, 0).map_err(|e| e.to_string())?;
    if n < stats::WORDS * 8 {
        return Err(format!("{n} bytes, too short"));
    }
    let words: Vec<u64> = b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default())).collect();
    if words[0] != stats::MAGIC {
        return Err("no sluice statistics magic".into());
    }
    Ok(words)
}

/// What `smc/stats/` holds: each user's counters (the words of their file), by uid, and
/// a note for each entry that is not a statistics file.
pub struct Tally {
    pub users: BTreeMap<u32, Vec<u64>>,
    pub notes: Vec<String>,
}

/// Reads every user's statistics file.
pub fn gather() -> Tally {
    let (files, more) = files();
    let mut t = Tally { users: BTreeMap::new(), notes: more.into_iter().collect() };
    for (uid, path) in files {
        match read_file(uid, &path) {
            Ok(w) => {
                t.users.insert(uid, w);
            }
            Err(why) => t.notes.push(format!("skipping {}: {why}", path.display())),
        }
    }
    t
}

/// The counters of one segment's words as JSON.
fn counters(words: &[u64]) -> serde_json::Map<String, serde_json::Value> {
    let w = |i: usize| words.get(i).copied().unwrap_or(0);
    let mut v = serde_json::Map::new();
    for c in Counter::ALL {
        v.insert(c.name().into(), w(stats::counter_index(c)).into());
    }
    for (side, server) in [("fallback_client", false), ("fallback_server", true)] {
        let m: serde_json::Map<_, _> =
            Reason::ALL.iter().map(|r| (r.name().to_string(), w(stats::fallback_index(*r, server)).into())).collect();
        v.insert(side.into(), m.into());
    }
    for (name, send) in [("rmem_histogram", false), ("tmem_histogram", true)] {
        let m: serde_json::Map<_, _> = stats::BUCKETS
            .iter()
            .enumerate()
            .map(|(i, b)| (b.to_string(), w(stats::hist_index(16384 << i, send)).into()))
            .collect();
        v.insert(name.into(), m.into());
    }
    v
}

/// Tally `t` as JSON: every counter summed over the users (saturating: a file can add to
/// the sum, never take from it), and each user's own under `users`, by uid.
pub fn to_json(t: &Tally) -> serde_json::Value {
    let mut sum = vec![0u64; stats::LEN / 8];
    for w in t.users.values() {
        sum.iter_mut().zip(w).for_each(|(s, x)| *s = s.saturating_add(*x));
    }
    let mut v = counters(&sum);
    let users: serde_json::Map<_, _> =
        t.users.iter().map(|(uid, w)| (uid.to_string(), serde_json::Value::from(counters(w)))).collect();
    v.insert("users".into(), users.into());
    v.into()
}

/// The counters of every user, summed, and each user's (`users`), as JSON (all zero when
/// no program has run under the launcher yet). Entries that are not statistics files are
/// passed over without a word ([`gather`] has the notes).
pub fn read_stats() -> Result<serde_json::Value> {
    Ok(to_json(&gather()))
}

/// Zeroes the counters this user may write (root: everyone's), in place; returns how many
/// users' files were reset. An entry that is not a statistics file is skipped with a note;
/// the others are reset all the same.
pub fn reset() -> Result<usize> {
    let me = sluice_sys::user::euid();
    let zeros = vec![0u8; stats::LEN - 8];
    let mut n = 0;
    let (files, more) = files();
    if let Some(m) = more {
        eprintln!("sluice: {m}");
    }
    for (uid, path) in files {
        if me != 0 && uid != me {
            continue;
        }
        // No truncation: programs map these files, and a shorter file is a SIGBUS for them.
        // Only whole segments: writing past the end of a short one would grow it.
        let done = layout::open_entry(&path, true, Some(uid)).and_then(|f| {
            if f.metadata()?.len() < stats::LEN as u64 {
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "too short"));
            }
            f.write_all_at(&zeros, 8)
        });
        match done {
            Ok(()) => n += 1,
            Err(e) => eprintln!("sluice: skipping {}: {e}", path.display()),
        }
    }
    Ok(n)
}

/// The counters as `sluice smc stats` prints them.
pub fn render(v: &serde_json::Value) -> String {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let sum = |k: &str| v[k].as_object().map_or(0, |m| m.values().filter_map(|x| x.as_u64()).sum::<u64>());
    let mut out = String::new();
    let line = |out: &mut String, a: &str, c: String, s: String| out.push_str(&format!("  {a:<24}{c:>12}{s:>12}\n"));
    out.push_str(&format!("  {:<24}{:>12}{:>12}\n", "", "client", "server"));
    line(&mut out, "connections", n("connections_client").to_string(), n("connections_server").to_string());
    line(&mut out, "on shared memory", n("smc_client").to_string(), n("smc_server").to_string());
    line(&mut out, "TCP fallback", sum("fallback_client").to_string(), sum("fallback_server").to_string());
    for r in Reason::ALL {
        let (c, s) = (
            v["fallback_client"][r.name()].as_u64().unwrap_or(0),
            v["fallback_server"][r.name()].as_u64().unwrap_or(0),
        );
        if c > 0 || s > 0 {
            line(&mut out, &format!("  {}", r.name()), c.to_string(), s.to_string());
        }
    }
    out.push_str(&format!("  {:<24}{:>12}\n", "handshake errors", n("handshake_errors")));
    let (tx, rx, txc, rxc) = (n("tx_bytes"), n("rx_bytes"), n("tx_calls"), n("rx_calls"));
    out.push_str(&format!("  {:<24}{:>12} bytes in {} calls\n", "sent", tx, txc));
    out.push_str(&format!("  {:<24}{:>12} bytes in {} calls\n", "received", rx, rxc));
    let full = n("buffer_full");
    let pct = if txc > 0 { 100.0 * full as f64 / txc as f64 } else { 0.0 };
    out.push_str(&format!("  {:<24}{:>12} ({pct:.2}% of sends)\n", "buffer full", full));
    out.push_str(&format!("  {:<24}{:>12}\n", "buffers grown", n("buffers_grown")));
    out.push_str(&format!(
        "  {:<24}{:>12} doorbells, {} from the rings\n",
        "wake-ups",
        n("doorbells"),
        n("ring_events")
    ));
    out.push_str(&format!("  {:<24}{:>12}\n", "reset by a broken peer", n("peer_faults")));
    for (k, title) in [("rmem_histogram", "receive buffers"), ("tmem_histogram", "send buffers")] {
        let parts: Vec<String> =
            stats::BUCKETS.iter().map(|b| format!("{b}: {}", v[k][*b].as_u64().unwrap_or(0))).collect();
        out.push_str(&format!("  {title:<24}{}\n", parts.join("  ")));
    }
    // Whose programs counted what: each user's file is theirs to write (a user can misstate
    // only their own counts).
    let users = v["users"].as_object().into_iter().flatten();
    let mut by_user = String::new();
    for (uid, u) in users {
        let n = |k: &str| u[k].as_u64().unwrap_or(0);
        let who = uid.parse().map_or_else(|_| uid.clone(), layout::user_name);
        let side = |c: &str| format!("{} ({})", n(&format!("connections_{c}")), n(&format!("smc_{c}")));
        by_user.push_str(&format!("    {who:<22}{:>20}{:>20}\n", side("client"), side("server")));
    }
    if !by_user.is_empty() {
        // (As each user's programs counted them.)
        out.push_str(&format!("  {:<24}{:>20}{:>20}\n", "connections by user", "client (moved)", "server (moved)"));
        out.push_str(&by_user);
    }
    out
}
