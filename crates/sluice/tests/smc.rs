//! `sluice smc run`, the launcher of the shared-memory fast path: the preload library is
//! written out, loaded into the program and its children, and (while the fast path is
//! being built) leaves TCP exactly as it was; bad sizes are refused.

mod common;

use common::*;

#[test]
fn the_launcher_loads_the_library_into_the_program_and_its_children() {
    let maps = sluice_ok(&["smc", "run", "--", "sh", "-c", "cat /proc/self/maps; echo SLUICE_SMC=$SLUICE_SMC"]);
    assert!(maps.contains("/smc/lib/libsluice_smc-"), "the library is mapped in the child: {maps}");
    assert!(maps.contains("SLUICE_SMC=r="), "{maps}");
    // A second run reuses the file.
    let libs: Vec<_> = std::fs::read_dir(run_dir().join("smc/lib")).unwrap().flatten().collect();
    sluice_ok(&["smc", "run", "--", "true"]);
    assert_eq!(std::fs::read_dir(run_dir().join("smc/lib")).unwrap().count(), libs.len());
}

#[test]
fn tcp_through_the_library_arrives_intact() {
    let dir = std::env::temp_dir().join(format!("sluice-smc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("src");
    sh_ok(&format!("head -c 20000000 /dev/urandom > {}", src.display()));
    let want = sh_ok(&format!("sha256sum < {}", src.display()));
    let port = 30000 + (std::process::id() % 20000) as u16;
    let server = std::process::Command::new(BIN)
        .args(["smc", "run", "--", "sh", "-c", &format!("timeout 60 nc -l -N 127.0.0.1 {port} | sha256sum")])
        .env("SLUICE_RUN_DIR", run_dir())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_for(10, || sh_ok("ss -ltn").contains(&format!("127.0.0.1:{port}"))));
    sluice_ok(&[
        "smc",
        "run",
        "-r",
        "128k",
        "--",
        "sh",
        "-c",
        &format!("timeout 60 nc -N 127.0.0.1 {port} < {}", src.display()),
    ]);
    let out = server.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), want);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn sizes_out_of_range_and_missing_programs_are_refused() {
    let o = sluice(&["smc", "run", "-r", "8k", "--", "true"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("16k to 64m"), "{err}");
    let o = sluice(&["smc", "run", "--", "/nonexistent/program"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("cannot run /nonexistent/program"), "{err}");
}
