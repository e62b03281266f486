//! Builds the preload library of `sluice smc run` and puts it inside the binary.
//!
//! `cargo install` installs executables only, so the binary carries the library and
//! writes it out when `sluice smc run` needs it (docs/architecture.md, "The shared-memory
//! fast path"). The library and the one crate it uses (`sluice-smc`, std only) are
//! compiled here with `$RUSTC` directly: no nested cargo, no registry.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let crates = manifest.parent().expect("crates/sluice has a parent").to_path_buf();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo"));
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let target = std::env::var("TARGET").expect("set by cargo");
    let dir = out.join("preload");
    std::fs::create_dir_all(&dir).expect("creating OUT_DIR/preload");
    for d in ["smc/src", "smc-preload/src"] {
        println!("cargo::rerun-if-changed={}", crates.join(d).display());
    }
    let common = |c: &mut Command| {
        c.args(["--edition", "2024", "--target", &target, "-C", "opt-level=3", "-C", "panic=unwind"]).args([
            "-C",
            "debuginfo=0",
            "-C",
            "strip=debuginfo",
            "--cap-lints",
            "allow",
        ]);
    };
    let mut smc = Command::new(&rustc);
    common(&mut smc);
    smc.args(["--crate-name", "sluice_smc", "--crate-type", "rlib", "--out-dir"])
        .arg(&dir)
        .arg(crates.join("smc/src/lib.rs"));
    run(smc, "sluice-smc");
    let lib = out.join("libsluice_smc.so");
    let mut preload = Command::new(&rustc);
    common(&mut preload);
    preload
        .args(["--crate-name", "sluice_smc_preload", "--crate-type", "cdylib", "-o"])
        .arg(&lib)
        .arg("--extern")
        .arg(format!("sluice_smc={}", dir.join("libsluice_smc.rlib").display()))
        .arg("-L")
        .arg(&dir)
        .env("CARGO_PKG_VERSION", std::env::var("CARGO_PKG_VERSION").unwrap_or_default())
        .arg(crates.join("smc-preload/src/lib.rs"));
    run(preload, "sluice-smc-preload");
    assert!(Path::new(&lib).exists(), "rustc wrote no {}", lib.display());
}

fn run(mut c: Command, what: &str) {
    let st = c.status().unwrap_or_else(|e| panic!("cannot run rustc for {what}: {e}"));
    assert!(st.success(), "compiling {what} for the preload library failed: {c:?}");
}
