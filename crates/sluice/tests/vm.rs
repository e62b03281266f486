//! QEMU VMs on vhost-user ports (issue 20): `sluice lab up --vm N` boots Debian's kernel
//! under TCG with the lab's initramfs; the VMs ping and ping6 a namespace guest and each
//! other, 100 MB cross intact, a sluice restart and a QEMU restart recover, and a lossless
//! incast into a VM drops nothing in the switch.

mod common;

use std::process::{Child, Command, Stdio};

use common::*;

fn vm_exec(lab: &Lab, vm: &str, cmd: &str) -> std::process::Output {
    sluice(&["lab", "exec", "--name", &lab.name, vm, "--", "sh", "-c", cmd])
}

fn vm_ok(lab: &Lab, vm: &str, cmd: &str) -> String {
    let o = vm_exec(lab, vm, cmd);
    assert!(
        o.status.success(),
        "{vm}: `{cmd}` failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `vm_ok`, failing after `secs` instead of the console's own 600 s.
fn vm_ok_within(lab: &Lab, vm: &str, cmd: &str, secs: u64) -> String {
    let mut c = spawn_vm(lab, vm, cmd);
    let done = wait_for(secs, || c.try_wait().is_ok_and(|s| s.is_some()));
    if !done {
        let _ = c.kill();
    }
    let o = c.wait_with_output().unwrap();
    assert!(
        done && o.status.success(),
        "{vm}: `{cmd}` {} : {}{}",
        if done { "failed" } else { "got no answer" },
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn spawn_vm(lab: &Lab, vm: &str, cmd: &str) -> Child {
    Command::new(BIN)
        .args(["lab", "exec", "--name", &lab.name, vm, "--", "sh", "-c", cmd])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn vm_pid(lab: &Lab, k: usize) -> u64 {
    let s: serde_json::Value = serde_json::from_str(&sluice_ok(&["lab", "list", "--json"])).unwrap();
    let l = s.as_array().unwrap().iter().find(|l| l["name"] == lab.name.as_str()).unwrap();
    l["guests"].as_array().unwrap().iter().find(|g| g["guest"] == format!("vm{k}")).unwrap()["vm"]["pid"]
        .as_u64()
        .unwrap()
}

#[test]
#[ignore = "system tier: needs root (network namespaces, QEMU (qemu-system-x86), busybox and a kernel in /boot), ping and nc; scripts/test.sh runs it"]
fn vms_ping_a_namespace_guest_and_each_other_carry_100mb_intact_and_survive_restarts() {
    if !root() || !have_vm_tools() {
        return;
    }
    // `--accel auto` (the default): KVM if a probe VM boots under it, TCG otherwise.
    let lab = Lab::up("vmnet", &["--guests", "1", "--vm", "2"]);
    let (g1, vm1, vm2) = ("10.77.0.1", "10.77.0.2", "10.77.0.3");
    let list = sluice_ok(&["port", "list", "--switch", &lab.name]);
    assert_eq!(list.matches("guest driver up").count(), 2, "{list}");
    let accel = |k: usize| {
        let s: serde_json::Value = serde_json::from_str(&sluice_ok(&["lab", "list", "--json"])).unwrap();
        let l = s.as_array().unwrap().iter().find(|l| l["name"] == lab.name.as_str()).unwrap().clone();
        l["guests"].as_array().unwrap().iter().find(|g| g["guest"] == format!("vm{k}")).unwrap()["vm"]["accel"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let chosen = accel(1);
    assert!(["kvm", "tcg"].contains(&chosen.as_str()) && accel(2) == chosen, "vm1 {chosen}, vm2 {}", accel(2));
    vm_ok(&lab, "vm1", &format!("ping -c 2 -w 10 {g1}"));
    vm_ok(&lab, "vm1", &format!("ping -c 2 -w 10 {vm2}"));
    vm_ok(&lab, "vm2", "ping6 -c 2 -w 10 fd77::1");
    vm_ok(&lab, "vm1", "ping6 -c 2 -w 10 fd77::3");
    ns_ok(&lab.ns(1), &format!("ping -c 2 -W 5 {vm1}"));

    // The console keeps every line while a command's background processes end around it:
    // they are orphans when the command returns, and each end signals the VM's PID 1.
    vm_ok(
        &lab,
        "vm1",
        "i=0; while [ $i -lt 3000 ]; do (usleep 1000 &); usleep 1000; i=$((i+1)); done >/dev/null 2>&1 & echo $! > /tmp/orphans",
    );
    let pad = "x".repeat(300);
    for k in 0..20 {
        let out = vm_ok_within(&lab, "vm1", &format!("echo {k}-{pad}"), 60);
        assert_eq!(out.trim(), format!("{k}-{pad}"), "the console answered line {k} whole");
    }
    vm_ok(&lab, "vm1", "kill $(cat /tmp/orphans) 2>/dev/null; true");

    // 100 MB from vm1 to the namespace guest: 1 MiB of random bytes handed to the VM, sent
    // 100 times; the namespace hashes what arrives.
    let dir = scratch(&format!("vm-{}", lab.name));
    let r = dir.join("r1m");
    sh_ok(&format!("head -c 1048576 /dev/urandom > {}", r.display()));
    vm_ok(&lab, "vm1", "nc -l -p 5002 > /tmp/r 2>/dev/null &");
    assert!(
        wait_for(10, || ns_sh(&lab.ns(1), &format!("nc -N {vm1} 5002 < {}", r.display())).status.success()),
        "could not hand the file to vm1"
    );
    let want1 = sh_ok(&format!("sha256sum < {}", r.display()));
    assert!(wait_for(10, || vm_ok(&lab, "vm1", "sha256sum < /tmp/r") == want1), "the file reached vm1 changed");
    let sink = ns_spawn(&lab.ns(1), &format!("timeout 300 nc -l -p 5003 | sha256sum > {}/got", dir.display()));
    assert!(
        wait_for(10, || !ns_ok(&lab.ns(1), "ss -ltnH 'sport = :5003'").trim().is_empty()),
        "the namespace's nc did not listen"
    );
    vm_ok(&lab, "vm1", &format!("i=0; while [ $i -lt 100 ]; do cat /tmp/r; i=$((i+1)); done | nc {g1} 5003"));
    let mut sink = sink;
    assert!(wait_for(60, || sink.try_wait().is_ok_and(|s| s.is_some())), "the namespace's nc did not finish");
    let want = sh_ok(&format!("for i in $(seq 100); do cat {}; done | sha256sum", r.display()));
    let got = std::fs::read_to_string(dir.join("got")).unwrap();
    assert_eq!(got, want, "100 MB from vm1 arrived intact");
    let p = lab.port(&format!("{}-vm1", lab.name));
    assert!(p["counters"]["rx_gso"].as_u64().unwrap() > 0, "GSO frames crossed whole from the VM: {}", p["counters"]);

    // sluice restarts in place: QEMU (reconnect=1) finds it again, the VMs keep running.
    let (pid1, pid2) = (vm_pid(&lab, 1), vm_pid(&lab, 2));
    sluice_ok(&["switch", "restart", "--switch", &lab.name]);
    assert!(
        wait_for(20, || sluice_ok(&["port", "list", "--switch", &lab.name]).matches("guest driver up").count() == 2),
        "QEMU did not come back to the restarted switch"
    );
    vm_ok(&lab, "vm1", &format!("ping -c 2 -w 20 {vm2}"));
    vm_ok(&lab, "vm2", &format!("ping -c 2 -w 20 {g1}"));
    assert_eq!((vm_pid(&lab, 1), vm_pid(&lab, 2)), (pid1, pid2), "the same QEMU processes: no VM rebooted");

    // QEMU restarts (vm2): the port takes the new connection, the switch keeps running.
    sluice_ok(&["lab", "reboot", "--name", &lab.name, "vm2"]);
    assert_ne!(vm_pid(&lab, 2), pid2);
    assert_eq!(accel(2), chosen, "the rebooted VM runs as it did");
    vm_ok(&lab, "vm1", &format!("ping -c 2 -w 20 {vm2}"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "system tier: needs root (network namespaces, QEMU (qemu-system-x86), busybox and a kernel in /boot), iperf3; scripts/test.sh runs it"]
fn lossless_incast_of_two_vms_and_a_namespace_into_a_vm_drops_nothing_in_the_switch() {
    if !root() || !have_vm_tools() || !have("iperf3") {
        return;
    }
    let lab = Lab::up("vminc", &["--guests", "1", "--vm", "3", "--lossless", "--accel", "tcg"]);
    let vm3 = "10.77.0.4";
    // The servers, and (bounded) until all three listen.
    vm_ok(
        &lab,
        "vm3",
        "mkdir -p /tmp; for p in 5201 5202 5203; do iperf3 -s -D -p $p --logfile /tmp/iperf3-$p.log --forceflush >/dev/null 2>&1; done; \
         i=0; while [ $(netstat -ltn | grep -c ':520[123] ') -lt 3 ] && [ $i -lt 200 ]; do usleep 50000; i=$((i+1)); done; \
         [ $i -lt 200 ]",
    );
    // Drops before the incast (a namespace guest's first frames, flooded while it was the
    // only port, count as unknown_port) are not the incast's.
    let drops = |s: &serde_json::Value| -> Vec<(String, u64)> {
        s["ports"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|p| {
                ["rx_drops", "tx_drops"].into_iter().map(move |d| {
                    let n = p["counters"][d].as_object().map_or(0, |m| m.values().filter_map(|v| v.as_u64()).sum());
                    (format!("{} {d}", p["name"].as_str().unwrap()), n)
                })
            })
            .collect()
    };
    let before = drops(&lab.stats());
    let mut senders = vec![
        spawn_vm(&lab, "vm1", &format!("iperf3 -c {vm3} -p 5201 -t 8")),
        spawn_vm(&lab, "vm2", &format!("iperf3 -c {vm3} -p 5202 -t 8")),
    ];
    senders.push(ns_spawn(&lab.ns(1), &format!("iperf3 -c {vm3} -p 5203 -t 8")));
    for (mut c, who) in senders.into_iter().zip(["vm1", "vm2", "g1"]) {
        assert!(wait_for(60, || c.try_wait().is_ok_and(|s| s.is_some())), "{who}'s iperf3 did not finish");
        let o = c.wait_with_output().unwrap();
        let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        if !o.status.success() {
            // What the receiving VM saw: its servers' logs (a server that ended a test early
            // says why), its TCP counters (resets sent and why), its kernel's log (a server
            // that died), its processes and memory.
            let seen = vm_exec(
                &lab,
                "vm3",
                "for f in /tmp/iperf3-*.log; do echo \"== $f\"; tail -n 15 $f; done; \
                 grep -E '^(Tcp|TcpExt):' /proc/net/snmp /proc/net/netstat; dmesg | tail -n 30; ps; free",
            );
            panic!(
                "{who}'s iperf3 failed ({}): {out}\nvm3:\n{}{}",
                o.status,
                String::from_utf8_lossy(&seen.stdout),
                String::from_utf8_lossy(&seen.stderr)
            );
        }
    }
    let s = lab.stats();
    assert_eq!(drops(&s), before, "no frame dropped in the switch during the incast");
    let to_vm3 = lab.port(&format!("{}-vm3", lab.name))["counters"]["tx_bytes"].as_u64().unwrap();
    assert!(to_vm3 > 10_000_000, "the incast reached vm3: {to_vm3} bytes");
}
