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

/// Peers of one test: their own runtime directory (registry and statistics), so tests
/// running in parallel do not see each other.
struct Peers {
    dir: std::path::PathBuf,
}

impl Peers {
    fn new(tag: &str) -> Peers {
        let dir = run_dir().join(format!("smc-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Peers { dir }
    }

    fn cmd(&self, launcher: bool, args: &[&str]) -> std::process::Command {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/smc_peer.py");
        let mut c = if launcher {
            let mut c = std::process::Command::new(BIN);
            c.args(["smc", "run", "--", "python3", script]);
            c
        } else {
            let mut c = std::process::Command::new("python3");
            c.arg(script);
            c
        };
        c.args(args).env("SLUICE_RUN_DIR", &self.dir).stdin(std::process::Stdio::null());
        c
    }

    /// Starts a server and waits until it listens; returns it and a reader of its output.
    fn serve(
        &self,
        launcher: bool,
        args: &[&str],
    ) -> (std::process::Child, std::io::BufReader<std::process::ChildStdout>) {
        use std::io::BufRead;
        let mut c = self.cmd(launcher, args).stdout(std::process::Stdio::piped()).spawn().unwrap();
        let mut out = std::io::BufReader::new(c.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "listening", "server did not start");
        (c, out)
    }

    /// Runs a client to completion (at most 120 s) and returns its output.
    fn run(&self, launcher: bool, args: &[&str]) -> String {
        let mut c = self.cmd(launcher, args).stdout(std::process::Stdio::piped()).spawn().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while c.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = c.kill();
                panic!("client {args:?} hung");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "client {args:?} failed: {}", String::from_utf8_lossy(&o.stdout));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    fn stats(&self) -> serde_json::Value {
        let o = std::process::Command::new(BIN)
            .args(["smc", "stats", "--json"])
            .env("SLUICE_RUN_DIR", &self.dir)
            .output()
            .unwrap();
        assert!(o.status.success());
        serde_json::from_slice(&o.stdout).unwrap()
    }
}

fn rest(out: std::io::BufReader<std::process::ChildStdout>) -> String {
    use std::io::Read;
    let mut s = String::new();
    let mut out = out;
    out.read_to_string(&mut s).unwrap();
    s.trim().to_string()
}

fn port(n: u16) -> String {
    (20000 + (std::process::id() % 2000) as u16 * 10 + n).to_string()
}

#[test]
fn a_gigabyte_crosses_shared_memory_intact_each_way() {
    let p = Peers::new("gb");
    let (s, out) = p.serve(true, &["serve", &port(1), "sink"]);
    let sent = p.run(true, &["connect", "127.0.0.1", &port(1), "source:1000000000"]);
    let _ = s.wait_with_output();
    assert_eq!(rest(out), sent, "client → server");
    let (s, out) = p.serve(true, &["serve", &port(2), "source:1000000000"]);
    let got = p.run(true, &["connect", "127.0.0.1", &port(2), "sink"]);
    let _ = s.wait_with_output();
    assert_eq!(got, rest(out), "server → client");
    let st = p.stats();
    assert_eq!((st["smc_client"].as_u64(), st["smc_server"].as_u64()), (Some(2), Some(2)), "{st}");
    assert!(st["rx_bytes"].as_u64().unwrap() >= 2_000_000_000, "{st}");
}

#[test]
fn the_tcp_socket_itself_carries_no_payload() {
    let p = Peers::new("ss");
    let (s, out) = p.serve(true, &["serve", &port(3), "sink+hold:3"]);
    let c = p
        .cmd(true, &["connect", "127.0.0.1", &port(3), "source:50000000+hold:3"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // While both hold the connection open after 50 MB: what did TCP carry?
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let ss = sh_ok(&format!("ss -tinH state established '( sport = :{} )'", port(3)));
    let _ = c.wait_with_output();
    let _ = s.wait_with_output();
    // ss prints tcp_info on a second line and leaves out counters that are zero.
    assert!(ss.contains("segs_in:"), "the server-side connection and its tcp_info: {ss}");
    let n: u64 =
        ss.split_whitespace().find_map(|w| w.strip_prefix("bytes_received:")).map_or(0, |v| v.parse().unwrap());
    assert!(n < 4096, "the TCP socket received {n} bytes of payload: {ss}");
    assert!(rest(out).starts_with("50000000 "), "the data went through shared memory");
}

#[test]
fn without_a_peer_under_the_launcher_the_connection_stays_on_tcp() {
    let p = Peers::new("fb");
    // Client under the launcher, plain server: no listener registered.
    let (s, out) = p.serve(false, &["serve", &port(4), "sink"]);
    let sent = p.run(true, &["connect", "127.0.0.1", &port(4), "source:3000000"]);
    let _ = s.wait_with_output();
    assert_eq!(rest(out), sent);
    // Server under the launcher, plain client: no proposal comes.
    let (s, out) = p.serve(true, &["serve", &port(5), "sink"]);
    let sent = p.run(false, &["connect", "127.0.0.1", &port(5), "source:3000000"]);
    let _ = s.wait_with_output();
    assert_eq!(rest(out), sent);
    let st = p.stats();
    assert_eq!(st["fallback_client"]["no_listener"], 1, "{st}");
    assert_eq!(st["fallback_server"]["no_proposal"], 1, "{st}");
    assert_eq!(st["smc_client"], 0, "{st}");
}

#[test]
fn many_small_writes_arrive_complete_and_in_order() {
    let p = Peers::new("small");
    let (s, out) = p.serve(true, &["serve", &port(6), "sink"]);
    let sent = p.run(true, &["connect", "127.0.0.1", &port(6), "small:200000"]);
    let _ = s.wait_with_output();
    assert_eq!(rest(out), sent);
    assert_eq!(p.stats()["smc_client"], 1);
}

#[test]
fn a_killed_peer_ends_the_transfer_without_a_hang() {
    let p = Peers::new("kill");
    // The reader dies: the writer's next writes fail.
    let (mut s, _out) = p.serve(true, &["serve", &port(7), "sink"]);
    let c = p
        .cmd(true, &["connect", "127.0.0.1", &port(7), "forever"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(800));
    s.kill().unwrap();
    let _ = s.wait();
    let o = wait_or_kill(c, 20);
    assert!(o.contains("BrokenPipeError") || o.contains("ConnectionResetError"), "writer saw: {o:?}");
    // The writer dies: the reader sees the end of the stream.
    let (mut s, _out) = p.serve(true, &["serve", &port(8), "source:100000000000"]);
    let c =
        p.cmd(true, &["connect", "127.0.0.1", &port(8), "sink"]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(800));
    s.kill().unwrap();
    let _ = s.wait();
    let o = wait_or_kill(c, 20);
    let n: u64 = o.split_whitespace().next().and_then(|x| x.parse().ok()).unwrap_or(0);
    assert!(n > 0 && n < 100_000_000_000, "reader saw: {o:?}");
}

fn wait_or_kill(mut c: std::process::Child, secs: u64) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while c.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = c.kill();
            panic!("the surviving peer hung");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    String::from_utf8_lossy(&c.wait_with_output().unwrap().stdout).trim().to_string()
}

#[test]
fn an_epoll_server_serves_250_connections_on_shared_memory() {
    let p = Peers::new("epoll");
    let (s, out) = p.serve(true, &["echo-epoll", &port(9), "250"]);
    let got = p.run(true, &["many", "127.0.0.1", &port(9), "250"]);
    assert_eq!(got, "ok 250");
    let _ = s.wait_with_output();
    assert_eq!(rest(out), "echoed 250");
    let st = p.stats();
    assert_eq!((st["smc_client"].as_u64(), st["smc_server"].as_u64()), (Some(250), Some(250)), "{st}");
}

#[test]
fn a_connection_survives_fork_after_connect() {
    let p = Peers::new("fork");
    let (s, out) = p.serve(true, &["serve", &port(0), "sink"]);
    assert_eq!(p.run(true, &["connect", "127.0.0.1", &port(0), "fork"]), "forked");
    let _ = s.wait_with_output();
    let want = sh_ok("printf 'child\\nparent\\n' | sha256sum | cut -d' ' -f1");
    assert_eq!(rest(out), format!("13 {}", want.trim()));
    assert_eq!(p.stats()["smc_client"], 1);
}
