//! sluice installed like a system tool: `sluice man` and `sluice completion` from the real
//! binary, the pages rendered by groff and man-db, and the Debian package scripts/deb.sh
//! builds — its metadata, every file with root ownership and sane modes, its md5sums, and
//! its binary run from an extraction (`dpkg-deb -x`, which leaves the machine's dpkg
//! database alone). Installing it with apt on a clean machine takes a chroot and minutes:
//! scripts/check-deb.sh does that by hand (docs/install.md).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::*;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn ok(what: &str, o: Output) -> String {
    assert!(
        o.status.success(),
        "{what} failed ({}): {}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn run(prog: &str, args: &[&str]) -> Output {
    Command::new(prog).args(args).stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("running {prog}: {e}"))
}

/// The pages `sluice man --out DIR` wrote, by file name.
fn man_pages(dir: &Path) -> Vec<String> {
    let out = sluice_ok(&["man", "--out", dir.to_str().unwrap()]);
    let mut pages: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".1"))
        .collect();
    pages.sort();
    assert!(out.contains(&format!("wrote {} manual pages", pages.len())), "{out}");
    pages
}

#[test]
fn man_and_completion_come_from_the_binary() {
    let dir = scratch("man-pages");
    let pages = man_pages(&dir);
    for p in ["sluice.1", "sluice-port-add.1", "sluice-switch-run.1", "sluice-stats-reset.1", "sluice-man.1"] {
        assert!(pages.iter().any(|n| n == p), "no {p} among {pages:?}");
    }
    // Every page a command of `sluice --help` names has, with its commands' pages.
    let help = sluice_ok(&["--help"]);
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.len() > 10, "{help}");
    for c in &commands {
        assert!(pages.contains(&format!("sluice-{c}.1")), "no page for `sluice {c}`");
    }
    // Writing again replaces the pages in place.
    assert_eq!(man_pages(&dir), pages);

    for shell in ["bash", "zsh", "fish"] {
        let script = sluice_ok(&["completion", shell]);
        for c in &commands {
            assert!(script.contains(c), "the {shell} completion never names `sluice {c}`");
        }
    }
    let o = sluice(&["completion", "tcsh"]);
    assert_eq!(o.status.code(), Some(2), "a shell clap_complete lacks is a usage error: {o:?}");
}

#[test]
fn the_packaged_example_configuration_loads() {
    let dir = repo().join("docs/examples");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            sluice_api::config::load(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            n += 1;
        }
    }
    assert!(n > 0, "no example configuration in {}", dir.display());
}

#[test]
#[ignore = "system tier: needs groff and man-db; scripts/test.sh runs it"]
fn man_pages_render_without_warnings() {
    have("groff");
    have("man");
    have("bash");
    let dir = scratch("man-render");
    for page in man_pages(&dir) {
        let path = dir.join(&page);
        let o = run("groff", &["-man", "-Tutf8", "-ww", "-z", path.to_str().unwrap()]);
        ok(&format!("groff {page}"), o.clone());
        assert!(o.stderr.is_empty(), "groff warns about {page}:\n{}", String::from_utf8_lossy(&o.stderr));
    }
    let o = Command::new("man")
        .args(["-l", dir.join("sluice.1").to_str().unwrap()])
        .env("MANWIDTH", "80")
        // A locale every machine has: man-db warns on stderr about one that is not there.
        .env("LANG", "C.UTF-8")
        .env_remove("LC_ALL")
        .env_remove("MAN_KEEP_FORMATTING")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = ok("man -l sluice.1", o.clone());
    assert!(o.stderr.is_empty(), "man -l sluice.1 warns:\n{}", String::from_utf8_lossy(&o.stderr));
    for section in ["NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "FILES", "ENVIRONMENT", "EXIT STATUS", "SEE ALSO"] {
        assert!(text.lines().any(|l| l == section), "man sluice has no {section} section:\n{text}");
    }
    assert!(text.contains("sluice - a user-space virtual switch"), "{text}");
    // The bash completion is a script bash reads.
    let script = sluice_ok(&["completion", "bash"]);
    let path = dir.join("sluice.bash");
    std::fs::write(&path, script).unwrap();
    ok("bash -n on the completion", run("bash", &["-n", path.to_str().unwrap()]));
}

/// A package's control fields.
fn control(deb: &Path) -> BTreeMap<String, String> {
    let text = ok("dpkg-deb -f", run("dpkg-deb", &["-f", deb.to_str().unwrap()]));
    let mut fields = BTreeMap::new();
    let mut last = String::new();
    for l in text.lines() {
        if l.starts_with(' ') {
            fields.entry(last.clone()).and_modify(|v: &mut String| *v += &format!("\n{l}"));
        } else if let Some((k, v)) = l.split_once(": ") {
            last = k.to_string();
            fields.insert(last.clone(), v.to_string());
        }
    }
    fields
}

#[test]
#[ignore = "system tier: needs dpkg-dev (dpkg-deb, dpkg-shlibdeps), binutils and cargo; scripts/test.sh runs it"]
fn the_debian_package_holds_the_tool_and_its_pages() {
    for t in ["dpkg-deb", "dpkg-shlibdeps", "dpkg-architecture", "strip", "cargo", "md5sum"] {
        have(t);
    }
    let out = scratch("deb");
    // The binary under test, packaged as it is (`--no-build`), from its own target dir.
    let target = Path::new(BIN).parent().unwrap().parent().unwrap();
    let o = Command::new("bash")
        .arg(repo().join("scripts/deb.sh"))
        .args(["--no-build", "--out", out.to_str().unwrap()])
        .env("CARGO_TARGET_DIR", target)
        .env("DEBFULLNAME", "sluice tests")
        .env("DEBEMAIL", "root@localhost")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let printed = ok("scripts/deb.sh --no-build", o);
    let arch = ok("dpkg-architecture", run("dpkg-architecture", &["-qDEB_HOST_ARCH"])).trim().to_string();
    let version = env!("CARGO_PKG_VERSION");
    let deb = out.join(format!("sluice_{version}_{arch}.deb"));
    assert_eq!(printed.trim(), deb.to_str().unwrap());

    // Metadata.
    let f = control(&deb);
    assert_eq!(f["Package"], "sluice");
    assert_eq!(f["Version"], version);
    assert_eq!(f["Architecture"], arch);
    assert_eq!(f["Maintainer"], "sluice tests <root@localhost>");
    for dep in ["libc6 (>= ", "libpcap0.8", "iproute2"] {
        assert!(f["Depends"].contains(dep), "Depends lacks {dep}: {}", f["Depends"]);
    }
    assert!(f.contains_key("Recommends") && f.contains_key("Description"), "{f:?}");

    // Contents: every entry root's, with a directory's or a file's usual mode.
    let listing = ok("dpkg-deb -c", run("dpkg-deb", &["-c", deb.to_str().unwrap()]));
    let mut files = BTreeMap::new();
    let mut kib = 0u64;
    for l in listing.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        let (mode, owner, size, path) = (w[0], w[1], w[2].parse::<u64>().unwrap(), w[5]);
        assert_eq!(owner, "root/root", "{l}");
        let path = path.trim_start_matches('.');
        if path != "/" {
            kib += if mode.starts_with('-') { size.div_ceil(1024) } else { 1 };
        }
        match &mode[..1] {
            "d" => assert_eq!(mode, "drwxr-xr-x", "{l}"),
            "-" if path.starts_with("/usr/bin/") || path.starts_with("/usr/lib/cni/") => {
                assert_eq!(mode, "-rwxr-xr-x", "{l}")
            }
            "-" => assert_eq!(mode, "-rw-r--r--", "{l}"),
            _ => panic!("neither a directory nor a file: {l}"),
        }
        files.insert(path.to_string(), size);
    }
    assert_eq!(f["Installed-Size"], kib.to_string(), "Installed-Size is not what the files take");
    let mut want: Vec<String> = [
        "/usr/bin/sluice",
        "/usr/share/bash-completion/completions/sluice",
        "/usr/share/zsh/vendor-completions/_sluice",
        "/usr/share/fish/vendor_completions.d/sluice.fish",
        "/usr/share/doc/sluice/copyright",
        "/usr/share/doc/sluice/changelog.gz",
        "/usr/share/doc/sluice/README.md",
        "/usr/share/doc/sluice/config.md",
        "/usr/share/doc/sluice/install.md",
        "/usr/share/doc/sluice/examples/sw0.toml",
    ]
    .map(String::from)
    .to_vec();
    let pages = man_pages(&scratch("deb-man"));
    want.extend(pages.iter().map(|p| format!("/usr/share/man/man1/{p}.gz")));
    // The units and the CNI plugin when the checkout has them.
    if let Ok(rd) = std::fs::read_dir(repo().join("dist/systemd")) {
        for e in rd {
            let n = e.unwrap().file_name().into_string().unwrap();
            if n.ends_with(".service") {
                want.push(format!("/usr/lib/systemd/system/{n}"));
            }
        }
    }
    if repo().join("crates/cni/Cargo.toml").exists() && target.join("release/sluice-cni").exists() {
        want.push("/usr/lib/cni/sluice-cni".into());
    }
    for w in &want {
        assert!(files.get(w).is_some_and(|&s| s > 0), "the package lacks {w} (or it is empty):\n{listing}");
    }
    let shipped_pages = files.keys().filter(|p| p.starts_with("/usr/share/man/man1/") && p.ends_with(".1.gz")).count();
    assert_eq!(shipped_pages, pages.len(), "a page per command, and no other:\n{listing}");

    // Extracted: the md5sums hold, the binary runs, the pages and copyright read.
    let root = scratch("deb-root");
    let ctl = scratch("deb-control");
    ok("dpkg-deb -x", run("dpkg-deb", &["-x", deb.to_str().unwrap(), root.to_str().unwrap()]));
    ok("dpkg-deb -e", run("dpkg-deb", &["-e", deb.to_str().unwrap(), ctl.to_str().unwrap()]));
    // The maintainer scripts: executable (0755, as dpkg requires) and shell that sh parses.
    for script in ["postinst", "postrm"] {
        let p = ctl.join(script);
        if script == "postrm" || p.exists() {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode, 0o755, "{script}'s mode");
            ok(&format!("sh -n {script}"), run("sh", &["-n", p.to_str().unwrap()]));
        }
    }
    let sums = std::fs::read_to_string(ctl.join("md5sums")).unwrap();
    assert_eq!(sums.lines().count(), files.len() - files.keys().filter(|p| p.ends_with('/')).count());
    let o = Command::new("md5sum")
        .args(["--check", "--quiet"])
        .arg(ctl.join("md5sums"))
        .current_dir(&root)
        .output()
        .unwrap();
    ok("md5sum --check of the package's md5sums", o);
    let v = ok("the packaged sluice --version", run(root.join("usr/bin/sluice").to_str().unwrap(), &["--version"]));
    assert_eq!(v.trim(), format!("sluice {version}"));
    let page = root.join("usr/share/man/man1/sluice.1.gz");
    let text = ok("gzip -dc sluice.1.gz", run("gzip", &["-dc", page.to_str().unwrap()]));
    assert!(text.starts_with(".TH SLUICE 1") || text.contains("\n.TH SLUICE 1 "), "{text}");
    let copyright = std::fs::read_to_string(root.join("usr/share/doc/sluice/copyright")).unwrap();
    for needle in ["License: MIT or Apache-2.0", "License: MIT\n", "/usr/share/common-licenses/Apache-2.0", "clap v4"] {
        assert!(copyright.contains(needle), "copyright lacks {needle:?}:\n{copyright}");
    }
}
