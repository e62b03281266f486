//! The security-group load the policy paths carry (`linux-bridge-acl`, `sluice-kernel-acl`):
//! one rule set, defined here once, given to each guest's port — by the Linux bridge as
//! an nftables ruleset behind `br_netfilter`, by sluice as its own rules — so that the
//! study compares the same policy enforced two ways.
//!
//! Each guest gets [`RULES`] rules on the traffic towards it: `RULES - 1` denials that
//! the measured traffic never matches (TCP from addresses in 172.16.0.0/12 to one port
//! each), evaluated first, then one rule that allows TCP from the guests' subnet and lets
//! its return traffic through (allow-related). A new connection is judged against every
//! rule; the packets of an established one are the tracker's.

use std::io::Write;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use sluice_sys::bail;
use sluice_sys::error::Context;

use crate::error::Result;

/// Rules per guest port.
pub const RULES: usize = 1000;

/// One rule of the load, towards a guest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Higher first; the first rule that matches decides.
    pub priority: u32,
    /// Allowed (with its return traffic), or denied.
    pub allow: bool,
    /// The source prefix (address, length).
    pub src: (Ipv4Addr, u8),
    /// The TCP destination port, or any.
    pub dport: Option<u16>,
}

/// The rules towards a guest of the subnet `subnet` (address, length): [`RULES`] of them,
/// highest priority first.
pub fn rules(subnet: (Ipv4Addr, u8)) -> Vec<Rule> {
    let mut v: Vec<Rule> = (0..RULES - 1)
        .map(|i| Rule {
            priority: (RULES - i) as u32 + 1,
            allow: false,
            src: (Ipv4Addr::new(172, 16 + (i / 250 % 16) as u8, (i % 250) as u8, 1 + (i / 4000) as u8), 32),
            dport: Some(20_000 + i as u16),
        })
        .collect();
    v.push(Rule { priority: 1, allow: true, src: subnet, dport: None });
    v
}

/// The nftables ruleset that enforces [`rules`] towards each guest address in `guests`
/// on a Linux bridge (with `br_netfilter` passing bridged IPv4 through the `inet`
/// family's forward hook): established and related traffic first, as a stateful
/// firewall does; then, per guest, its rules in a chain of their own, in priority order.
pub fn nft_ruleset(table: &str, guests: &[Ipv4Addr], subnet: (Ipv4Addr, u8)) -> String {
    let mut s = format!("table inet {table} {{\n");
    for (k, _) in guests.iter().enumerate() {
        s.push_str(&format!("  chain to_guest{k} {{\n"));
        for r in rules(subnet) {
            let port = r.dport.map(|p| format!(" tcp dport {p}")).unwrap_or_else(|| " meta l4proto tcp".into());
            let verdict = if r.allow { "accept" } else { "drop" };
            s.push_str(&format!("    ip saddr {}/{}{port} {verdict}\n", r.src.0, r.src.1));
        }
        s.push_str("  }\n");
    }
    s.push_str("  chain forward {\n    type filter hook forward priority filter; policy accept;\n");
    s.push_str("    ct state established,related accept\n");
    for (k, g) in guests.iter().enumerate() {
        s.push_str(&format!("    ip daddr {g} jump to_guest{k}\n"));
    }
    s.push_str("  }\n}\n");
    s
}

/// Loads `ruleset` into namespace `ns` with `nft -f -` (atomically: all of it or none).
pub fn nft_load(ns: &str, ruleset: &str) -> Result<()> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run nft: is nftables installed (apt-get install nftables)?")?;
    child.stdin.take().context("nft's stdin")?.write_all(ruleset.as_bytes()).context("writing the ruleset to nft")?;
    let out = child.wait_with_output().context("waiting for nft")?;
    if !out.status.success() {
        bail!("nft refused the ruleset in {ns}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_is_rules_that_never_match_then_one_that_allows() {
        let subnet = (Ipv4Addr::new(10, 231, 0, 0), 24);
        let r = rules(subnet);
        assert_eq!(r.len(), RULES);
        assert!(r.windows(2).all(|w| w[0].priority > w[1].priority));
        let last = r.last().unwrap();
        assert!(last.allow && last.src == subnet && last.dport.is_none());
        let mut srcs: Vec<_> = r[..RULES - 1].iter().map(|r| (r.src, r.dport)).collect();
        srcs.sort();
        srcs.dedup();
        assert_eq!(srcs.len(), RULES - 1, "every denial is a rule of its own");
        assert!(r[..RULES - 1].iter().all(|r| !r.allow && r.src.0.octets()[0] == 172));
    }

    #[test]
    fn the_nft_ruleset_has_every_rule_per_guest() {
        let g = [Ipv4Addr::new(10, 231, 0, 1), Ipv4Addr::new(10, 231, 0, 2)];
        let s = nft_ruleset("t", &g, (Ipv4Addr::new(10, 231, 0, 0), 24));
        assert_eq!(s.matches(" drop\n").count(), 2 * (RULES - 1));
        assert_eq!(s.matches("ip saddr 10.231.0.0/24 meta l4proto tcp accept").count(), 2);
        assert!(s.contains("ip daddr 10.231.0.2 jump to_guest1"));
    }
}
