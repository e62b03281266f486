//! Fuzzes the profile.xml reader: the input is the file's text (non-UTF-8 input is read
//! lossily). Besides "never panics", it checks that whatever `parse` accepts, `to_xml` writes
//! back as text `parse` reads to an equal profile, before and after the command-line
//! overrides, that every accepted profile keeps the documented invariants, and that the
//! per-connection scripts derived from it (what `sluice bench serve` runs for a client)
//! stay within the server's bounds whatever the counts and iterations say.

#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use sluice_bench::profile::{FlowOpKind, MAX_SIZE, MAX_STRANDS, Profile, Repeat, parse};
use sluice_bench::script::{MAX_GROUPS, MAX_STEPS, derive_all};

/// A fixed environment: some names defined (one with markup and `$` in its value), the rest not.
fn env(name: &str) -> Option<String> {
    match name {
        "h" => Some("10.0.0.1".into()),
        "n" => Some("4".into()),
        "d" => Some("30s".into()),
        "x" => Some("<a \"b\" & 'c' $h\n>".into()),
        _ => None,
    }
}

fn round_trip(p: &Profile) {
    let xml = p.to_xml();
    match parse(&xml, "to_xml", &|_| None) {
        // (Equality is the workload's: warnings about how the text was written, which
        // to_xml writes canonically, are not compared.)
        Ok(q) => assert_eq!(&q, p, "to_xml output reads back equal:\n{xml}"),
        Err(e) => panic!("to_xml output is refused: {e}\n{xml}"),
    }
}

fn check_invariants(p: &Profile) {
    assert!(!p.name.trim().is_empty() && !p.groups.is_empty());
    for g in &p.groups {
        assert!((1..=MAX_STRANDS).contains(&g.count) && !g.transactions.is_empty());
        for t in &g.transactions {
            assert!(!t.flowops.is_empty());
            match t.repeat {
                Repeat::Iterations(n) => assert!(n >= 1),
                Repeat::Duration(d) => assert!(!d.is_zero()),
            }
            for f in &t.flowops {
                let io = matches!(f.kind, FlowOpKind::Read | FlowOpKind::Write | FlowOpKind::Send | FlowOpKind::Recv);
                assert_eq!(f.size.is_some(), io);
                if let Some(s) = &f.size {
                    assert!(1 <= s.min() && s.min() <= s.max() && s.max() <= MAX_SIZE);
                }
                assert_eq!(f.think.is_some(), f.kind == FlowOpKind::Think);
                assert!(f.count >= 1);
                let _ = f.to_string();
            }
        }
    }
}

/// What the server would run for this profile: refused, or bounded in groups and steps
/// (a count is a repeat, never expanded into steps).
fn check_scripts(p: &Profile) {
    if let Ok(scripts) = derive_all(p) {
        assert!(scripts.len() <= MAX_GROUPS);
        for s in &scripts {
            assert!(s.segments.iter().map(|g| g.steps.len()).sum::<usize>() <= MAX_STEPS);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(mut p) = parse(&text, "fuzz", &env) else { return };
    check_invariants(&p);
    check_scripts(&p);
    round_trip(&p);
    p.set_remotehost("192.0.2.7");
    p.set_duration(Duration::from_millis(1500));
    p.set_conns(3);
    assert_eq!(u64::from(p.conns()), (3 * p.groups.len() as u64).min(u64::from(u32::MAX)));
    round_trip(&p);
});
