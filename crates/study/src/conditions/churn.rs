//! `port-churn`: ports come and go on the path's switch while the cell runs — every
//! [`CHURN_EVERY`], [`CHURN_PORTS`] TAP ports (in a namespace of the condition's) added
//! through the control socket and removed again — so the switch attaches and detaches
//! ports, and gives back their buffers, under the cell's load.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use sluice_api::client::Client;
use sluice_api::config::PortSpec;
use sluice_api::proto::Request;

use super::{Clock, Shared, Tally};

/// Ports added and removed each time.
pub const CHURN_PORTS: u32 = 5;
/// How often the ports come and go.
pub const CHURN_EVERY: Duration = Duration::from_secs(1);

/// The names of the churned ports of lab `lab` for the condition's `k`th start (at most
/// 15 characters, an interface name's limit, for the labs' 10-character names).
pub fn names(lab: &str, k: u32) -> Vec<String> {
    (1..=CHURN_PORTS).map(|i| format!("{lab}-c{}{i}", k % 10)).collect()
}

/// Adds the TAP ports `names` in namespace `ns` to the switch at `socket` and removes
/// them again, every [`CHURN_EVERY`] until the cell ends; counts what it added and
/// removed and what the switch refused. Every round removes what it added, also when
/// the cell ends meanwhile.
pub fn churn(socket: &Path, names: &[String], ns: &str, mtu: u16, sh: &Shared, mut clock: Clock) -> io::Result<Tally> {
    let mut t = Tally::default();
    let mut at = Instant::now();
    while !sh.over() {
        let mut c = Client::connect(socket).map_err(io::Error::other)?;
        let mut added = Vec::new();
        for n in names {
            let mut spec = PortSpec::tap(n);
            spec.netns = Some(ns.to_string());
            spec.mtu = Some(mtu);
            match c.call_value(&Request::PortAdd { port: Box::new(spec), may_exist: false }) {
                Ok(_) => {
                    t.add("ports_added", 1);
                    added.push(n.clone());
                }
                Err(_) => t.add("adds_refused", 1),
            }
        }
        for n in added {
            match c.call_value(&Request::PortDel { name: n, if_exists: false }) {
                Ok(_) => t.add("ports_removed", 1),
                Err(_) => t.add("removals_refused", 1),
            }
        }
        t.add("rounds", 1);
        clock.tick();
        at += CHURN_EVERY;
        while Instant::now() < at && !sh.over() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    clock.tick();
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn churned_ports_fit_an_interface_name() {
        let n = names("st12345670", 1234);
        assert_eq!(n.len(), CHURN_PORTS as usize);
        assert!(n.iter().all(|n| n.len() <= 15), "{n:?}");
        assert_eq!(n[0], "st12345670-c41");
    }
}
