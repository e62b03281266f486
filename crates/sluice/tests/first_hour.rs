//! A new user's first hour: what the README and `--help` say, the example config working
//! as its comments say, a capture that cannot destroy a file by a mistyped name, a host
//! name that does not resolve said to be one.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::*;

/// The top of the source tree.
fn tree() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The internal references user-facing text must not make: work items, the papers the
/// design started from, by their working names. Returns the first one `text` makes.
fn internal_reference(text: &str) -> Option<String> {
    text.lines()
        .find(|line| {
            let lower = line.to_lowercase();
            let numbered = ["issue ", "seed ", "seeds "].iter().any(|w| {
                lower.match_indices(w).any(|(i, _)| lower[i + w.len()..].starts_with(|c: char| c.is_ascii_digit()))
            });
            // (Case kept: a study's path is named `…-zovn`; that name is an identifier.)
            numbered || line.contains("zOVN")
        })
        .map(|line| format!("{:?}", line.trim()))
}

/// The subcommands `sluice ARGS --help` lists (without `help`).
fn subcommands(help: &str) -> Vec<String> {
    let mut in_list = false;
    let mut v = vec![];
    for line in help.lines() {
        if line == "Commands:" {
            in_list = true;
            continue;
        }
        if in_list && !line.starts_with(' ') {
            in_list = false;
        }
        // A command's line starts at two spaces; its wrapped description deeper.
        if in_list
            && let Some(name) =
                line.strip_prefix("  ").filter(|l| !l.starts_with(' ')).and_then(|l| l.split_whitespace().next())
            && name != "help"
        {
            v.push(name.to_string());
        }
    }
    v
}

/// `sluice --help` and every subcommand's, at every depth, speak of the product: no work
/// item numbers, no seeds, no paper's working name.
#[test]
fn every_help_speaks_of_the_product() {
    let mut todo = vec![vec![]];
    let mut seen = 0;
    while let Some(args) = todo.pop() {
        let o = Command::new(BIN).args(&args).arg("--help").output().unwrap();
        assert!(o.status.success(), "sluice {args:?} --help failed: {o:?}");
        let help = String::from_utf8_lossy(&o.stdout);
        if let Some(r) = internal_reference(&help) {
            panic!("`sluice {} --help` makes an internal reference: {r}", args.join(" "));
        }
        seen += 1;
        assert!(seen < 500, "more than 500 help pages: a loop in the walk");
        for s in subcommands(&help) {
            let mut a = args.clone();
            a.push(s);
            todo.push(a);
        }
    }
    assert!(seen > 40, "only {seen} help pages found: the walk no longer reads clap's layout");
    // The listings a user reads beside --help, and the README and the config page.
    for args in [&["bench", "profiles"][..], &["study", "list"]] {
        let o = Command::new(BIN).args(args).output().unwrap();
        assert!(o.status.success(), "sluice {args:?}: {o:?}");
        if let Some(r) = internal_reference(&String::from_utf8_lossy(&o.stdout)) {
            panic!("`sluice {}` makes an internal reference: {r}", args.join(" "));
        }
    }
    // The built-in studies as `sluice study show` prints them (and their reports open with).
    let builtin = tree().join("crates/study/src/builtin");
    let studies = std::fs::read_dir(&builtin).unwrap().map(|e| e.unwrap().path());
    let pages = ["README.md", "docs/config.md"].map(|p| tree().join(p));
    for page in pages.into_iter().chain(studies) {
        let text = std::fs::read_to_string(&page).unwrap();
        if let Some(r) = internal_reference(&text) {
            panic!("{} makes an internal reference: {r}", page.display());
        }
    }
}

#[test]
fn the_reference_check_finds_what_it_is_for() {
    assert!(internal_reference("as in seed 004's figure").is_some());
    assert!(internal_reference("done (issue 13)").is_some());
    assert!(internal_reference("after zOVN's rule").is_some());
    assert!(internal_reference("sluice-l2-lossless-stream-zovn\nseeded 3 times, issue a command").is_none());
}

/// The README opens with the two set-up commands, names what they need, and shows the
/// example file as it is.
#[test]
fn the_readme_starts_with_two_commands_and_shows_the_example_as_it_is() {
    let readme = std::fs::read_to_string(tree().join("README.md")).unwrap();
    let blocks: Vec<&str> = readme.split("```").skip(1).step_by(2).collect();
    let first = blocks[0].strip_prefix("sh\n").expect("the first block is shell");
    assert!(first.contains("cargo install") && first.trim_end().ends_with("sluice demo"), "{first}");
    for pkg in ["clang", "libbpf-dev", "libpcap-dev", "iproute2", "iputils-ping"] {
        assert!(first.split_whitespace().any(|w| w == pkg), "the apt line installs {pkg}: {first}");
    }
    assert_eq!(blocks[1].strip_prefix("sh\n").map(str::trim), Some("scripts/test.sh"));
    let before = &readme[..readme.find("```").unwrap()];
    let rust = std::fs::read_to_string(tree().join("Cargo.toml")).unwrap();
    let version = rust.lines().find_map(|l| l.strip_prefix("rust-version = ")).unwrap().trim_matches('"');
    assert!(before.contains(&format!("Rust {version} or later")), "the README names the Rust the workspace needs");
    assert!(before.contains("rustup") && before.contains("Linux 6.6"), "and how to get it, and the kernel");
    let example = std::fs::read_to_string(tree().join("examples/sw0.toml")).unwrap();
    assert!(
        blocks.iter().any(|b| b.strip_prefix("toml\n") == Some(example.as_str())),
        "the README shows examples/sw0.toml as it is"
    );
}

/// A name that does not resolve is said to be one, not a server to start there.
#[test]
fn a_bench_server_name_that_does_not_resolve_is_said_to_be_one() {
    let o = Command::new(BIN)
        .args(["bench", "run", "--to", "no-such-host.invalid", "-m", "rr-200x1000", "--duration", "1"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{o:?}");
    assert!(err.contains("no-such-host.invalid") && err.contains("does not resolve"), "{err}");
    assert!(!err.contains("start it there"), "{err}");
}

/// A capture against a switch that is not running leaves an existing file as it was.
#[test]
fn a_capture_to_no_switch_leaves_the_file_alone() {
    init();
    let dir = mkdtemp("sluice-first-hour");
    let f = dir.join("keep.pcap");
    std::fs::write(&f, b"yesterday's capture").unwrap();
    let o = Command::new(BIN)
        .args(["capture", "--switch", "no-such-switch", "t1", "-w", f.to_str().unwrap()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let kept = std::fs::read(&f).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!o.status.success(), "{o:?}");
    assert_eq!(kept, b"yesterday's capture", "the file survives: {}", String::from_utf8_lossy(&o.stderr));
}

/// What the example's test made, removed even when it fails.
struct Made {
    switch: String,
    namespaces: Vec<String>,
    child: Option<Child>,
    dir: PathBuf,
}

impl Drop for Made {
    fn drop(&mut self) {
        let _ = sluice(&["switch", "stop", "--switch", &self.switch]);
        if let Some(c) = self.child.as_mut() {
            wait_for(10, || c.try_wait().is_ok_and(|s| s.is_some()));
            let _ = c.kill();
            let _ = c.wait();
        }
        // (The example's last steps removed them when it got that far.)
        for ns in self.namespaces.iter().filter(|ns| Path::new("/run/netns").join(ns).exists()) {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `cmd` with the example's names made this test's own: every whole word of `names`
/// (letters, digits, `-`, `_`) replaced.
fn substitute(cmd: &str, names: &[(&str, &str)]) -> String {
    let mut out = String::new();
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        out.push_str(names.iter().find(|(a, _)| a == word).map_or(word.as_str(), |(_, b)| b));
        word.clear();
    };
    for c in cmd.chars() {
        if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

/// examples/sw0.toml, run as its comments say (with this test's own names for the switch,
/// the namespaces and the TAPs): blue pings red over VLAN 10, through the access port and
/// the trunk. Also: a capture of a port the switch does not have leaves the file alone.
#[test]
#[ignore = "system tier: needs root (network namespaces, TAP devices), ip and ping; scripts/test.sh runs it"]
fn the_example_config_works_as_its_comments_say() {
    if !root() || !have("ip") || !have("ping") {
        return;
    }
    init();
    let u = unique("exmpl");
    let (sw, blue, red, tb, tr) = (u.clone(), format!("{u}b"), format!("{u}r"), format!("{u}tb"), format!("{u}tr"));
    let dir = mkdtemp("sluice-example");
    let mut made = Made { switch: sw.clone(), namespaces: vec![], child: None, dir: dir.clone() };
    let names = [("sw0", sw.as_str()), ("blue", &blue), ("red", &red), ("tap-blue", &tb), ("tap-red", &tr)];
    let example = std::fs::read_to_string(tree().join("examples/sw0.toml")).unwrap();
    // The file itself with the test's names: only quoted names are replaced.
    let mut cfg = example.clone();
    for (a, b) in [("tap-blue", &tb), ("tap-red", &tr), ("blue", &blue), ("red", &red), ("sw0", &sw)] {
        cfg = cfg.replace(&format!("\"{a}\""), &format!("\"{b}\""));
    }
    let file = dir.join("sw0.toml");
    std::fs::write(&file, &cfg).unwrap();
    let steps: Vec<&str> = example.lines().filter_map(|l| l.strip_prefix("#   ")).collect();
    assert!(steps.len() > 5, "the example's comments say how to try it: {example}");
    let bin = format!("{BIN} ");
    for step in steps {
        let cmd = substitute(&step.replace("examples/sw0.toml", "\u{1}"), &names)
            .replace('\u{1}', file.to_str().unwrap())
            .replacen("sluice ", &bin, 1);
        if let Some(ns) = cmd.strip_prefix("ip netns add ") {
            made.namespaces.push(ns.trim().to_string());
        }
        if let Some(run) = cmd.strip_suffix(" &") {
            // The switch in the background, as the comment says; the steps after it
            // need its TAPs, which exist once it answers.
            let log = std::fs::File::create(dir.join("switch.log")).unwrap();
            made.child = Some(
                Command::new("sh")
                    .args(["-c", &format!("exec {run}")])
                    .stdin(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .unwrap(),
            );
            assert!(
                wait_for(10, || sluice(&["port", "list", "--switch", &sw]).status.success()),
                "the example's switch did not start within 10 s: {}",
                std::fs::read_to_string(dir.join("switch.log")).unwrap_or_default()
            );
            // A capture of a port this switch does not have leaves an existing file alone.
            let keep = dir.join("keep.pcap");
            std::fs::write(&keep, b"kept").unwrap();
            let o = sluice(&["capture", "--switch", &sw, "no-such-port", "-w", keep.to_str().unwrap()]);
            assert!(!o.status.success() && std::fs::read(&keep).unwrap() == b"kept", "{o:?}");
            continue;
        }
        let o = Command::new("sh").args(["-c", &cmd]).stdin(Stdio::null()).output().unwrap();
        assert!(
            o.status.success(),
            "the example's step `{step}` (run as `{cmd}`) failed: {}{}\nswitch log: {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
            std::fs::read_to_string(dir.join("switch.log")).unwrap_or_default()
        );
        if cmd.contains(" ping ") {
            assert!(String::from_utf8_lossy(&o.stdout).contains(" 0% packet loss"), "{o:?}");
        }
    }
    // The steps stopped the switch and removed the namespaces; Made's drop finds nothing.
    assert!(
        wait_for(10, || made.child.as_mut().unwrap().try_wait().is_ok_and(|s| s.is_some())),
        "the example's switch did not stop at `sluice switch stop`"
    );
}
