//! Ends what a test process started: a process and everything below it, whole (its
//! children, theirs, their process groups), and at the test process's exit every process
//! still below it, named and counted as a failure — no server, daemon or shell a test
//! started outlives its test binary.

use std::collections::HashMap;
use std::sync::Once;

/// One line of `/proc/PID/stat` that matters here: (parent, process group, state).
fn stat(pid: i32) -> Option<(i32, i32, char)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (in parentheses) may hold anything; the fields follow its last ')'.
    let mut f = s[s.rfind(')')? + 1..].split_whitespace();
    let state = f.next()?.chars().next()?;
    Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?, state))
}

/// The processes below `root` now (not `root` itself), parents before their children;
/// zombies (ended, waiting to be reaped) are left out.
fn below(root: i32) -> Vec<i32> {
    let mut kids: HashMap<i32, Vec<i32>> = HashMap::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        if let Some((ppid, _, state)) = stat(pid)
            && state != 'Z'
        {
            kids.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = Vec::new();
    let mut next = vec![root];
    while let Some(p) = next.pop() {
        for &k in kids.get(&p).map(Vec::as_slice).unwrap_or_default() {
            out.push(k);
            next.push(k);
        }
    }
    out
}

/// Kills `pid` and everything below it: the tree is read first (a killed parent's
/// children would be handed to init), then each process and each process group one of
/// them leads gets SIGKILL.
pub fn end_tree(pid: i32) {
    let mut all = below(pid);
    all.insert(0, pid);
    for &p in &all {
        // SAFETY: signals to processes (and groups) found below ours just now; a pid that
        // has ended meanwhile makes the call fail harmlessly.
        unsafe {
            if stat(p).is_some_and(|(_, pgrp, _)| pgrp == p) {
                libc::kill(-p, libc::SIGKILL);
            }
            libc::kill(p, libc::SIGKILL);
        }
    }
}

/// The command line of `pid`, for a message.
fn cmdline(pid: i32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let s: Vec<String> =
        raw.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    if s.is_empty() { "?".into() } else { s.join(" ") }
}

static AT_EXIT: Once = Once::new();

/// Makes the test process end, at its exit, whatever it started that still runs (and
/// then remove its runtime directory, `super::init`'s), failing when there was any.
pub fn end_at_exit() {
    AT_EXIT.call_once(|| {
        // SAFETY: registers a plain function without captures; it runs once at exit.
        unsafe { libc::atexit(at_exit) };
    });
}

extern "C" fn at_exit() {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    let mut left = below(me);
    if !left.is_empty() {
        // A process just told to stop may be on its way out.
        std::thread::sleep(std::time::Duration::from_millis(500));
        left = below(me);
    }
    let named: Vec<String> = left.iter().map(|&p| format!("  {p} {}", cmdline(p))).collect();
    for &p in &left {
        end_tree(p);
    }
    super::remove_run_dir();
    if !named.is_empty() {
        eprintln!(
            "error: {} process(es) the tests started still ran when the tests ended (now killed):\n{}",
            named.len(),
            named.join("\n")
        );
        // SAFETY: ends the process at once with a failing status; the other exit handlers
        // have nothing left to do that matters more than the failure.
        unsafe { libc::_exit(101) };
    }
}
