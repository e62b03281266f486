//! `sluice smc run`, the launcher of the shared-memory fast path: the preload library is
//! written out, loaded into the program and its children, and (while the fast path is
//! being built) leaves TCP exactly as it was; bad sizes are refused.

mod common;

use common::smc::*;
use common::*;

#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root); scripts/test.sh runs it"]
fn the_launcher_loads_the_library_into_the_program_and_its_children() {
    root_for("`sluice smc run` sets the fast path up only as root");
    let maps = sluice_ok(&["smc", "run", "--", "sh", "-c", "cat /proc/self/maps; echo SLUICE_SMC=$SLUICE_SMC"]);
    assert!(maps.contains("/smc/lib/libsluice_smc-"), "the library is mapped in the child: {maps}");
    assert!(maps.contains("SLUICE_SMC=r="), "{maps}");
    // A second run reuses the file.
    let libs: Vec<_> = std::fs::read_dir(run_dir().join("smc/lib")).unwrap().flatten().collect();
    sluice_ok(&["smc", "run", "--", "true"]);
    assert_eq!(std::fs::read_dir(run_dir().join("smc/lib")).unwrap().count(), libs.len());
}

#[test]
#[ignore = "system tier: needs nc (netcat-openbsd) and ss (iproute2); scripts/test.sh runs it"]
fn tcp_through_the_library_arrives_intact() {
    let dir = mkdtemp("sluice-smc");
    let src = dir.join("src");
    sh_ok(&format!("head -c 20000000 /dev/urandom > {}", src.display()));
    let want = sh_ok(&format!("sha256sum < {}", src.display()));
    // From the kernel, kept for this test (common::smc::port).
    let port = port(47);
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

#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
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
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn the_tcp_socket_itself_carries_no_payload_and_info_lists_the_connection() {
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
    let info =
        std::process::Command::new(BIN).args(["smc", "info", "--json"]).env("SLUICE_RUN_DIR", &p.dir).output().unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    let _ = c.wait_with_output();
    let _ = s.wait_with_output();
    // ss prints tcp_info on a second line and leaves out counters that are zero.
    assert!(ss.contains("segs_in:"), "the server-side connection and its tcp_info: {ss}");
    let n: u64 =
        ss.split_whitespace().find_map(|w| w.strip_prefix("bytes_received:")).map_or(0, |v| v.parse().unwrap());
    assert!(n < 4096, "the TCP socket received {n} bytes of payload: {ss}");
    assert!(rest(out).starts_with("50000000 "), "the data went through shared memory");
    // `sluice smc info` listed both ends while they lived, and nothing after.
    let roles: Vec<&str> = info.as_array().unwrap().iter().filter_map(|v| v["role"].as_str()).collect();
    assert_eq!(roles.len(), 2, "{info}");
    assert!(roles.contains(&"client") && roles.contains(&"server"), "{info}");
    assert!(info[0]["local"].as_str().unwrap().starts_with("127.0.0.1:"), "{info}");
    let after =
        std::process::Command::new(BIN).args(["smc", "info", "--json"]).env("SLUICE_RUN_DIR", &p.dir).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&after.stdout).trim(), "[]");
}

#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
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
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn many_small_writes_arrive_complete_and_in_order() {
    let p = Peers::new("small");
    let (s, out) = p.serve(true, &["serve", &port(6), "sink"]);
    let sent = p.run(true, &["connect", "127.0.0.1", &port(6), "small:200000"]);
    let _ = s.wait_with_output();
    assert_eq!(rest(out), sent);
    assert_eq!(p.stats()["smc_client"], 1);
}

#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn a_blocking_reader_that_slept_leaves_its_socket_pollable() {
    // The reader's blocking reads sleep on the ring's futex between bursts (the writer
    // wakes it without a doorbell when the bytes fit its buffer); whenever bytes are left
    // waiting after a read, poll must still say readable.
    let p = Peers::new("nibble");
    let (s, out) = p.serve(true, &["serve", &port(13), "bursts:3000"]);
    let got = p.run(true, &["connect", "127.0.0.1", &port(13), "nibble"]);
    let _ = s.wait_with_output();
    assert_eq!(rest(out), got);
    assert_eq!(p.stats()["smc_client"], 1);
}

#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
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
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
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

/// An epoll event loop looks at the rings of the connections it registered itself: bytes
/// that arrive while it is awake ring no doorbell, and it finds them before it sleeps.
/// Whatever else then waits on such a connection — a one-event epoll wait beside an
/// always-ready descriptor, `epoll_pwait2`, `poll`, `ppoll`, `select`, `pselect`, a
/// blocking read — meets every message, and none of it is told "readable" for nothing.
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn an_event_loop_finds_bytes_on_its_rings_and_other_waits_still_see_every_message() {
    let p = Peers::new("looks");
    let loops = "epoll/epoll/epoll/epoll/epoll/epoll";
    let modes: Vec<String> = [
        "epoll1/epoll1/epoll1/epoll1",
        "epoll2/epoll2/epoll2/epoll2",
        "poll/epoll/poll",
        "ppoll/epoll/ppoll",
        "select/epoll/select",
        "pselect/epoll/pselect",
        "recv/epoll/recv",
    ]
    .iter()
    .map(|then| format!("echo-waits:{loops}/{then}/{loops}"))
    .collect();
    let (s, out) = p.serve(true, &["serve-seq", &port(10), &modes.join(",")]);
    let counts: Vec<usize> = modes.iter().map(|m| m.matches('/').count() + 1).collect();
    for n in &counts {
        assert_eq!(p.run(true, &["connect", "127.0.0.1", &port(10), &format!("pings:{n}")]), format!("answered {n}"));
    }
    let _ = s.wait_with_output();
    let want: Vec<String> = counts.iter().map(|n| format!("echoed {n}")).collect();
    assert_eq!(rest(out), want.join("\n"));
    let st = p.stats();
    let n = Some(modes.len() as u64);
    assert_eq!((st["smc_client"].as_u64(), st["smc_server"].as_u64()), (n, n), "{st}");
    assert!(st["ring_events"].as_u64() > Some(0), "bytes found on the rings without a doorbell: {st}");
    assert!(st["doorbells"].as_u64() > Some(0), "and doorbells for the waits that sleep: {st}");

    // `--doorbells`: the same exchanges, every wake-up a doorbell.
    let q = Peers::new("looksoff");
    let off = ["--doorbells"];
    let (s, out) = q.serve_cmd(launched_with(&q, &off, &["python3", PEER, "serve", &port(10), &modes[0]]));
    let n = counts[0].to_string();
    let pings = format!("pings:{n}");
    let client = launched_with(&q, &off, &["python3", PEER, "connect", "127.0.0.1", &port(10), &pings]);
    assert_eq!(q.run_cmd(client), format!("answered {n}"));
    let _ = s.wait_with_output();
    assert_eq!(rest(out), format!("echoed {n}"));
    let st = q.stats();
    assert_eq!(st["smc_server"], 1, "{st}");
    assert_eq!(st["ring_events"], 0, "nothing from the rings: {st}");
}

#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn a_connection_survives_fork_after_connect() {
    let p = Peers::new("fork");
    let (s, out) = p.serve(true, &["serve", &port(0), "sink"]);
    assert_eq!(p.run(true, &["connect", "127.0.0.1", &port(0), "fork"]), "forked");
    let _ = s.wait_with_output();
    let want = sh_ok("printf 'child\\nparent\\n' | sha256sum | cut -d' ' -f1");
    assert_eq!(rest(out), format!("13 {}", want.trim()));
    assert_eq!(p.stats()["smc_client"], 1);
}

#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn a_forked_child_and_its_parent_writing_at_once_take_turns() {
    // Both processes push into the same ring at the same time: the shared writers' lock
    // keeps every 64-byte write whole, and nothing is lost.
    let p = Peers::new("forkrace");
    let (s, out) = p.serve(true, &["serve", &port(14), "records"]);
    assert_eq!(p.run(true, &["connect", "127.0.0.1", &port(14), "fork-race:20000"]), "raced");
    let _ = s.wait_with_output();
    assert_eq!(rest(out), "P 20000 C 20000 bad 0");
    assert_eq!(p.stats()["smc_client"], 1);
}

/// Whatever step fails — the client's announcement never sent, or the server declining
/// in its `accept` after the client has written (its bytes sit in the ring and go onto TCP
/// instead) — the connection carries exactly the application's bytes over TCP.
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn a_handshake_broken_at_any_step_leaves_the_connection_on_tcp_intact() {
    let p = Peers::new("fault");
    for (i, (side, step, client_reason)) in
        [("client", "client-no-announce", "door_unreachable"), ("server", "server-decline", "peer_declined")]
            .into_iter()
            .enumerate()
    {
        sluice_ok_in(&p, &["smc", "stats", "reset"]);
        let port = port(10 + i as u16);
        let mut s = p.cmd(true, &["serve", &port, "sink"]);
        let mut c = p.cmd(true, &["connect", "127.0.0.1", &port, "source:2000000"]);
        if side == "client" {
            c.env("SLUICE_SMC_FAULT", step);
        } else {
            s.env("SLUICE_SMC_FAULT", step);
        }
        let (srv, out) = p.serve_cmd(s);
        let sent = p.run_cmd(c);
        let _ = srv.wait_with_output();
        assert_eq!(rest(out), sent, "{step}: the data arrived whole over TCP");
        let st = p.stats();
        assert_eq!((st["smc_client"].as_u64(), st["smc_server"].as_u64()), (Some(0), Some(0)), "{step}: {st}");
        assert_eq!(st["fallback_client"][client_reason], 1, "{step}: {st}");
        // The server's accept counted why it kept TCP.
        assert!(fallbacks(&st, "fallback_server") >= 1, "{step}: {st}");
        assert!(st["handshake_errors"].as_u64().unwrap() >= 1, "{step}: {st}");
    }
}

/// A program under `sluice smc run`, with the peers' run directory, stdin closed.
fn launched(p: &Peers, args: &[&str]) -> std::process::Command {
    launched_with(p, &[], args)
}

/// As [`launched`], with options of `sluice smc run`.
fn launched_with(p: &Peers, opts: &[&str], args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new(BIN);
    c.args(["smc", "run"]).args(opts).arg("--").args(args);
    c.env("SLUICE_RUN_DIR", &p.dir).stdin(std::process::Stdio::null());
    c
}

#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), iperf3, sockperf and python3; scripts/test.sh runs it"]
fn iperf3_and_sockperf_run_on_shared_memory_under_the_launcher() {
    if !have("iperf3") || !have("sockperf") {
        eprintln!("skipped: needs iperf3 and sockperf");
        return;
    }
    let p = Peers::new("tools");
    let run = |args: &[&str]| launched(&p, args);
    let iport = port(20);
    // Each way, plain and with -Z (sendfile from a file): every variant moves its bytes
    // (with -Z the bytes once went into the doorbell and nothing arrived).
    for extra in [&[][..], &["-R"], &["-Z"], &["-Z", "-R"]] {
        let mut srv = run(&["iperf3", "-s", "-1", "-p", &iport]).stdout(std::process::Stdio::null()).spawn().unwrap();
        assert!(wait_for(10, || sh_ok("ss -ltn").contains(&format!(":{iport} "))));
        let mut args = vec!["timeout", "60", "iperf3", "-c", "127.0.0.1", "-p", &iport, "-t", "2", "-J"];
        args.extend_from_slice(extra);
        let o = run(&args).output().unwrap();
        assert!(o.status.success(), "iperf3 {extra:?}: {}", String::from_utf8_lossy(&o.stdout));
        let _ = srv.wait();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let got = v["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
        assert!(got > 50_000_000, "iperf3 {extra:?} received {got} bytes");
    }
    let st = p.stats();
    assert!(st["smc_client"].as_u64().unwrap() >= 8, "iperf3's control and data connections: {st}");
    assert!(st["tx_bytes"].as_u64().unwrap() > 200_000_000, "{st}");
    sluice_ok_in(&p, &["smc", "stats", "reset"]);
    let sport = port(21);
    let srv = Killed(
        run(&["sockperf", "sr", "--tcp", "-i", "127.0.0.1", "-p", &sport])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(10, || sh_ok("ss -ltn").contains(&format!(":{sport} "))));
    let o =
        run(&["sockperf", "pp", "--tcp", "-i", "127.0.0.1", "-p", &sport, "-m", "200", "-t", "3"]).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && text.contains("Summary: Latency is"), "{text}");
    drop(srv);
    let st = p.stats();
    assert_eq!((st["smc_client"].as_u64(), st["smc_server"].as_u64()), (Some(1), Some(1)), "{st}");
}

#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices), python3; scripts/test.sh runs it"]
fn programs_in_two_namespaces_meet_on_shared_memory_through_a_switch() {
    if !root() {
        return;
    }
    let lab = Lab::up("smcns", &["--guests", "2"]);
    let p = Peers::new("ns");
    let port = port(30);
    let (s, out) = p.serve_cmd(p.cmd_in(Some(&lab.ns(2)), true, &["serve", &port, "sink", "10.77.0.2"]));
    let sent = p.run_cmd(p.cmd_in(Some(&lab.ns(1)), true, &["connect", "10.77.0.2", &port, "source:100000000"]));
    let _ = s.wait_with_output();
    assert_eq!(rest(out), sent);
    let st = p.stats();
    assert_eq!((st["smc_client"].as_u64(), st["smc_server"].as_u64()), (Some(1), Some(1)), "{st}");
    // The switch carried the TCP handshake and teardown, not the 100 MB.
    let g2 = lab.port(&lab.tap(2));
    assert!(g2["counters"]["tx_bytes"].as_u64().unwrap() < 1_000_000, "{g2}");
}

#[test]
#[ignore = "system tier: needs root (network namespaces and TAP devices), python3; scripts/test.sh runs it"]
fn a_plain_listener_with_the_same_address_elsewhere_never_sees_a_handshake_byte() {
    if !root() {
        return;
    }
    let lab = Lab::up("smcpl", &["--guests", "2"]);
    let p = Peers::new("plain");
    // A sluice listener on 10.77.0.2 in a namespace of its own, which g1 cannot reach.
    struct Ns(String);
    impl Drop for Ns {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let other = Ns(format!("sluice-{}-other", lab.name));
    sh_ok(&format!("ip netns add {0} && ip -n {0} link set lo up && ip -n {0} addr add 10.77.0.2/32 dev lo", other.0));
    let port = port(31);
    let (decoy, _decoy_out) = p.serve_cmd(p.cmd_in(Some(&other.0), true, &["serve", &port, "sink", "10.77.0.2"]));
    let decoy = Killed(decoy);
    // The plain listener g1 really reaches.
    let (s, out) = p.serve_cmd(p.cmd_in(Some(&lab.ns(2)), false, &["serve", &port, "sink", "10.77.0.2"]));
    let sent = p.run_cmd(p.cmd_in(Some(&lab.ns(1)), true, &["connect", "10.77.0.2", &port, "source:1000000"]));
    let _ = s.wait_with_output();
    assert_eq!(rest(out), sent, "the plain listener got exactly the application's bytes");
    drop(decoy);
    let st = p.stats();
    assert_eq!(st["smc_client"], 0, "{st}");
    assert_eq!(st["fallback_client"]["peer_declined"], 1, "{st}");
    assert_eq!(st["fallback_server"]["not_our_connection"], 1, "{st}");
}

/// A pre-forking server: the parent listens (its door takes the proposals), children
/// accept and claim each connection from the parent over its claim channel — with a
/// blocking `accept`, and with several workers polling a non-blocking listener at once,
/// as nginx's do. Every connection moves, every byte arrives, nobody waits.
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn a_pre_forking_servers_children_take_their_connections_onto_shared_memory() {
    let p = Peers::new("prefork");
    let (s, out) = p.serve(true, &["serve-forked", &port(32), "127.0.0.1", "2"]);
    let first = p.run(true, &["connect", "127.0.0.1", &port(32), "source:2000000"]);
    let second = p.run(true, &["connect", "127.0.0.1", &port(32), "source:1000"]);
    let _ = s.wait_with_output();
    assert_eq!(rest(out), format!("{first}\n{second}"));
    let st = p.stats();
    assert_eq!((st["smc_client"].as_u64(), st["smc_server"].as_u64()), (Some(2), Some(2)), "{st}");
    assert_eq!(st["handshake_errors"], 0, "{st}");

    // Three workers, six clients at once.
    sluice_ok_in(&p, &["smc", "stats", "reset"]);
    let (s, out) = p.serve(true, &["serve-workers", &port(49), "3", "6"]);
    let clients: Vec<_> = (0..6)
        .map(|i| {
            let cmd = p.cmd(true, &["connect", "127.0.0.1", &port(49), &format!("source:{}", 100_000 * (i + 1))]);
            std::thread::spawn(move || Peers::run_cmd_static(cmd))
        })
        .collect();
    let mut sent: Vec<String> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let _ = s.wait_with_output();
    let mut got: Vec<String> = rest(out).lines().map(str::to_string).collect();
    sent.sort();
    got.sort();
    assert_eq!(got, sent, "every worker's connection arrived whole");
    let st = p.stats();
    assert_eq!((st["smc_client"].as_u64(), st["smc_server"].as_u64()), (Some(6), Some(6)), "{st}");
    assert_eq!(st["handshake_errors"], 0, "{st}");
}

/// A child forked after its parent started a side door listens on a port of its own: it
/// gets a door of its own (threads do not survive fork; before, it had none, and its
/// clients found no door to propose to).
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn a_forked_child_listening_on_its_own_port_has_a_side_door_of_its_own() {
    let p = Peers::new("childlisten");
    let (s, out) = p.serve(true, &["serve-in-child", &port(48), "sink"]);
    let sent = p.run(true, &["connect", "127.0.0.1", &port(48), "source:3000000"]);
    let _ = s.wait_with_output();
    assert_eq!(rest(out), sent);
    let st = p.stats();
    assert_eq!((st["smc_client"].as_u64(), st["smc_server"].as_u64()), (Some(1), Some(1)), "{st}");
}

/// A program's side door and listener entries: gone when it exits normally; left when a
/// signal kills it, and then swept by the next `sluice smc run` (issue 15).
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn doors_and_listener_entries_go_at_exit_and_a_killed_programs_are_swept_at_the_next_launch() {
    let p = Peers::new("sweep");
    let smc = p.dir.join("smc");
    let entries = || -> Vec<String> {
        ["door", "listen", "conn"]
            .iter()
            .flat_map(|d| std::fs::read_dir(smc.join(d)).into_iter().flatten().flatten())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    };
    // A clean exit: one connection served, then the program returns.
    let port1 = port(35);
    let (s, out) = p.serve(true, &["serve", &port1, "sink"]);
    assert!(!entries().is_empty(), "a listening program has a door and an entry");
    p.run(true, &["connect", "127.0.0.1", &port1, "source:1000"]);
    let mut s = s;
    let _ = s.wait();
    drop(out);
    assert!(entries().is_empty(), "left at a normal exit: {:?}", entries());
    // Killed by SIGTERM: nothing of its own runs, its entries stay...
    let port2 = port(36);
    let (mut s, _out) = p.serve(true, &["serve", &port2, "sink"]);
    let pid = s.id().to_string();
    assert!(entries().iter().any(|e| e.starts_with(&pid) || e.ends_with(&format!(".{pid}"))), "{:?}", entries());
    let _ = std::process::Command::new("kill").args(["-TERM", &pid]).status();
    let _ = s.wait();
    assert!(!entries().is_empty(), "a killed program cannot remove its own entries");
    // ...until the next program starts under the launcher.
    let o = std::process::Command::new(BIN)
        .args(["smc", "run", "--", "true"])
        .env("SLUICE_RUN_DIR", &p.dir)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(entries().is_empty(), "not swept: {:?}", entries());
    // A program that handles SIGTERM itself (`sluice bench serve` waits for it in one
    // thread, the others block it) exits cleanly: the library's own threads never take
    // the signal from it.
    let port3 = port(37);
    let mut s = Killed(
        std::process::Command::new(BIN)
            .args(["smc", "run", "--", BIN, "bench", "serve", "--listen", "127.0.0.1", "--port", &port3])
            .env("SLUICE_RUN_DIR", &p.dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(10, || entries().len() == 2), "{:?}", entries());
    let _ = std::process::Command::new("kill").args(["-TERM", &s.0.id().to_string()]).status();
    assert!(wait_for(10, || matches!(s.0.try_wait(), Ok(Some(_)))), "bench serve did not stop on SIGTERM");
    assert!(entries().is_empty(), "left by a program that exits on SIGTERM: {:?}", entries());
}

/// sendfile(2), splice(2) both ways, FIONREAD, sendmmsg/recvmmsg and many-buffer sendmsg
/// on moved sockets: every byte through the rings (before, sendfile and splice wrote into the doorbell socket pair: the peer
/// read nothing, or another request's bytes).
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn sendfile_splice_fionread_and_mmsg_move_the_bytes_through_the_rings() {
    let p = Peers::new("sf");
    // sendfile from a file, at offsets and at the file's position.
    let (s, out) = p.serve(true, &["serve", &port(40), "sendfile:30000000"]);
    let got = p.run(true, &["connect", "127.0.0.1", &port(40), "sink"]);
    let _ = s.wait_with_output();
    let sent = rest(out);
    assert!(sent.starts_with("30000000 "), "{sent}");
    assert_eq!(got, sent, "sendfile");
    // splice from a pipe into the socket, and from the socket into a pipe.
    let (s, out) = p.serve(true, &["serve", &port(41), "splice-out"]);
    let sent = p.run(true, &["connect", "127.0.0.1", &port(41), "splice-in:20000000"]);
    let _ = s.wait_with_output();
    assert!(sent.starts_with("20000000 "), "{sent}");
    assert_eq!(rest(out), sent, "splice");
    // FIONREAD counts the bytes in the ring, not the doorbell's.
    let (s, out) = p.serve(true, &["serve", &port(42), "fionread"]);
    let sent = p.run(true, &["connect", "127.0.0.1", &port(42), "source:1000+hold:1"]);
    let _ = s.wait_with_output();
    assert_eq!(rest(out), format!("fionread 1000\n{sent}"));
    // sendmmsg(2) and recvmmsg(2).
    let (s, out) = p.serve(true, &["serve", &port(43), "mmsg-sink"]);
    let sent = p.run(true, &["connect", "127.0.0.1", &port(43), "mmsg:20000"]);
    let _ = s.wait_with_output();
    assert!(sent.starts_with("2000000 "), "{sent}");
    assert_eq!(rest(out), sent, "sendmmsg/recvmmsg");
    // sendmsg(2) of several buffers (writev's path), past the ring's size.
    let (s, out) = p.serve(true, &["serve", &port(44), "sink"]);
    let sent = p.run(true, &["connect", "127.0.0.1", &port(44), "vec:300"]);
    let _ = s.wait_with_output();
    assert!(sent.starts_with("19530300 "), "{sent}");
    assert_eq!(rest(out), sent, "sendmsg of five buffers");
    // recv(MSG_TRUNC) throws bytes away without touching the buffer; the rest follows.
    let (s, out) = p.serve(true, &["serve", &port(12), "trunc:300+sink"]);
    let _ = p.run(true, &["connect", "127.0.0.1", &port(12), "source:1000+hold:1"]);
    let _ = s.wait_with_output();
    let got = rest(out);
    assert!(got.starts_with("trunc 300\n700 "), "{got}");
    let st = p.stats();
    assert_eq!((st["smc_client"].as_u64(), st["smc_server"].as_u64()), (Some(6), Some(6)), "{st}");
}

/// Real programs, both ends under the launcher: redis-server with redis-benchmark at 50
/// connections and a value written and read back with redis-cli; socat moving 200 MB
/// (sha256 compared). Every connection on shared memory, none on TCP.
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3, redis and socat; scripts/test.sh runs it"]
fn redis_and_socat_run_on_shared_memory_under_the_launcher() {
    if !have("redis-server") || !have("redis-benchmark") || !have("socat") {
        eprintln!("skipped: needs redis-server, redis-tools and socat");
        return;
    }
    let p = Peers::new("real");
    let run = |args: &[&str]| launched(&p, args);
    let rport = port(45);
    let _redis = Killed(
        run(&["redis-server", "--port", &rport, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(10, || sh_ok("ss -ltn").contains(&format!(":{rport} "))));
    let o = run(&["timeout", "120", "redis-benchmark", "-p", &rport, "-t", "set,get", "-n", "20000", "-c", "50", "-q"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && text.contains("GET:") && text.contains("requests per second"), "{text}");
    let o = run(&["redis-cli", "-p", &rport, "set", "sluice", "on-shared-memory"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "OK");
    let o = run(&["redis-cli", "-p", &rport, "get", "sluice"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "on-shared-memory");
    let st = p.stats();
    let moved = st["smc_client"].as_u64().unwrap();
    assert!(moved >= 52, "redis-benchmark's 50 connections and redis-cli's: {st}");
    assert_eq!(st["smc_server"].as_u64(), Some(moved), "{st}");

    // socat: 200 MB from a file to a file.
    let dir = p.dir.join("socat");
    std::fs::create_dir_all(&dir).unwrap();
    let (src, dst) = (dir.join("src"), dir.join("dst"));
    sh_ok(&format!("head -c 200000000 /dev/urandom > {}", src.display()));
    let sport = port(46);
    let server =
        run(&["socat", "-u", &format!("TCP-LISTEN:{sport},bind=127.0.0.1"), &format!("CREATE:{}", dst.display())])
            .spawn()
            .unwrap();
    let server = Killed(server);
    assert!(wait_for(10, || sh_ok("ss -ltn").contains(&format!(":{sport} "))));
    let o =
        run(&["timeout", "120", "socat", "-u", &format!("FILE:{}", src.display()), &format!("TCP:127.0.0.1:{sport}")])
            .output()
            .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut server = server;
    assert!(wait_for(30, || server.0.try_wait().unwrap().is_some()), "socat's server did not finish after its client");
    let sums = sh_ok(&format!("sha256sum {} {} | cut -d' ' -f1 | uniq | wc -l", src.display(), dst.display()));
    assert_eq!(sums.trim(), "1", "socat's 200 MB arrived intact");
    let st2 = p.stats();
    assert_eq!(st2["smc_client"].as_u64(), Some(moved + 1), "{st2}");
    let _ = std::fs::remove_dir_all(dir);
}

/// nginx as installed, with its default layout (a master that listens and workers — run as
/// another user — that accept, `sendfile on`) under the launcher: a 100 MB file to curl
/// intact, 1 KB files to ab (which counts any body of the wrong length as failed), and a
/// pipelined client whose every body is checked; every connection on shared memory.
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3, nginx, curl and ab; scripts/test.sh runs it"]
fn nginx_with_its_default_layout_serves_on_shared_memory() {
    if !have("nginx") || !have("curl") || !have("ab") {
        eprintln!("skipped: needs nginx, curl and ab (apache2-utils)");
        return;
    }
    let p = Peers::new("nginx");
    let dir = p.dir.join("nginx");
    let www = dir.join("www");
    std::fs::create_dir_all(&www).unwrap();
    sh_ok(&format!("head -c 100000000 /dev/urandom > {0}/big && head -c 1024 /dev/urandom > {0}/small", www.display()));
    // Bodies of different sizes for the pipelined client: a body served for the wrong
    // request, or cut, shows.
    let sizes = [1, 700, 5000, 70_000, 300_000, 1_000_000];
    for (i, n) in sizes.iter().enumerate() {
        sh_ok(&format!("head -c {n} /dev/urandom > {}/p{i}", www.display()));
    }
    // The workers run as `nobody`: they must reach the files.
    sh_ok(&format!("chmod -R a+rX {}", p.dir.display()));
    let port = port(38);
    // Debian's nginx.conf, less what needs the system's paths: the master and its
    // workers (`worker_processes auto`), sendfile, tcp_nopush and keep-alive as shipped.
    let conf = dir.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nworker_processes auto;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
             events {{ worker_connections 768; }}\n\
             http {{\n sendfile on;\n tcp_nopush on;\n types_hash_max_size 2048;\n access_log off;\n\
             client_body_temp_path {d}/tmp;\n proxy_temp_path {d}/tmp;\n fastcgi_temp_path {d}/tmp;\n\
             uwsgi_temp_path {d}/tmp;\n scgi_temp_path {d}/tmp;\n\
             server {{ listen 127.0.0.1:{port}; root {w}; }}\n}}\n",
            d = dir.display(),
            w = www.display(),
        ),
    )
    .unwrap();
    let run = |args: &[&str]| launched(&p, args);
    let conf_s = conf.display().to_string();
    // (A process group of its own: the workers go with the master when the test ends.)
    let _nginx = Killed(
        std::os::unix::process::CommandExt::process_group(
            run(&["nginx", "-c", &conf_s]).stdout(std::process::Stdio::null()),
            0,
        )
        .spawn()
        .unwrap(),
    );
    assert!(wait_for(10, || sh_ok("ss -ltn").contains(&format!("127.0.0.1:{port} "))), "nginx did not listen");
    let url = |f: &str| format!("http://127.0.0.1:{port}/{f}");

    let got = dir.join("got");
    let o = run(&["timeout", "120", "curl", "-sS", "-o", &got.display().to_string(), &url("big")]).output().unwrap();
    assert!(o.status.success(), "curl: {}", String::from_utf8_lossy(&o.stderr));
    let sums = sh_ok(&format!("sha256sum {}/big {} | cut -d' ' -f1 | uniq | wc -l", www.display(), got.display()));
    assert_eq!(sums.trim(), "1", "the 100 MB file arrived intact");
    let _ = std::fs::remove_file(&got);

    // ab opens a connection per request: under the automatic rule most stay on TCP, the
    // first and the probes move (a mix on one epoll set, each socket where its first
    // `connect` put it); with the rule off, all 2,000 move.
    for opts in [&[][..], &["--short", "0"][..]] {
        let o = launched_with(&p, opts, &["timeout", "120", "ab", "-n", "2000", "-c", "50", &url("small")])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "ab {opts:?}: {text}{}", String::from_utf8_lossy(&o.stderr));
        assert!(text.contains("Complete requests:      2000") && text.contains("Failed requests:        0"), "{text}");
    }

    let paths: Vec<String> = (0..sizes.len()).flat_map(|_| (0..sizes.len()).map(|i| format!("/p{i}"))).collect();
    let mut args = vec!["pipeline", "127.0.0.1", &port];
    args.extend(paths.iter().map(String::as_str));
    let lines = p.run(true, &args);
    let want: Vec<String> = paths
        .iter()
        .map(|path| {
            let f = format!("{}{path}", www.display());
            let sum = sh_ok(&format!("sha256sum {f} | cut -d' ' -f1"));
            format!("{path} 200 {} {}", std::fs::metadata(&f).unwrap().len(), sum.trim())
        })
        .collect();
    assert_eq!(lines.lines().collect::<Vec<_>>(), want, "every pipelined body is its request's");

    let st = p.stats();
    let moved = st["smc_client"].as_u64().unwrap();
    let short = st["fallback_client"]["short"].as_u64().unwrap();
    assert!(moved >= 2002 && short > 0, "curl's, ab's and the pipelined client's connections: {st}");
    // Every connection either moved or stayed on TCP for a reason counted: the automatic
    // rule's, or a close with nothing written before its server decided (`closed_early`:
    // 2 of 4,055 connections in one CI run, none in the runs before). Nothing else.
    let fell = st["fallback_client"].as_object().unwrap();
    let fell_total: u64 = fell.values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(moved + fell_total, st["connections_client"].as_u64().unwrap(), "{st}");
    assert_eq!(fell_total, short + fell["closed_early"].as_u64().unwrap(), "no other reason: {st}");
    assert_eq!(st["smc_server"].as_u64(), Some(moved), "the workers took every connection: {st}");
    assert_eq!(st["handshake_errors"], 0, "{st}");
}

/// PostgreSQL as Debian ships it, run as an unprivileged member of the fast path's group:
/// its postmaster accepts each connection, forks a backend for it and closes its own copy
/// (the backend first closes the postmaster's listeners; it exits without closing the
/// connection). pgbench under the launcher, every connection moved (`--short 0`): a new
/// connection per transaction, then four long ones with TPC-B's writes — every
/// transaction done, none failed, and every connection on shared memory at both ends.
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root; the server runs as nobody), postgresql, setpriv and groupadd; scripts/test.sh runs it"]
fn postgres_forks_a_backend_per_connection_on_shared_memory() {
    let bin = sh_ok("ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1").trim().to_string();
    assert!(
        !bin.is_empty(),
        "needs postgresql: install it (scripts/test.sh installs every tool the tests drive), or leave out --include-ignored"
    );
    let p = Peers::new("postgres");
    let (_g, gid) = Group::new(&p, "pg");
    let dir = p.dir.join("pg");
    let (data, sock) = (dir.join("data"), dir.join("sock"));
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&sock).unwrap();
    sh_ok(&format!(
        "chmod a+rX {} {} && chown {NOBODY} {} {}",
        p.dir.display(),
        dir.display(),
        data.display(),
        sock.display()
    ));
    let (data_s, sock_s) = (data.display().to_string(), sock.display().to_string());
    let initdb =
        as_nobody(&[], &[&format!("{bin}/initdb"), "-D", &data_s, "-A", "trust", "-U", "postgres"]).output().unwrap();
    assert!(initdb.status.success(), "initdb: {}", String::from_utf8_lossy(&initdb.stderr));
    let port = port(11);
    let launcher = reachable(BIN);
    let postgres = format!("{bin}/postgres");
    let mut server = as_nobody(
        &[gid],
        &[
            &launcher,
            "smc",
            "run",
            "--",
            &postgres,
            "-D",
            &data_s,
            "-k",
            &sock_s,
            "-p",
            &port,
            "-c",
            "listen_addresses=127.0.0.1",
        ],
    );
    server.env("SLUICE_RUN_DIR", &p.dir).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    let _server = Killed(std::os::unix::process::CommandExt::process_group(&mut server, 0).spawn().unwrap());
    let ready = || {
        std::process::Command::new(format!("{bin}/pg_isready"))
            .args(["-h", "127.0.0.1", "-p", &port])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    assert!(wait_for(30, ready), "postgres did not accept connections on port {port}");
    let pgbench = format!("{bin}/pgbench");
    let bench = |args: &[&str]| {
        let mut argv = vec![pgbench.as_str(), "-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-n"];
        argv.extend(args);
        argv.push("postgres");
        let o = launched_with(&p, &["--short", "0"], &argv).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "pgbench {args:?}: {text}");
        text
    };
    let init = launched_with(
        &p,
        &["--short", "0"],
        &[&pgbench, "-i", "-s", "1", "-h", "127.0.0.1", "-p", &port, "-U", "postgres", "postgres"],
    )
    .output()
    .unwrap();
    assert!(init.status.success(), "pgbench -i: {}", String::from_utf8_lossy(&init.stderr));
    // A connection per transaction: 400 backends forked, each on shared memory.
    let text = bench(&["-C", "-S", "-c", "4", "-j", "2", "-t", "100"]);
    assert!(text.contains("number of transactions actually processed: 400/400"), "{text}");
    assert!(text.contains("number of failed transactions: 0 "), "{text}");
    // Four long connections, TPC-B's reads and writes.
    let text = bench(&["-c", "4", "-j", "2", "-t", "500"]);
    assert!(text.contains("number of transactions actually processed: 2000/2000"), "{text}");
    assert!(text.contains("number of failed transactions: 0 "), "{text}");
    every_connection_moved(&p, 404, "pgbench -i's, the 400 and the 4");
}

/// A server that runs another program (fork, then exec) while it holds a connection, and
/// then closes the connection with bytes unread: the child, alive, never held it (the
/// descriptor is close-on-exec), so the close ends the connection — the client reads a
/// reset, as from TCP, not a bare end of file.
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn a_close_after_running_another_program_ends_the_connection() {
    let p = Peers::new("execchild");
    let port = port(16);
    let (s, _out) = p.serve(true, &["serve", &port, "exec-child:3+pause:1"]);
    let _s = Killed(s);
    let got = p.run(true, &["connect", "127.0.0.1", &port, "source:1000+sink-or-error"]);
    assert_eq!(got, "ConnectionResetError", "the server closed with 1,000 bytes unread");
    let st = p.stats();
    assert_eq!((st["smc_client"].as_u64(), st["smc_server"].as_u64()), (Some(1), Some(1)), "{st}");
}

/// An inetd-style server hands each connection to another program: it forks, puts the
/// connection on the child's standard input and output and runs the program there. The
/// connection goes along on shared memory, whether the program reads and writes its
/// descriptors (`cat`) or through C stdio (`sed`: `getdelim` on stdin, `fwrite` to stdout,
/// which glibc does with its own internal calls) — and every byte comes back.
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3, cat, sed; scripts/test.sh runs it"]
fn a_connection_handed_to_another_program_goes_along_on_shared_memory() {
    for (tag, prog) in [("inetdcat", &["cat"][..]), ("inetdsed", &["sed", "-e", ""][..])] {
        let p = Peers::new(tag);
        let port = port(19);
        let mut args = vec!["serve-inetd", &port];
        args.extend(prog);
        handed_over_and_back(&p, &args, &port, &format!("{prog:?}"));
        every_connection_moved(&p, 1, &format!("{prog:?}'s"));
    }
}

/// A server started with `args` (one that hands its connection to another program and
/// prints "child <status>") on `port`: a client's 60,000 bytes come back whole through
/// that program, and the server reports it exited 0 on its own standard output.
fn handed_over_and_back(p: &Peers, args: &[&str], port: &str, what: &str) {
    let (s, mut out) = p.serve(true, args);
    let s = Killed(s);
    let got = p.run(true, &["connect", "127.0.0.1", port, "source:60000+hold:0+sink"]);
    let lines: Vec<&str> = got.lines().collect();
    assert_eq!(lines.len(), 2, "{what}: {got}");
    assert_eq!(lines[1], lines[0], "{what}: the bytes came back whole through the program");
    let mut child = String::new();
    std::io::BufRead::read_line(&mut out, &mut child).unwrap();
    assert_eq!(child.trim(), "child 0", "{what}: the server's standard output after handing the connection on");
    drop(s);
}

/// Python hands a connection to another program with `subprocess`: a `vfork`ed child
/// `dup2`s it onto its standard input and output, closes every other descriptor
/// (`close_range`) and runs `cat`. The connection goes along on shared memory, every byte
/// comes back, and the server's own standard output is still its own afterwards (the
/// child's `dup2`, in its parent's memory, changed nothing of the parent's). And a server
/// that closes every descriptor above its connection's (a daemon's tidy-up) keeps its
/// connection: the library's descriptors are not the program's to close.
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3, cat; scripts/test.sh runs it"]
fn a_program_that_closes_every_other_descriptor_keeps_its_connection() {
    let p = Peers::new("subproc");
    let (first, second) = (port(50), port(51));
    handed_over_and_back(&p, &["serve-subprocess", &first, "cat"], &first, "subprocess");

    let (s, mut out) = p.serve(true, &["serve", &second, "closerange+source:200000"]);
    let s = Killed(s);
    let got = p.run(true, &["connect", "127.0.0.1", &second, "sink"]);
    let mut sent = String::new();
    std::io::BufRead::read_line(&mut out, &mut sent).unwrap();
    assert_eq!(got.trim(), sent.trim(), "the bytes sent after the server closed every other descriptor");
    assert!(sent.starts_with("200000 "), "{sent}");
    drop(s);
    every_connection_moved(&p, 2, "the two servers'");
}

/// A client that writes everything before it reads a byte, to a server that answers each
/// byte as it reads it (an echo — inetd's `cat`, a streaming filter): with TCP the kernel's
/// buffers take megabytes (8 MB here; 16 MB stop both), and on shared memory the rings
/// grow although full once their reader has let them stay full (it waits on its own
/// writes) — 8 MB come back whole instead of both programs waiting forever, as they
/// did beyond about 300 KB.
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn a_client_that_writes_everything_before_it_reads_gets_its_echo_back() {
    let p = Peers::new("echoall");
    let port = port(52);
    // Rings that may grow to 8 MiB whatever this machine's cache (the default cap is an
    // eighth of it: 4 MiB here, less on a smaller cache).
    let big: &[&str] = &["--max-buffer", "8m"];
    let (s, mut out) = p.serve_cmd(p.cmd_with(None, Some(big), &["serve", &port, "echo"]));
    let s = Killed(s);
    let got = Peers::run_cmd_static(p.cmd_with(
        None,
        Some(big),
        &["connect", "127.0.0.1", &port, "source:8000000+hold:0+sink"],
    ));
    let lines: Vec<&str> = got.lines().collect();
    assert_eq!(lines.len(), 2, "{got}");
    assert_eq!(lines[1], lines[0], "the bytes came back whole");
    assert!(lines[0].starts_with("8000000 "), "{got}");
    let mut echoed = String::new();
    std::io::BufRead::read_line(&mut out, &mut echoed).unwrap();
    assert_eq!(echoed.trim(), "echoed 8000000");
    drop(s);
    every_connection_moved(&p, 1, "the client's");
    let st = p.stats();
    assert!(st["buffers_grown"].as_u64() > Some(0), "the full rings grew: {st}");
}

/// git's daemon hands each connection to `git-daemon --serve`, which hands it on to
/// `git upload-pack` (two `exec`s, the second from a process that took the connection over
/// from the first): a clone through it is whole, and on shared memory.
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), git; scripts/test.sh runs it"]
fn git_daemon_serves_a_clone_on_shared_memory() {
    have("git");
    let p = Peers::new("gitd");
    let dir = p.dir.join("git");
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.display();
    sh_ok(&format!(
        "set -e; cd {d}; git init -q src; cd src; head -c 3000000 /dev/urandom > blob.bin; \
         for i in $(seq 100); do echo \"line $i\" > f$i.txt; done; git add -A; \
         git -c user.name=sluice -c user.email=sluice@localhost commit -qm one; \
         cd ..; git clone -q --bare src repo.git"
    ));
    let port = port(29);
    let base = format!("--base-path={d}");
    let listen = format!("--port={port}");
    let _daemon = Killed(
        launched(&p, &["git", "daemon", "--reuseaddr", "--export-all", &base, &listen, "--listen=127.0.0.1"])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(10, || sh_ok("ss -ltn").contains(&format!("127.0.0.1:{port} "))), "git daemon did not listen");
    let url = format!("git://127.0.0.1:{port}/repo.git");
    let into = format!("{d}/clone");
    let o = launched(&p, &["timeout", "120", "git", "clone", "-q", &url, &into]).output().unwrap();
    assert!(o.status.success(), "git clone: {}", String::from_utf8_lossy(&o.stderr));
    sh_ok(&format!("diff -r --exclude=.git {d}/src {d}/clone"));
    every_connection_moved(&p, 1, "git clone's");
}

/// OpenSSH's sshd, the way it runs every connection: it forks, the child re-executes
/// sshd with the connection on its standard input and output after closing every other
/// descriptor (`closefrom`), and that one forks a pre-authentication child that puts
/// itself under a seccomp filter which kills the process for any call outside its list.
/// Under the launcher at both ends a session runs on shared memory: 20 MB each way come
/// through intact.
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), openssh-server and openssh-client; scripts/test.sh runs it"]
fn openssh_runs_a_session_on_shared_memory() {
    have("sshd");
    have("ssh");
    let p = Peers::new("sshd");
    let dir = p.dir.join("ssh");
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.display();
    let port = port(53);
    sh_ok(&format!(
        "set -e; cd {d}; ssh-keygen -q -t ed25519 -N '' -f host_key; ssh-keygen -q -t ed25519 -N '' -f user_key; \
         cp user_key.pub authorized_keys; head -c 20000000 /dev/urandom > blob; \
         printf 'Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\n\
AuthorizedKeysFile {d}/authorized_keys\nPermitRootLogin yes\nPasswordAuthentication no\nUsePAM no\n\
StrictModes no\n' > sshd_config"
    ));
    // sshd's privilege separation directory (the package's; made here if missing).
    std::fs::create_dir_all("/run/sshd").unwrap();
    let config = format!("{d}/sshd_config");
    let _sshd = Killed(
        launched(&p, &["/usr/sbin/sshd", "-D", "-e", "-f", &config])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(10, || sh_ok("ss -ltn").contains(&format!("127.0.0.1:{port} "))), "sshd did not listen");
    let key = format!("{d}/user_key");
    let ssh = |cmd: &str, input: std::process::Stdio| {
        let mut c = launched(
            &p,
            &[
                "timeout",
                "120",
                "ssh",
                "-F",
                "none",
                "-i",
                &key,
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "LogLevel=ERROR",
                "-p",
                &port,
                "root@127.0.0.1",
                cmd,
            ],
        );
        c.stdin(input);
        let o = c.output().unwrap();
        assert!(o.status.success(), "ssh {cmd}: {}", String::from_utf8_lossy(&o.stderr));
        o.stdout
    };
    let want = sh_ok(&format!("sha256sum < {d}/blob"));
    let down = ssh(&format!("cat {d}/blob"), std::process::Stdio::null());
    assert_eq!(down.len(), 20_000_000, "the bytes sshd sent");
    std::fs::write(dir.join("down"), &down).unwrap();
    assert_eq!(sh_ok(&format!("sha256sum < {d}/down")), want, "the file came down intact");
    let up = ssh("sha256sum", std::fs::File::open(format!("{d}/blob")).unwrap().into());
    assert_eq!(String::from_utf8_lossy(&up), want, "the file went up intact");
    every_connection_moved(&p, 2, "ssh's");
}

/// memcached (worker threads on libevent's epoll) and libmemcached's tools under the
/// launcher: memcslap's sets and gets complete (memcached answers a get with one `sendmsg`
/// of three buffers), a 500 KB value stored with memccp comes back intact through
/// memccat, and every connection is on shared memory at both ends.
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), memcached and libmemcached-tools; scripts/test.sh runs it"]
fn memcached_serves_its_tools_on_shared_memory() {
    have("memcached");
    have("memcslap");
    let p = Peers::new("memcached");
    let port = port(15);
    let _server = Killed(
        launched(&p, &["memcached", "-u", "root", "-l", "127.0.0.1", "-p", &port, "-t", "2"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(10, || sh_ok("ss -ltn").contains(&format!("127.0.0.1:{port} "))), "memcached did not listen");
    let servers = format!("--servers=127.0.0.1:{port}");
    let run = |args: &[&str]| {
        let mut argv = vec!["timeout", "120"];
        argv.extend(args);
        let o = launched_with(&p, &["--short", "0"], &argv).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "{args:?}: {text}");
        text
    };
    for test in ["set", "get"] {
        let text = run(&["memcslap", &servers, "--concurrency=4", "--execute-number=5000", &format!("--test={test}")]);
        assert!(text.contains(&format!("Time to {test}")), "{text}");
    }
    let dir = p.dir.join("memcached");
    std::fs::create_dir_all(&dir).unwrap();
    let (value, back) = (dir.join("value"), dir.join("back"));
    sh_ok(&format!("head -c 500000 /dev/urandom > {}", value.display()));
    run(&["memccp", &servers, &value.display().to_string()]);
    run(&["memccat", &servers, &format!("--file={}", back.display()), "value"]);
    assert_eq!(std::fs::read(&back).unwrap(), std::fs::read(&value).unwrap(), "the value came back intact");
    every_connection_moved(&p, 10, "memcslap's eight, memccp's and memccat's");
}

/// At least `least` client connections (`which`), every one moved and taken by the server
/// on shared memory, with no handshake error and no peer fault.
fn every_connection_moved(p: &Peers, least: u64, which: &str) {
    let st = p.stats();
    let moved = st["smc_client"].as_u64().unwrap();
    assert!(moved >= least, "{which}: {st}");
    assert_eq!(st["connections_client"].as_u64(), Some(moved), "every connection moved: {st}");
    assert_eq!(st["smc_server"].as_u64(), Some(moved), "the server took every one: {st}");
    assert_eq!(st["handshake_errors"], 0, "{st}");
    assert_eq!(st["peer_faults"], 0, "{st}");
}

/// A moved connection costs the program three descriptors where TCP costs one (the
/// application's, and among the library's high numbers its TCP socket and the peer's
/// doorbell end), not five as it once did: the rings live in the association's arena
/// (made once per server process), and the program's own numbering is what TCP gives it.
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn a_moved_connection_holds_three_descriptors_two_of_them_out_of_the_programs_way() {
    let p = Peers::new("fds");
    let count = |launcher: bool| {
        let (s, out) = p.serve(launcher, &["echo-epoll", &port(39), "2"]);
        let o = p.run(launcher, &["fds", "127.0.0.1", &port(39)]);
        let _ = s.wait_with_output();
        assert_eq!(rest(out), "echoed 2");
        let w: Vec<u64> = o.split_whitespace().filter_map(|w| w.parse().ok()).collect();
        (w[0], w[1], w[2])
    };
    let (tcp_fds, tcp_app, tcp_low) = count(false);
    let (smc_fds, smc_app, smc_low) = count(true);
    let st = p.stats();
    assert_eq!(st["smc_client"], 2, "{st}");
    assert_eq!((tcp_fds, smc_fds), (1, 3), "descriptors a connection adds on TCP and on shared memory");
    assert_eq!(smc_app, tcp_app, "the socket's own number is TCP's");
    assert_eq!(smc_low, tcp_low, "the library's descriptors are above the program's");
}

/// Buffers grow like TCP's: a stream that keeps filling its peer's buffer doubles it;
/// a connection of small writes keeps its first size; `-r`/`-t` fix the sizes.
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn a_streams_buffer_grows_a_trickles_does_not_and_fixed_sizes_stay_fixed() {
    let p = Peers::new("grow");
    let grown = |st: &serde_json::Value| st["buffers_grown"].as_u64().unwrap();
    let (s, out) = p.serve(true, &["serve", &port(33), "sink"]);
    // Writes larger than the buffer: each finds it full, and the reader, whose reads are
    // as large as the whole first buffer, empties it, so the next write may double it.
    let sent = p.run(true, &["connect", "127.0.0.1", &port(33), "source1m:50000000"]);
    let _ = s.wait_with_output();
    assert_eq!(rest(out), sent);
    let st = p.stats();
    assert_eq!(st["smc_client"], 1, "{st}");
    assert!(grown(&st) >= 1, "a 50 MB stream grew its buffer: {st}");

    sluice_ok_in(&p, &["smc", "stats", "reset"]);
    let (s, out) = p.serve(true, &["serve", &port(33), "sink"]);
    let sent = p.run(true, &["connect", "127.0.0.1", &port(33), "small:2000"]);
    let _ = s.wait_with_output();
    assert_eq!(rest(out), sent);
    let st = p.stats();
    assert_eq!((st["smc_client"].as_u64(), grown(&st)), (Some(1), 0), "small writes never fill it: {st}");

    sluice_ok_in(&p, &["smc", "stats", "reset"]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/smc_peer.py");
    let fixed = |args: &[&str]| {
        let mut argv = vec!["python3", script];
        argv.extend_from_slice(args);
        launched_with(&p, &["-r", "64k", "-t", "64k"], &argv)
    };
    let (s, out) = p.serve_cmd(fixed(&["serve", &port(34), "sink"]));
    let cl = fixed(&["connect", "127.0.0.1", &port(34), "source1m:50000000"]);
    let sent = p.run_cmd(cl);
    let _ = s.wait_with_output();
    assert_eq!(rest(out), sent);
    let st = p.stats();
    assert_eq!(st["smc_client"], 1, "{st}");
    assert_eq!(grown(&st), 0, "fixed sizes do not grow: {st}");
}

/// A descriptor that polls readable has bytes to read: a non-blocking reader that reads
/// only when select says so never gets EAGAIN (wrk counts such a read as an error). A
/// reader in Python is rarely quick enough to meet the writer between counting its bytes
/// and publishing them, where wrk met it once in a few runs: the study test's wrk cells
/// (tests/study.rs), which fail on any wrk error, are the sharper check.
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn a_reader_told_readable_always_finds_bytes() {
    let p = Peers::new("strict");
    for (i, mode) in ["small:20000", "bursts:300", "source:20000000"].iter().enumerate() {
        let port = port(22 + i as u16);
        let (s, out) = p.serve(true, &["serve", &port, "strict-sink"]);
        let sent = p.run(true, &["connect", "127.0.0.1", &port, mode]);
        let _ = s.wait_with_output();
        assert_eq!(rest(out), sent, "{mode}");
    }
    let st = p.stats();
    assert_eq!(st["smc_server"], 3, "{st}");
}

/// A server that declines a connection its client already waits on (in select, poll or
/// epoll) closes its end of the pair, which the wait reports as readable; the library
/// takes that report back, sends the connection back to TCP and waits on, so the
/// program's non-blocking read after the wait finds the server's bytes (on TCP), not
/// EAGAIN (wrk counted one read error in a study run).
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn a_decline_while_the_client_waits_is_not_reported_as_readable() {
    let p = Peers::new("declwait");
    for (i, waiter) in ["select", "poll", "epoll"].iter().enumerate() {
        sluice_ok_in(&p, &["smc", "stats", "reset"]);
        let port = port(15 + i as u16);
        let mut s = p.cmd(true, &["serve", &port, "late:1+pause:0.5+source:100000"]);
        s.env("SLUICE_SMC_FAULT", "server-decline");
        let (srv, out) = p.serve_cmd(s);
        let got = p.run(true, &["connect", "127.0.0.1", &port, &format!("strict-sink:{waiter}")]);
        let _ = srv.wait_with_output();
        assert_eq!(got.trim(), rest(out).trim(), "{waiter}: the bytes arrived whole over TCP, no read found nothing");
        let st = p.stats();
        assert_eq!(st["fallback_client"]["peer_declined"], 1, "{waiter}: {st}");
    }
}

/// A server that declines every connection its clients already wrote into (and wait
/// on) leaves each on TCP with its bytes intact, at 10 and 50 connections at once: each
/// moves back to TCP once — by the client's own read or by another thread's `poll`,
/// whichever finds the decline first; the other finds it done. (Both did: connections
/// were counted twice, and a late move put the TCP socket over a descriptor number the
/// program had closed and reused for its next connection, which then failed — "the
/// server closed the connection mid-transaction", in every run. Moves racing a write into
/// the ring, or a change to blocking mode, lost the bytes or left a blocking program's
/// socket non-blocking.)
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn declined_connections_fall_back_once_with_their_bytes_however_many_at_once() {
    let p = Peers::new("declmany");
    let port = port(18);
    let _s = Killed(
        std::process::Command::new(BIN)
            .args(["smc", "run", "--", BIN, "bench", "serve", "--listen", "127.0.0.1", "--port", &port])
            .env("SLUICE_RUN_DIR", &p.dir)
            .env("SLUICE_SMC_FAULT", "server-decline")
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(10, || sh_ok("ss -ltn").contains(&format!("127.0.0.1:{port}"))));
    let to = format!("127.0.0.1:{port}");
    let o = std::process::Command::new(BIN)
        .args(["smc", "run", "--", BIN, "bench", "run", "--to", &to, "-m", "crr-64x8k", "--conns", "10,50"])
        .args(["--duration", "3", "--json"])
        .env("SLUICE_RUN_DIR", &p.dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for r in v["results"].as_array().unwrap() {
        assert_eq!(r["counts_agree"], true, "{r}");
        assert_eq!(r["client"]["connections"], r["client"]["transactions"], "{r}");
    }
    let st = p.stats();
    let all = st["connections_client"].as_u64().unwrap();
    assert!(all > 100, "{st}");
    assert_eq!(st["smc_client"], 0, "{st}");
    assert_eq!(fallbacks(&st, "fallback_client"), all, "each connection fell back once: {st}");
    let declined = st["fallback_client"]["peer_declined"].as_u64().unwrap();
    assert!(declined + st["fallback_client"]["closed_early"].as_u64().unwrap() == all, "{st}");
}

/// A reply written just before its writer closes is read whole, never cut short by the
/// end of file (or reset) that follows it: `sluice bench`'s connect-request-response
/// workload at 50 connections, the server writing 8 KB and closing at once, thousands of
/// times. (A reader that looked at the ring, then at the flags the writer set after
/// publishing, took the end for the reply in one run of eight.)
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn a_reply_written_just_before_close_is_read_whole() {
    let p = Peers::new("crr");
    let port = port(28);
    let _s = Killed(
        std::process::Command::new(BIN)
            .args(["smc", "run", "--", BIN, "bench", "serve", "--listen", "127.0.0.1", "--port", &port])
            .env("SLUICE_RUN_DIR", &p.dir)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(10, || sh_ok("ss -ltn").contains(&format!("127.0.0.1:{port}"))));
    let to = format!("127.0.0.1:{port}");
    let o = std::process::Command::new(BIN)
        // (Every connection on shared memory: the automatic rule would keep most on TCP.)
        .args([
            "smc",
            "run",
            "--short",
            "0",
            "--",
            BIN,
            "bench",
            "run",
            "--to",
            &to,
            "-m",
            "crr-64x8k",
            "--conns",
            "50",
        ])
        .args(["--duration", "4", "--json"])
        .env("SLUICE_RUN_DIR", &p.dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let st = p.stats();
    assert!(st["smc_client"].as_u64().unwrap() > 1000 && st["peer_faults"] == 0, "{st}");
}

/// `MSG_ZEROCOPY` is decided before the first byte: a socket with `SO_ZEROCOPY` set before
/// it connects, or a listener with it set, stays on TCP (`zerocopy`), where the kernel
/// raises its completions; a moved socket that sets it later gets every send reported
/// as copied (`SO_EE_CODE_ZEROCOPY_COPIED`) on its error queue. Bytes intact each way.
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn zero_copy_sends_stay_on_tcp_when_asked_first_and_complete_as_copies_when_moved() {
    let p = Peers::new("zerocopy");
    let split = |o: String| -> (String, String) {
        let (zc, bytes) = o.split_once('\n').unwrap();
        (zc.to_string(), bytes.to_string())
    };
    // Set before connect: TCP, and the kernel's completions.
    let (s, out) = p.serve(true, &["serve", &port(25), "sink"]);
    let (zc, sent) = split(p.run(true, &["connect", "127.0.0.1", &port(25), "zcfirst+zerocopy:200"]));
    let _ = s.wait_with_output();
    assert_eq!(rest(out), sent);
    let w: Vec<&str> = zc.split_whitespace().collect();
    assert_eq!(w[1], w[2], "the kernel reported every zero-copy send: {zc}");
    let st = p.stats();
    assert_eq!((st["smc_client"].as_u64(), st["fallback_client"]["zerocopy"].as_u64()), (Some(0), Some(1)), "{st}");

    // A listener with it: the server declines.
    sluice_ok_in(&p, &["smc", "stats", "reset"]);
    let (s, out) = p.serve(true, &["serve-zc", &port(26), "sink"]);
    let sent = p.run(true, &["connect", "127.0.0.1", &port(26), "source:100000"]);
    let _ = s.wait_with_output();
    assert_eq!(rest(out), sent);
    let st = p.stats();
    assert_eq!(st["fallback_server"]["zerocopy"], 1, "{st}");
    assert_eq!(st["fallback_client"]["peer_declined"], 1, "{st}");

    // Set after the connection moved: every send completes as a copy.
    sluice_ok_in(&p, &["smc", "stats", "reset"]);
    let (s, out) = p.serve(true, &["serve", &port(27), "sink"]);
    let (zc, sent) = split(p.run(true, &["connect", "127.0.0.1", &port(27), "zerocopy:200"]));
    let _ = s.wait_with_output();
    assert_eq!(rest(out), sent);
    let w: Vec<&str> = zc.split_whitespace().collect();
    assert_eq!(w[1], w[2], "every zero-copy send was reported: {zc}");
    assert_eq!(w[3], "[1]", "as copied (SO_EE_CODE_ZEROCOPY_COPIED): {zc}");
    let st = p.stats();
    assert_eq!(st["smc_client"], 1, "{st}");
}

/// Which connections move. A program whose connections to one server turn out short (a
/// 1,000-byte reply, then the end) keeps its next ones there on TCP (`short`), but for a
/// probe now and then; one whose connections each move a MiB keeps them all on shared
/// memory; `--short 0` turns the rule off. The operator's rules (`--tcp`: a port, a
/// program; on the server's side, its listener) keep on TCP what they name (`rule`).
/// Every byte arrives, whichever way.
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn short_connections_stay_on_tcp_long_ones_move_and_rules_keep_what_they_name() {
    // Twelve connections in turn from one client process, each the server's `bytes`:
    // the statistics after them.
    let twelve = |tag: &str, n: u16, server_opts: &[&str], client_opts: &[&str], bytes: usize| {
        let p = Peers::new(tag);
        let port = port(n);
        let modes = vec![format!("source:{bytes}"); 12].join(",");
        let (s, mut out) = p.serve_cmd(launched_with(&p, server_opts, &["python3", PEER, "serve-seq", &port, &modes]));
        let s = Killed(s);
        let got = p.run_cmd(launched_with(
            &p,
            client_opts,
            &["python3", PEER, "connect-seq", "127.0.0.1", &port, "12", "sink"],
        ));
        let mut sent = String::new();
        for _ in 0..12 {
            std::io::BufRead::read_line(&mut out, &mut sent).unwrap();
        }
        drop(s);
        assert_eq!(got.trim(), sent.trim(), "every connection's bytes arrive ({tag})");
        assert_eq!(got.lines().count(), 12);
        let st = p.stats();
        assert_eq!(st["connections_client"], 12, "{st}");
        st
    };
    let short = |st: &serde_json::Value| st["fallback_client"]["short"].as_u64().unwrap();
    let rule = |st: &serde_json::Value| st["fallback_client"]["rule"].as_u64().unwrap();

    // Two short ones teach it; then four stay on TCP, a probe moves, four more stay and
    // the twelfth probes (the gaps then double, up to 256).
    let st = twelve("auto-short", 30, &[], &[], 1000);
    assert_eq!((st["smc_client"].as_u64().unwrap(), short(&st)), (4, 8), "{st}");
    assert_eq!(st["fallback_server"]["no_proposal"], 8, "{st}");
    // Long ones all move.
    let st = twelve("auto-long", 31, &[], &[], 1 << 20);
    assert_eq!((st["smc_client"].as_u64().unwrap(), short(&st)), (12, 0), "{st}");
    // The rule off: short ones move too.
    let st = twelve("auto-off", 32, &[], &["--short", "0"], 1000);
    assert_eq!((st["smc_client"].as_u64().unwrap(), short(&st)), (12, 0), "{st}");
    // A rule on the client: its destination's port; its program.
    let port_rule = port(33);
    let st = twelve("rule-port", 33, &[], &["--tcp", &port_rule], 1 << 20);
    assert_eq!((st["smc_client"].as_u64().unwrap(), rule(&st)), (0, 12), "{st}");
    let st = twelve("rule-prog", 34, &[], &["--tcp", "prog:python3"], 1 << 20);
    assert_eq!((st["smc_client"].as_u64().unwrap(), rule(&st)), (0, 12), "{st}");
    // A rule on the server: its listener is not registered; clients meet no sluice
    // listener there.
    let st = twelve("rule-listener", 35, &["--tcp", "127.0.0.0/8"], &[], 1 << 20);
    assert_eq!(st["smc_client"], 0, "{st}");
    assert_eq!(st["fallback_client"]["no_listener"], 12, "{st}");
}
