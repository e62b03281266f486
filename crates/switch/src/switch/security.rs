//! Security groups on the switch: rules added, deleted and listed (each change a new
//! generation, so a datapath that caches verdicts decides again), and the connection
//! tracker's part of a frame's path — its state read into the key before the decision, the
//! connection remembered after it when the verdict says so (a full table drops the frame
//! as `ct_full`), the rules' hits counted.

use super::Switch;
use crate::acl::{AclAction, AclError, AclExtras, AclListed, AclRuleSpec, Dir};
use crate::conntrack::{self, Flow};
use crate::counters::DropCause;
use crate::decide::{Action, Key, Verdict};
use crate::ids::PortId;

/// How often expired connections are swept (ms).
const SWEEP_MS: u64 = 1000;

/// The connection tracker's numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtStats {
    /// Connections remembered.
    pub entries: usize,
    /// The table's size.
    pub max: usize,
    /// New connections refused because the table was full (`ct_full` drops).
    pub full: u64,
}

impl Switch {
    /// Adds a security-group rule to port `port` (attached or not): its id.
    pub fn acl_add(&mut self, port: &str, spec: &AclRuleSpec) -> Result<u32, AclError> {
        let id = self.acl.add(port, spec)?;
        self.acl_changed();
        Ok(id)
    }

    /// Adds rules all at once, or none (see [`crate::acl::AclTables::add_all`]).
    pub fn acl_add_all(&mut self, rules: &[(String, AclRuleSpec)]) -> Result<Vec<u32>, (usize, AclError)> {
        let ids = self.acl.add_all(rules)?;
        self.acl_changed();
        Ok(ids)
    }

    /// Deletes rule `id` (of port `port` when given): the port it was on, `None` when no
    /// such rule.
    pub fn acl_del(&mut self, port: Option<&str>, id: u32) -> Option<String> {
        let p = self.acl.del(port, id)?;
        self.acl_changed();
        Some(p)
    }

    /// Sets port `port`'s default action for direction `dir`.
    pub fn acl_default(&mut self, port: &str, dir: Dir, action: AclAction) -> Result<(), AclError> {
        self.acl.set_default(port, dir, action)?;
        self.acl_changed();
        Ok(())
    }

    /// Port `port`'s default action for `dir`.
    pub fn acl_default_of(&self, port: &str, dir: Dir) -> AclAction {
        self.acl.default_of(port, dir)
    }

    /// The ports with rules or defaults.
    pub fn acl_ports(&self) -> Vec<String> {
        self.acl.ports().map(str::to_string).collect()
    }

    /// The rules of port `port` (or all), with their hits.
    pub fn acl_list(&self, port: Option<&str>) -> Vec<AclListed> {
        self.acl.list(port)
    }

    /// Zeroes the rules' hit counters.
    pub fn acl_reset_hits(&mut self) {
        self.acl.reset_hits();
    }

    /// The connection tracker's size (connections beyond a smaller size stay until they
    /// end).
    pub fn set_ct_max(&mut self, max: usize) {
        self.ct.set_max(max);
    }

    /// The connection tracker's numbers.
    pub fn ct_stats(&self) -> CtStats {
        CtStats { entries: self.ct.len(), max: self.ct.max(), full: self.ct.refused() }
    }

    /// Forgets every remembered connection (return traffic is judged by the rules again).
    pub fn ct_flush(&mut self) {
        self.ct.clear();
    }

    fn acl_changed(&mut self) {
        self.generation += 1;
        let ids: Vec<PortId> = self.port_ids().collect();
        for id in ids {
            self.note_fast(id);
        }
    }

    /// Before the decision: the security groups' extras of an admitted `frame` (untagged),
    /// its connection's state looked up at `now_ms`; `None` when no port has rules.
    pub(super) fn acl_extras(&mut self, frame: &[u8], now_ms: u64) -> (Option<AclExtras>, Option<Flow>) {
        if !self.acl.active() {
            return (None, None);
        }
        let Some((flow, proto, src, dst, dport, icmp_type)) = conntrack::read_flow(frame) else {
            return (Some(AclExtras::default()), None);
        };
        let x = AclExtras {
            ct: self.ct.lookup(&flow, now_ms),
            proto,
            src: self.acl.addr_class(src),
            dst: self.acl.addr_class(dst),
            dport: self.acl.port_class(dport),
            icmp_type,
        };
        (Some(x), Some(flow))
    }

    /// After the decision on a frame from port `id` with key `key`: remembers its
    /// connection when the verdict says so (a full table drops it: `ct_full`), and counts
    /// the rules' hits.
    pub(super) fn acl_after(&mut self, key: &Key, flow: Option<Flow>, v: &mut Verdict, now_ms: u64) {
        if !v.acl.hits.is_empty() {
            self.acl.count(&v.acl.hits);
        }
        if v.acl.commit
            && v.action == Action::Forward
            && let Some(f) = flow
            && key.extras.acl.is_some()
            && self.ct.commit(&f, now_ms).is_err()
        {
            v.action = Action::Drop(DropCause::CtFull);
            v.outputs.clear();
            v.flood = false;
            v.next_hop = None;
        }
    }

    /// Sweeps expired connections, at most once a second.
    pub(super) fn expire_connections(&mut self, now_ms: u64) {
        if now_ms >= self.ct_swept_ms + SWEEP_MS {
            self.ct_swept_ms = now_ms;
            self.ct.expire(now_ms);
        }
    }
}
