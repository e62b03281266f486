//! The tunnels' socket filter in a real kernel, on loopback sockets: datagrams from the
//! endpoints it was given reach the socket; those from any other address never do, and
//! are counted, over IPv4 and IPv6.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use sluice_ebpf::tunnel_filter::TunnelFilter;

/// True when the test runs as root (attaching the filter needs it); otherwise fails the
/// test saying what to do.
fn root() -> bool {
    // SAFETY: no preconditions.
    let ok = unsafe { libc::geteuid() } == 0;
    assert!(ok, "needs root (a BPF socket filter): run scripts/test.sh as root, or leave out --include-ignored");
    ok
}

fn wait_for(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

/// The datagrams waiting on `s`, read until none is left.
fn drain(s: &UdpSocket) -> Vec<(Vec<u8>, SocketAddr)> {
    s.set_nonblocking(true).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    while let Ok((n, from)) = s.recv_from(&mut buf) {
        got.push((buf[..n].to_vec(), from));
    }
    got
}

/// A socket bound to `local` with a filter letting `endpoints` through; `sends` datagrams
/// to it from `from` (an address of loopback). Returns what reached the socket, and what
/// the filter counted once every datagram was seen one way or the other.
fn run(local: &str, endpoints: &[&str], from: &str, sends: usize) -> (usize, u64) {
    let rx = UdpSocket::bind((local.parse::<IpAddr>().unwrap(), 0)).unwrap();
    let eps: Vec<IpAddr> = endpoints.iter().map(|e| e.parse().unwrap()).collect();
    let filter = TunnelFilter::attach(rx.as_fd(), &eps).unwrap();
    let tx = UdpSocket::bind((from.parse::<IpAddr>().unwrap(), 0)).unwrap();
    for i in 0..sends {
        tx.send_to(format!("datagram {i}").as_bytes(), rx.local_addr().unwrap()).unwrap();
    }
    let mut got = 0;
    assert!(
        wait_for(5, || {
            got += drain(&rx).len();
            got as u64 + filter.refused() == sends as u64
        }),
        "{got} received and {} refused of {sends}",
        filter.refused()
    );
    (got, filter.refused())
}

#[test]
#[ignore = "system tier: needs root (BPF: the tunnels' socket filter on UDP sockets); scripts/test.sh runs it"]
fn an_endpoints_datagrams_pass_and_anyone_elses_are_dropped_and_counted() {
    if !root() {
        return;
    }
    assert_eq!(run("127.0.0.1", &["127.0.0.2"], "127.0.0.2", 100), (100, 0));
    assert_eq!(run("127.0.0.1", &["127.0.0.2", "127.0.0.4"], "127.0.0.3", 1000), (0, 1000));
    assert_eq!(run("::1", &["::1"], "::1", 100), (100, 0));
    assert_eq!(run("::1", &["fd00::1", "fe80::1"], "::1", 1000), (0, 1000));
    // An IPv4 endpoint is not the IPv6 address that maps it.
    assert_eq!(run("127.0.0.1", &["::ffff:127.0.0.2"], "127.0.0.2", 10), (0, 10));
}
