//! The fast path's trust boundary (issue 14; docs/architecture.md, "The fast path's trust
//! boundary"): a local process that does not hold a connection cannot take it over, a
//! peer that breaks the shared memory loses only its own connection, resetting the
//! statistics breaks no program, a listener registered in another namespace never gets
//! a connection, users the fast path is not open to get plain TCP and one message, and a
//! peer that cheats cannot hold a program in `connect` or `accept`.
//!
//! The attacker is tests/smc_hostile.py, which speaks the side door's messages and lays
//! out arenas by hand (docs/architecture.md, "Connections at TCP's cost"); the
//! unprivileged user is nobody (uid 65534), through setpriv.

mod common;

use common::smc::*;
use common::*;

fn spawn(mut c: std::process::Command) -> std::process::Child {
    c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap()
}

/// Runs `c` to completion (at most `secs`) and returns (success, stdout, stderr).
fn finish(c: std::process::Child, secs: u64) -> (bool, String, String) {
    let mut c = c;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while c.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = c.kill();
            let o = c.wait_with_output().unwrap();
            panic!(
                "still running after {secs} s: {}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let o = c.wait_with_output().unwrap();
    let s = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
    (o.status.success(), s(&o.stdout), s(&o.stderr))
}

fn run(c: std::process::Command) -> String {
    let (ok, out, err) = finish(spawn(c), 60);
    assert!(ok, "failed: {out}\n{err}");
    out
}

/// The hostile peer, as root, in this test's runtime directory.
fn hostile(p: &Peers, ns: Option<&str>, args: &[&str]) -> std::process::Command {
    let mut argv: Vec<&str> = Vec::new();
    if let Some(ns) = ns {
        argv.extend(["ip", "netns", "exec", ns]);
    }
    argv.extend(["python3", HOSTILE]);
    let dir = p.dir.to_string_lossy().into_owned();
    let mut c = std::process::Command::new(argv[0]);
    c.args(&argv[1..]).arg(args[0]).arg(&dir).args(&args[1..]).stdin(std::process::Stdio::null());
    c
}

/// A server under test: killed if the test fails before it ends.
struct Server {
    child: Killed,
    out: Out,
}

impl Server {
    fn start(p: &Peers, launcher: bool, args: &[&str]) -> Server {
        let (child, out) = p.serve(launcher, args);
        Server { child: Killed(child), out }
    }

    /// Waits for it to end by itself (at most 60 s); its output after "listening".
    fn output(self) -> String {
        let (ok, _, err) = finish(self.child.take(), 60);
        assert!(ok, "the server failed: {err}");
        rest(self.out)
    }
}

fn line(out: &mut Out) -> String {
    use std::io::BufRead;
    let mut l = String::new();
    out.read_line(&mut l).unwrap();
    l.trim().to_string()
}

/// Reads "port N cookie C" from a client paused before it connects: (port, cookie).
fn port_and_cookie(out: &mut Out) -> (String, String) {
    let first = line(out);
    let w: Vec<&str> = first.split_whitespace().collect();
    assert!(w.len() == 4 && w[0] == "port" && w[2] == "cookie", "{first}");
    (w[1].to_string(), w[3].to_string())
}

/// Starts the hostile peer and waits until it says its messages are out.
fn hostile_sent(c: std::process::Command) -> (std::process::Child, Out) {
    let mut h = spawn(c);
    let mut out = std::io::BufReader::new(h.stdout.take().unwrap());
    let l = line(&mut out);
    assert!(l == "sent" || l.starts_with("refused"), "{l}");
    (h, out)
}

#[test]
#[ignore = "system tier: needs root (programs run as nobody, network namespaces and mounts), python3 and setpriv; scripts/test.sh runs it"]
fn a_process_that_does_not_hold_a_connection_cannot_take_it_over() {
    if !root() {
        return;
    }
    let p = Peers::new("hijack");
    let port = port(40);
    let server = Server::start(&p, true, &["serve", &port, "sink"]);
    // A plain client of another user, paused before it connects (its socket's cookie is
    // there for anyone in the namespace to read).
    let gate = p.dir.join("go");
    let peer = reachable(PEER);
    let mut client = spawn(as_nobody(
        &[],
        &["python3", &peer, "connect", "127.0.0.1", &port, &format!("pregate:{}+source:3000000", gate.display())],
    ));
    let mut client_out = std::io::BufReader::new(client.stdout.take().unwrap());
    let (cport, cookie) = port_and_cookie(&mut client_out);
    let claim = |how: &str| -> Vec<String> {
        ["propose", &port, "127.0.0.1", &cport, "127.0.0.1", how].iter().map(|a| a.to_string()).collect()
    };
    // Root, in the same namespace, announcing that socket as its own.
    let as_own = claim(&format!("cookie:{cookie}"));
    let (root_liar, mut root_out) =
        hostile_sent(hostile(&p, None, &as_own.iter().map(String::as_str).collect::<Vec<_>>()));
    // Root in a namespace of its own, with a socket of the very same four addresses as
    // the proof (the connection it names is not in the server's namespace yet; the
    // server's door declines it).
    let fake = Netns::new("fake");
    let same = claim("same");
    let twin = run(hostile(&p, Some(&fake.0), &same.iter().map(String::as_str).collect::<Vec<_>>()));
    assert_eq!(twin, "sent\ndeclined not_our_connection");
    // Another user cannot even knock.
    let (dir, script) = (p.dir.to_string_lossy().into_owned(), reachable(HOSTILE));
    let mut nobody_args = vec!["python3", &script, "propose", &dir, &port, "127.0.0.1", &cport, "127.0.0.1"];
    let how = format!("cookie:{cookie}");
    nobody_args.push(&how);
    assert_eq!(run(as_nobody(&[], &nobody_args)), "refused EACCES");
    // The real client connects now: the server sees its socket is nobody's, not root's,
    // and keeps the connection on TCP; the client and server exchange their bytes there.
    std::fs::write(&gate, b"").unwrap();
    assert_eq!(line(&mut root_out), "declined unproven", "the root liar got nothing");
    let (ok, _, err) = finish(root_liar, 30);
    assert!(ok, "{err}");
    let sent = rest(client_out);
    let (ok, _, err) = finish(client, 60);
    assert!(ok, "{err}");
    assert_eq!(server.output(), sent, "the server got exactly the client's bytes");
    let st = p.stats();
    assert_eq!(st["fallback_server"]["unproven"], 1, "the real connection stayed TCP: {st}");
    assert_eq!(st["fallback_server"]["not_our_connection"], 1, "{st}");
    assert_eq!(st["smc_server"], 0, "{st}");
}

/// A writer that loses its CPU between counting bytes and publishing them (a virtual CPU
/// the host takes away) has rung the doorbell for bytes the reader cannot see yet: a
/// program that epoll told "readable" must not be told EAGAIN (wrk counts that as an
/// error) — its read waits until the bytes are published.
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn a_read_after_readable_waits_for_bytes_counted_and_not_yet_published() {
    let (sent, got) = against_an_odd_writer("slowpub", &port(34), "strict-sink:epoll", "slow-publish:20");
    assert_eq!(got, sent, "every byte, and no read said EAGAIN after epoll said readable");
}

/// A server in MODE on PORT under the launcher, and smc_hostile.py's client writing an
/// honest connection to it in its odd way (ATTACK), once the server committed: what the
/// client says it sent ("<bytes> <sha256>"), and what the server printed.
fn against_an_odd_writer(name: &str, port: &str, mode: &str, attack: &str) -> (String, String) {
    let p = Peers::new(name);
    let server = Server::start(&p, true, &["serve", port, mode]);
    let out = run(hostile(&p, None, &["client", "127.0.0.1", port, attack]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(lines[0], "decision commit");
    (lines[1].to_string(), server.output())
}

/// A writer that loses its CPU between publishing bytes and ringing their doorbell: the
/// reader, woken on its futex, has taken the bytes before the doorbell byte lands. That
/// byte must come off the descriptor before the program's next `select`, or the select
/// says readable with nothing to read — and a program that then reads a blocking
/// descriptor waits for a message that never comes (iperf3's server did, on its control
/// connection).
#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn a_doorbell_byte_that_lands_after_its_bytes_were_read_never_makes_the_descriptor_readable() {
    let (sent, got) = against_an_odd_writer("latebell", &port(30), "block-then-select", "late-bell:20");
    assert_eq!(got, sent, "every byte, and no select said readable with nothing to read");
}

#[test]
#[ignore = "system tier: needs root (`sluice smc run` sets the fast path up only as root), python3; scripts/test.sh runs it"]
fn a_peer_that_breaks_the_shared_memory_loses_only_its_own_connection() {
    let p = Peers::new("broken");
    let port = port(41);
    let server = Server::start(&p, true, &["serve-seq", &port, "sink,sink,source:20000000,sink,sink"]);
    let attack = |a: &str| run(hostile(&p, None, &["client", "127.0.0.1", &port, a]));
    // An unsealed arena is refused before it is mapped (it could shrink under us): the
    // client sees its end of the pair close.
    assert_eq!(attack("unsealed"), "pair-closed\nshrunk-own-copy");
    // A producer cursor far out of range, and a consumer cursor out of range.
    assert_eq!(attack("bad-prod"), "decision commit\nwrote bad producer cursor");
    assert_eq!(attack("bad-cons"), "decision commit\nwrote bad consumer cursor");
    // A sealed arena cannot be shrunk by the peer that made it.
    assert_eq!(attack("sealed"), "decision commit\nshrink refused");
    // …and the server goes on serving an honest client.
    let sent = p.run(true, &["connect", "127.0.0.1", &port, "source:5000000"]);
    let lines: Vec<String> = server.output().lines().map(str::to_string).collect();
    let empty = "0 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    assert_eq!(lines[0], empty, "the refused one stayed on TCP and sent nothing");
    assert_eq!(lines[1], "ConnectionResetError", "a bad cursor resets that connection: {lines:?}");
    assert!(
        lines[2] == "ConnectionResetError" || lines[2] == "BrokenPipeError",
        "a bad cursor resets that connection: {lines:?}"
    );
    assert_eq!(lines[3], empty);
    assert_eq!(lines[4], sent, "the honest client's bytes arrived intact");
    let st = p.stats();
    assert_eq!(st["peer_faults"], 2, "{st}");
    assert_eq!(st["fallback_server"]["bad_segment"], 1, "{st}");
    assert_eq!(st["smc_server"], 4, "{st}");
    assert_eq!(st["smc_client"], 1, "{st}");
}

#[test]
#[ignore = "system tier: needs root (programs run as nobody, network namespaces and mounts), python3 and setpriv; scripts/test.sh runs it"]
fn resetting_the_statistics_while_programs_run_breaks_none_of_them() {
    if !root() {
        return;
    }
    let p = Peers::new("reset");
    let port = port(42);
    let server = Server::start(&p, true, &["serve", &port, "sink"]);
    let client = spawn(p.cmd(true, &["connect", "127.0.0.1", &port, "source:1000000000"]));
    // A file that is not a statistics file, and one another user planted under a name
    // that is not theirs: readers skip both.
    let stats_dir = p.dir.join("smc/stats");
    std::fs::write(stats_dir.join("4242"), b"garbage").unwrap();
    let dir = p.dir.to_string_lossy().into_owned();
    let hostile = reachable(HOSTILE);
    let mut resets = 0;
    let mut client = Some(client);
    let mut probed = String::new();
    while client.as_mut().unwrap().try_wait().unwrap().is_none() && resets < 2000 {
        sluice_ok_in(&p, &["smc", "stats", "reset"]);
        resets += 1;
        if probed.is_empty() && stats_dir.join("0").exists() {
            probed = run(as_nobody(&[], &["python3", &hostile, "probe", &dir]));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (ok, sent, err) = finish(client.take().unwrap(), 120);
    assert!(ok, "the client lived through {resets} resets: {err}");
    assert_eq!(server.output(), sent, "the server lived through {resets} resets");
    assert!(resets >= 5, "the statistics were reset while the transfer ran ({resets} times)");
    assert!(!probed.is_empty(), "the probe ran while the programs counted");
    // Another user could neither write nor truncate the files the programs map.
    assert!(probed.contains("truncate:stats/0 refused"), "{probed}");
    assert!(!probed.contains("ALLOWED"), "{probed}");
    let o = std::process::Command::new(BIN)
        .args(["smc", "stats", "--json"])
        .env("SLUICE_RUN_DIR", &p.dir)
        .output()
        .unwrap();
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("skipping"), "the garbage was noticed");
    // The root programs' file kept its size through every reset.
    assert_eq!(std::fs::metadata(stats_dir.join("0")).unwrap().len(), 4096);
}

#[test]
#[ignore = "system tier: needs root (programs run as nobody, network namespaces and mounts), python3; scripts/test.sh runs it"]
fn a_listener_registered_in_another_namespace_never_gets_the_connection() {
    if !root() {
        return;
    }
    let p = Peers::new("decoy");
    let port = port(43);
    // The real server: plain, in this namespace. The decoy: a willing "sluice listener"
    // for the same address, in a namespace of its own.
    let server = Server::start(&p, false, &["serve", &port, "sink"]);
    sluice_ok_in(&p, &["smc", "setup"]);
    let other = Netns::new("decoy");
    let mut decoy = spawn(hostile(&p, Some(&other.0), &["decoy", "127.0.0.1", &port, "20"]));
    let mut decoy_out = std::io::BufReader::new(decoy.stdout.take().unwrap());
    assert_eq!(line(&mut decoy_out), "listening");
    let decoy = Killed(decoy);
    let sent = p.run(true, &["connect", "127.0.0.1", &port, "source:2000000"]);
    assert_eq!(server.output(), sent, "the real server got the client's bytes");
    drop(decoy);
    let heard = rest(decoy_out);
    assert!(!heard.contains("message"), "nothing ever reached the decoy's door: {heard:?}");
    let st = p.stats();
    assert_eq!(st["fallback_client"]["wrong_listener"], 1, "{st}");
    assert_eq!(st["smc_client"], 0, "{st}");
}

#[test]
#[ignore = "system tier: needs root (programs run as nobody, network namespaces and mounts), python3 and setpriv; scripts/test.sh runs it"]
fn users_the_fast_path_is_not_open_to_get_plain_tcp_and_one_message() {
    if !root() {
        return;
    }
    let p = Peers::new("nobody");
    sluice_ok_in(&p, &["smc", "setup", "--root-only"]);
    let bin = reachable(BIN);
    let peer = reachable(PEER);
    let mut c = as_nobody(
        &[],
        &[&bin, "smc", "run", "--", "sh", "-c", "grep -c libsluice_smc /proc/self/maps; echo SLUICE_SMC=$SLUICE_SMC"],
    );
    c.env("SLUICE_RUN_DIR", &p.dir);
    let (ok, out, err) = finish(spawn(c), 30);
    assert!(ok, "{err}");
    assert_eq!(out, "0\nSLUICE_SMC=", "the program ran without the library");
    assert_eq!(err.matches("sluice:").count(), 1, "one message: {err}");
    assert!(err.contains("open to root only, not to nobody (uid 65534)") && err.contains("runs on plain TCP"), "{err}");
    // Against a root server under the launcher: plain TCP, bytes intact.
    let port = port(44);
    let server = Server::start(&p, true, &["serve", &port, "sink"]);
    let mut c =
        as_nobody(&[], &[&bin, "smc", "run", "--", "python3", &peer, "connect", "127.0.0.1", &port, "source:3000000"]);
    c.env("SLUICE_RUN_DIR", &p.dir);
    let (ok, sent, err) = finish(spawn(c), 60);
    assert!(ok, "{err}");
    assert_eq!(server.output(), sent);
    let st = p.stats();
    assert_eq!(st["smc_server"], 0, "{st}");
    assert_eq!(st["fallback_server"]["no_proposal"], 1, "{st}");
}

#[test]
#[ignore = "system tier: needs root (programs run as nobody, network namespaces and mounts), python3, setpriv and groupadd; scripts/test.sh runs it"]
fn members_of_the_fast_paths_group_use_it_and_other_users_cannot_reach_it() {
    if !root() {
        return;
    }
    let p = Peers::new("group");
    let (_g, gid) = Group::new(&p, "m");
    let (port, port2) = (port(45), port(46));
    let server = Server::start(&p, true, &["serve", &port, "sink"]);
    let (bin, peer) = (reachable(BIN), reachable(PEER));
    let mut c = as_nobody(
        &[gid],
        &[&bin, "smc", "run", "--", "python3", &peer, "connect", "127.0.0.1", &port, "source:3000000"],
    );
    c.env("SLUICE_RUN_DIR", &p.dir);
    let (ok, sent, err) = finish(spawn(c), 60);
    assert!(ok, "{err}");
    assert_eq!(server.output(), sent);
    let st = p.stats();
    assert_eq!((st["smc_client"].as_u64(), st["smc_server"].as_u64()), (Some(1), Some(1)), "{st}");
    // A user outside the group reaches nothing: no door, no entry, no statistics file.
    let server2 = Server::start(&p, true, &["serve", &port2, "sink"]);
    let (dir, pid) = (p.dir.to_string_lossy().into_owned(), server2.child.0.id().to_string());
    let probed = run(as_nobody(&[], &["python3", &reachable(HOSTILE), "probe", &dir, &pid]));
    assert!(probed.contains(&format!("door:{pid}.sock refused")), "{probed}");
    assert!(probed.contains("create:listen refused"), "{probed}");
    assert!(!probed.contains("ALLOWED"), "{probed}");
}

#[test]
#[ignore = "system tier: needs root (programs run as nobody, network namespaces and mounts), python3, setpriv and groupadd; scripts/test.sh runs it"]
fn a_member_of_the_group_cannot_make_a_server_wait_for_anothers_connection() {
    if !root() {
        return;
    }
    let p = Peers::new("announce");
    let (_g, gid) = Group::new(&p, "a");
    let port = port(49);
    let server = Server::start(&p, true, &["serve", &port, "sink"]);
    // A plain client (root), paused before it connects.
    let gate = p.dir.join("go");
    let mut client =
        spawn(p.cmd(false, &["connect", "127.0.0.1", &port, &format!("pregate:{}+source:1000000", gate.display())]));
    let mut client_out = std::io::BufReader::new(client.stdout.take().unwrap());
    let (cport, cookie) = port_and_cookie(&mut client_out);
    // Another user of the fast path announces that connection as if it were its own.
    let (dir, script) = (p.dir.to_string_lossy().into_owned(), reachable(HOSTILE));
    let how = format!("cookie:{cookie}");
    let (liar, mut liar_out) = hostile_sent(as_nobody(
        &[gid],
        &["python3", &script, "propose", &dir, &port, "127.0.0.1", &cport, "127.0.0.1", &how],
    ));
    std::fs::write(&gate, b"").unwrap();
    assert_eq!(line(&mut liar_out), "declined unproven");
    let (ok, _, err) = finish(liar, 30);
    assert!(ok, "{err}");
    let sent = rest(client_out);
    let (ok, _, err) = finish(client, 60);
    assert!(ok, "{err}");
    assert_eq!(server.output(), sent, "the server got exactly the client's bytes");
    // The server did not believe it, and waited for nothing.
    let st = p.stats();
    assert_eq!(st["fallback_server"]["unproven"], 1, "{st}");
    assert_eq!(st["fallback_server"]["no_proposal"], 0, "{st}");
    assert_eq!(st["fallback_server"]["timeout"], 0, "{st}");
}

/// Sends signal `sig` to process `pid`, one this test started.
fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a child of this test that it has not reaped.
    let r = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(r, 0, "signal {sig} to {pid}");
}

/// A client may send everything and close before its server accepts (a busy server is late
/// to `accept`). Its connection is still in the server's namespace — not one from another
/// namespace, whose proof the server would need — and, its socket held by no process any
/// more, it is nobody's to announce: root's and a member's announcements of it are
/// declined as unproven, not left undecided, and its bytes arrive over TCP. (The door
/// looked up established client ends only: a closed one read as "in another namespace",
/// no announcement was decided, and the liar of the test above saw "undecided" in 13 runs
/// of 30 with two busy loops beside it.)
#[test]
#[ignore = "system tier: needs root (programs run as nobody, network namespaces and mounts), python3, setpriv and groupadd; scripts/test.sh runs it"]
fn a_connection_whose_client_closed_before_the_server_accepted_is_nobodys_to_announce() {
    if !root() {
        return;
    }
    let p = Peers::new("closed");
    let (_g, gid) = Group::new(&p, "c");
    let port = port(47);
    let server = Server::start(&p, true, &["serve", &port, "sink"]);
    // The server is stopped until the client has closed and gone: it accepts last.
    let pid = server.child.0.id();
    signal(pid, libc::SIGSTOP);
    let gate = p.dir.join("go");
    let peer = reachable(PEER);
    let mut client = spawn(as_nobody(
        &[],
        &["python3", &peer, "connect", "127.0.0.1", &port, &format!("pregate:{}+source:1000", gate.display())],
    ));
    let mut client_out = std::io::BufReader::new(client.stdout.take().unwrap());
    let (cport, cookie) = port_and_cookie(&mut client_out);
    std::fs::write(&gate, b"").unwrap();
    let (ok, _, err) = finish(client, 60);
    assert!(ok, "{err}");
    // Root and a member of the group announce that connection as their own.
    let how = format!("cookie:{cookie}");
    let claim = ["propose", &port, "127.0.0.1", &cport, "127.0.0.1", &how];
    let (root_liar, mut root_out) = hostile_sent(hostile(&p, None, &claim));
    let (dir, script) = (p.dir.to_string_lossy().into_owned(), reachable(HOSTILE));
    let mut as_member = vec!["python3", &script, "propose", &dir];
    as_member.extend(&claim[1..]);
    let (member, mut member_out) = hostile_sent(as_nobody(&[gid], &as_member));
    signal(pid, libc::SIGCONT);
    assert_eq!(line(&mut root_out), "declined unproven", "root got nothing");
    assert_eq!(line(&mut member_out), "declined unproven", "the member got nothing");
    for liar in [root_liar, member] {
        let (ok, _, err) = finish(liar, 30);
        assert!(ok, "{err}");
    }
    assert_eq!(server.output(), rest(client_out), "the server got exactly the client's bytes");
    let st = p.stats();
    assert_eq!(st["fallback_server"]["unproven"], 1, "{st}");
    assert_eq!(st["fallback_server"]["no_proposal"], 0, "{st}");
    assert_eq!(st["smc_server"], 0, "{st}");
}

#[test]
#[ignore = "system tier: needs root (programs run as nobody, network namespaces and mounts), python3; scripts/test.sh runs it"]
fn a_runtime_directory_left_by_an_older_sluice_is_repaired_by_roots_launcher() {
    if !root() {
        return;
    }
    // The layout before issue 14: directories as the program's umask made them, and the
    // statistics in one file every user could write.
    let p = Peers::new("upgrade");
    let smc = p.dir.join("smc");
    for d in ["door", "listen", "intent", "conn", "lib"] {
        std::fs::create_dir_all(smc.join(d)).unwrap();
    }
    std::fs::write(smc.join("stats"), vec![0u8; 4096]).unwrap();
    sh_ok(&format!("chmod 666 {}", smc.join("stats").display()));
    let port = port(48);
    let server = Server::start(&p, true, &["serve", &port, "sink"]);
    let sent = p.run(true, &["connect", "127.0.0.1", &port, "source:1000000"]);
    assert_eq!(server.output(), sent);
    assert!(smc.join("stats").is_dir(), "the statistics file became the directory");
    let st = p.stats();
    assert_eq!((st["smc_client"].as_u64(), st["smc_server"].as_u64()), (Some(1), Some(1)), "{st}");
}

/// A listener that cheats its clients cannot hold them or lose their bytes: `connect`
/// never waits on it, and whatever it does with an announcement — a door that takes
/// nothing, the client's end of the pair closed at once, garbage in the slot's word, or
/// no decision ever (the client gives up on it after its bound) — the client's bytes
/// reach it whole over TCP.
#[test]
#[ignore = "system tier: needs root (programs run as nobody, network namespaces and mounts), python3; scripts/test.sh runs it"]
fn a_listener_that_cheats_cannot_hold_a_client_or_its_bytes() {
    if !root() {
        return;
    }
    let p = Peers::new("cheat");
    sluice_ok_in(&p, &["smc", "setup"]);
    for (i, (attack, reason)) in [
        ("full-door", "door_unreachable"),
        ("close-bell", "taken_as_tcp"),
        ("garbage-word", "protocol"),
        ("stall", "timeout"),
    ]
    .into_iter()
    .enumerate()
    {
        sluice_ok_in(&p, &["smc", "stats", "reset"]);
        let port = port(30 + i as u16);
        let mut srv = spawn(hostile(&p, None, &["server", "127.0.0.1", &port, attack, "60"]));
        let mut srv_out = std::io::BufReader::new(srv.stdout.take().unwrap());
        assert_eq!(line(&mut srv_out), "listening", "{attack}");
        let _srv = Killed(srv);
        let (ok, sent, err) = finish(spawn(p.cmd(true, &["connect", "127.0.0.1", &port, "source:1000000"])), 45);
        assert!(ok, "{attack}: {err}");
        // On TCP, whole.
        let got = std::iter::from_fn(|| Some(line(&mut srv_out)).filter(|l| !l.is_empty()))
            .find(|l| l.starts_with("tcp "))
            .unwrap_or_default();
        assert_eq!(got, format!("tcp {sent}"), "{attack}");
        let st = p.stats();
        assert_eq!(st["fallback_client"][reason], 1, "{attack}: {st}");
        assert_eq!(st["smc_client"], 0, "{attack}: {st}");
    }
}

/// A client that announces its connections as if from another namespace (a proof to
/// follow) and never proves them: the server's `accept` waits for the first (briefly),
/// not for that user's next ones; every byte arrives over TCP.
#[test]
#[ignore = "system tier: needs root (programs run as nobody, network namespaces and mounts), python3, setpriv and groupadd; scripts/test.sh runs it"]
fn a_client_that_announces_and_never_proves_holds_accept_once() {
    if !root() {
        return;
    }
    let p = Peers::new("liar");
    let (_g, gid) = Group::new(&p, "l");
    let port = port(35);
    // The liar in a namespace of its own, reaching the server over a veth pair.
    let ns = Netns::new("liar");
    let tag = std::process::id() % 100_000;
    let (a, b) = (format!("slq{tag}a"), format!("slq{tag}b"));
    let net = format!("10.{}.{}", 200 + tag % 50, (tag / 50) % 250);
    sh_ok(&format!(
        "ip link add {a} type veth peer name {b} && ip link set {b} netns {ns} && ip addr add {net}.1/30 dev {a} \
         && ip link set {a} up && ip -n {ns} addr add {net}.2/30 dev {b} && ip -n {ns} link set {b} up",
        ns = ns.0
    ));
    struct Link(String);
    impl Drop for Link {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip").args(["link", "del", &self.0]).status();
        }
    }
    let _link = Link(a);
    let server_ip = format!("{net}.1");
    let server = Server::start(&p, true, &["serve-seq", &port, "sink,sink,sink", &server_ip]);
    let (dir, script) = (p.dir.to_string_lossy().into_owned(), reachable(HOSTILE));
    let liar = ["ip", "netns", "exec", &ns.0, "setpriv", "--reuid=65534", "--regid=65534"];
    let groups = format!("--groups={gid}");
    let mut c = std::process::Command::new(liar[0]);
    c.args(&liar[1..]).arg(&groups).args(["/usr/bin/python3", &script, "liar", &dir, &server_ip, &port, "3", "100000"]);
    c.stdin(std::process::Stdio::null());
    let sent = run(c);
    assert_eq!(server.output(), sent, "the server got every connection's bytes");
    // The first was waited for and brought nothing; that user's next ones were not.
    let st = p.stats();
    assert_eq!(st["fallback_server"]["timeout"], 1, "{st}");
    assert_eq!(st["fallback_server"]["penalized"], 2, "{st}");
    assert_eq!(st["fallback_server"]["no_proposal"], 0, "{st}");
}

#[test]
#[ignore = "system tier: needs root (programs run as nobody, network namespaces and mounts), python3; scripts/test.sh runs it"]
fn files_planted_in_the_shared_directories_never_hang_the_admin_commands() {
    if !root() {
        return;
    }
    let p = Peers::new("planted");
    sluice_ok_in(&p, &["smc", "setup"]);
    let port = port(36);
    let server = Server::start(&p, true, &["serve", &port, "sink"]);
    let sent = p.run(true, &["connect", "127.0.0.1", &port, "source:100000"]);
    assert_eq!(server.output(), sent);
    // A FIFO where a statistics file goes (opening it would wait for a writer), and in
    // the connection list a FIFO and a link to an endless file.
    let smc = p.dir.join("smc");
    sh_ok(&format!("mkfifo {0}/stats/4343 {0}/conn/fifo && ln -s /dev/zero {0}/conn/zero", smc.display()));
    let sluice = |args: &[&str]| {
        let mut c = std::process::Command::new(BIN);
        c.args(args).env("SLUICE_RUN_DIR", &p.dir).stdin(std::process::Stdio::null());
        finish(spawn(c), 30)
    };
    let (ok, out, err) = sluice(&["smc", "stats", "--json"]);
    assert!(ok, "{err}");
    assert!(err.contains("skipping") && err.contains("4343"), "the FIFO was noticed: {err}");
    let st: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(st["smc_client"], 1, "the real counters still count: {st}");
    let (ok, _, err) = sluice(&["smc", "stats", "reset"]);
    assert!(ok, "{err}");
    let (ok, out, err) = sluice(&["smc", "info"]);
    assert!(ok, "{err}");
    assert_eq!(out, "no connection is on shared memory");
    let (_, out, _) = sluice(&["smc", "stats", "--json"]);
    let st: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(st["smc_client"], 0, "the reset went past the FIFO: {st}");
}

/// A member who floods a server's side door with announcements of connections that never
/// come gets a share of the server's descriptors, not all of them: the program still
/// accepts its next connection. (The door took up to 512 announcements, three
/// descriptors each, per association: the program ran out and its `accept` failed.)
#[test]
#[ignore = "system tier: needs root (programs run as nobody, network namespaces and mounts), python3; scripts/test.sh runs it"]
fn a_flood_of_announcements_leaves_the_server_its_descriptors() {
    if !root() {
        return;
    }
    let p = Peers::new("flood");
    let port = port(38);
    let mut cmd = std::process::Command::new("prlimit");
    cmd.arg("--nofile=128:128").arg(BIN).args(["smc", "run", "--", "python3", PEER, "serve", &port, "sink"]);
    let errors = p.dir.join("server-stderr");
    cmd.env("SLUICE_RUN_DIR", &p.dir).stdin(std::process::Stdio::null());
    cmd.stdout(std::process::Stdio::piped()).stderr(std::fs::File::create(&errors).unwrap());
    let mut child = Killed(cmd.spawn().unwrap());
    let mut out = std::io::BufReader::new(child.0.stdout.take().unwrap());
    let first = {
        use std::io::BufRead;
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        l
    };
    let why = || std::fs::read_to_string(&errors).unwrap_or_default();
    assert_eq!(first.trim(), "listening", "the server did not start: {}", why());
    let pid = child.0.id();
    let server = Server { child, out };
    let mut flood = spawn(hostile(&p, None, &["flood", &port, "300", "30"]));
    let said = {
        use std::io::BufRead;
        let mut l = String::new();
        std::io::BufReader::new(flood.stdout.as_mut().unwrap()).read_line(&mut l).unwrap();
        l
    };
    assert_eq!(said.trim(), "flooded");
    let held = || std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    // The door has taken in what it will (it reads the association as messages come).
    let mut last = 0;
    assert!(
        wait_for(10, || {
            let now = held();
            let settled = now == last && now > 40;
            last = now;
            settled
        }),
        "the server's descriptors: {}",
        held()
    );
    assert!(held() < 110, "the door left the program room: {} of 128 descriptors in use", held());
    let sent = p.run(false, &["connect", "127.0.0.1", &port, "source:100000"]);
    assert_eq!(server.output(), sent, "the server accepted and read its next connection");
    let _ = flood.kill();
    let _ = flood.wait();
}

/// Listener entries are anyone's to write: thousands of them for one address cost a
/// `connect` a few looks, not a look (and a door) each — and the real listener still gets
/// its connection on shared memory. (Each `connect` read and checked every entry — a
/// `kill(2)` each, twice — and tried the door of every one.)
#[test]
#[ignore = "system tier: needs root (programs run as nobody, network namespaces and mounts), python3; scripts/test.sh runs it"]
fn planted_listener_entries_cost_a_connect_a_few_looks() {
    if !root() {
        return;
    }
    let p = Peers::new("entries");
    let port = port(39);
    let server = Server::start(&p, true, &["serve", &port, "sink"]);
    // Entries for the server's address claiming another namespace, each naming a live
    // process (init) that has no door.
    let listen = p.dir.join("smc/listen");
    for n in 0..3000 {
        std::fs::write(listen.join(format!("127.0.0.1_{port}.{}.1", 1000 + n)), "r=65536 rmax=65536\n").unwrap();
    }
    let trace = p.dir.join("strace");
    let mut c = std::process::Command::new("strace");
    c.args(["-f", "-c", "-e", "trace=kill", "-o"]).arg(&trace).arg(BIN);
    c.args(["smc", "run", "--", "python3", PEER, "connect", "127.0.0.1", &port, "source:100000"]);
    c.env("SLUICE_RUN_DIR", &p.dir).stdin(std::process::Stdio::null());
    let sent = p.run_cmd(c);
    assert_eq!(server.output(), sent);
    let summary = std::fs::read_to_string(&trace).unwrap();
    let kills: u64 = summary
        .lines()
        .find(|l| l.trim_end().ends_with(" kill"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
        .unwrap_or(0);
    assert!(kills < 200, "the client looked at {kills} entries:\n{summary}");
    let st = p.stats();
    assert_eq!(st["smc_client"], 1, "the real listener was found: {st}");
}

/// Each user's programs count into a file of that user's, which the user can also write
/// by hand: a member can misstate their own counts, never another's. The totals only add
/// (a file of 2^64 − 7 cancelled another user's 7 when the sum wrapped), and every count is
/// shown by user too.
#[test]
#[ignore = "system tier: needs root (programs run as nobody, network namespaces and mounts), python3; scripts/test.sh runs it"]
fn a_members_statistics_file_can_misstate_only_its_own_counts() {
    if !root() {
        return;
    }
    let p = Peers::new("forged");
    sluice_ok_in(&p, &["smc", "setup"]);
    let stats = p.dir.join("smc/stats");
    let segment = |connections: u64| {
        let mut b = vec![0u8; 4096];
        b[..8].copy_from_slice(&sluice_smc::stats::MAGIC.to_le_bytes());
        let i = sluice_smc::stats::counter_index(sluice_smc::stats::Counter::ConnsClient);
        b[8 * i..8 * i + 8].copy_from_slice(&connections.to_le_bytes());
        b
    };
    std::fs::write(stats.join("0"), segment(7)).unwrap();
    let forged = stats.join(NOBODY.to_string());
    std::fs::write(&forged, segment(0u64.wrapping_sub(7))).unwrap();
    std::os::unix::fs::chown(&forged, Some(NOBODY), None).unwrap();
    let st = p.stats();
    assert_eq!(st["users"]["0"]["connections_client"], 7, "{st}");
    assert_eq!(st["users"][NOBODY.to_string()]["connections_client"], 0u64.wrapping_sub(7), "{st}");
    assert_eq!(st["connections_client"], u64::MAX, "the forged file added, saturating; it took nothing: {st}");
    let o = std::process::Command::new(BIN).args(["smc", "stats"]).env("SLUICE_RUN_DIR", &p.dir).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("root (uid 0)") && text.contains("uid 65534"), "{text}");
}

/// A small tmpfs mounted over a directory, unmounted on drop.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
#[ignore = "system tier: needs root (programs run as nobody, network namespaces and mounts), python3; scripts/test.sh runs it"]
fn a_full_runtime_directory_costs_the_fast_path_or_its_counters_never_a_program() {
    if !root() {
        return;
    }
    let p = Peers::new("full");
    sh_ok(&format!("mount -t tmpfs -o size=2m,mode=0755 sluice-test {}", p.dir.display()));
    let _m = Mounted(p.dir.clone());
    sluice_ok_in(&p, &["smc", "setup"]);
    // Every block taken (other users of the fast path can do this to a shared /run).
    let fill = p.dir.join("fill");
    let fill_up = || {
        let _ = std::process::Command::new("dd")
            .args(["if=/dev/zero", &format!("of={}", fill.display()), "bs=4096"])
            .stderr(std::process::Stdio::null())
            .status();
    };
    // No room for the library: the program runs on plain TCP, and says so once.
    fill_up();
    let mut c = std::process::Command::new(BIN);
    c.args(["smc", "run", "--", "true"]).env("SLUICE_RUN_DIR", &p.dir).stdin(std::process::Stdio::null());
    let (ok, _, err) = finish(spawn(c), 30);
    assert!(ok, "{err}");
    assert!(err.contains("cannot install the preload library") && err.contains("runs on plain TCP"), "{err}");
    // The library in place, then no room for a statistics file's pages: the programs
    // move their bytes through shared memory and count nothing.
    std::fs::remove_file(&fill).unwrap();
    sluice_ok_in(&p, &["smc", "run", "--", "true"]);
    fill_up();
    let port = port(37);
    let server = Server::start(&p, true, &["serve", &port, "sink"]);
    let sent = p.run(true, &["connect", "127.0.0.1", &port, "source:2000000"]);
    assert_eq!(server.output(), sent, "both programs lived and the bytes arrived whole");
}
