//! Security groups on the switch: rules added, deleted and listed (each change a new
//! generation, so a datapath that caches verdicts decides again), and the connection
//! tracker's part of a frame's path — its state read into the key before the decision, the
//! connection remembered after it when the verdict says so (a full table drops the frame
//! as `ct_full`), the rules' hits counted.

use super::Switch;
use crate::acl::{AclAction, AclError, AclExtras, AclListed, AclRuleSpec, CtState, Dir};
use crate::conntrack::{self, CtFull, Flow, Found};
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

    /// Replaces every rule and default with `rules` and `defaults` (a state an earlier run
    /// recorded), or, refused, leaves them as they were.
    pub fn acl_replace(
        &mut self,
        rules: &[(String, AclRuleSpec)],
        defaults: &[(String, Dir, AclAction)],
    ) -> Result<(), AclError> {
        let before = self.acl.clone();
        self.acl.clear();
        let mut r = self.acl.add_all(rules).map(|_| ()).map_err(|(_, e)| e);
        for (p, d, a) in defaults {
            if r.is_ok() {
                r = self.acl.set_default(p, *d, *a);
            }
        }
        if r.is_err() {
            self.acl = before;
        }
        self.acl_changed();
        r
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

    /// The rules a verdict's hits name, as (port name, rule id): see
    /// [`crate::acl::AclTables::rule_ids`].
    pub fn acl_rule_ids(&self, hits: &[(PortId, u32)]) -> Vec<(String, u32)> {
        self.acl.rule_ids(hits)
    }

    /// Credits `n` hits a datapath counted to rule `id` of port `port`.
    pub fn acl_credit(&mut self, port: &str, id: u32, n: u64) {
        self.acl.credit(port, id, n);
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

    /// A kernel datapath tracks the connections of the protocols it can
    /// ([`conntrack::kernel_tracks`]) in its own table, `tracker`: frames it hands up say
    /// what it found ([`Switch::ingest_from`]); others of those protocols are looked up
    /// there, and connections the core decides to remember are remembered there. `None`:
    /// the core tracks everything.
    pub fn set_kernel_tracker(&mut self, tracker: Option<Box<dyn conntrack::KernelTracker>>) {
        self.kernel_ct = tracker;
        // (Keys carry the extras a kernel reads, or not: every verdict is made again.)
        self.acl_changed();
    }

    /// The security groups' compiled classes, for a datapath that classifies frames
    /// itself, and their epoch (it moves whenever they may have changed).
    pub fn acl_classes(&self) -> (&crate::acl::AclTables, u64) {
        (&self.acl, self.acl_epoch)
    }

    fn acl_changed(&mut self) {
        self.generation += 1;
        self.acl_epoch += 1;
        let ids: Vec<PortId> = self.port_ids().collect();
        for id in ids {
            self.note_fast(id);
        }
    }

    /// Before the decision: the security groups' extras of an admitted `frame` (untagged),
    /// its connection's state looked up at `now_ms` — or, handed up by a kernel datapath
    /// that tracks its protocol, what the kernel found (`found`); `None` when no port has
    /// rules. Also the frame's flow, and whether the kernel tracks it.
    pub(super) fn acl_extras(
        &mut self,
        frame: &[u8],
        found: Option<Found>,
        now_ms: u64,
    ) -> (Option<AclExtras>, Option<(Flow, bool)>) {
        if !self.acl.active() {
            return (None, None);
        }
        let Some((flow, proto, src, dst, dport, icmp_type)) = conntrack::read_flow(frame) else {
            return (Some(AclExtras { kernel: self.kernel_ct.is_some(), ..AclExtras::default() }), None);
        };
        let in_kernel = self.kernel_ct.is_some() && conntrack::kernel_tracks(proto);
        let ct = match (found, self.kernel_ct.as_mut()) {
            (Some(f), _) if in_kernel => f.state(&flow),
            (None, Some(k)) if in_kernel => k.lookup(frame).state(&flow),
            _ => self.ct.lookup(&flow, now_ms),
        };
        let missed = matches!(ct, CtState::New | CtState::Invalid) && proto == 6;
        let x = AclExtras {
            ct,
            proto,
            src: self.acl.addr_class(src),
            dst: self.acl.addr_class(dst),
            dport: self.acl.port_class(dport),
            icmp_type,
            tcp_flags: if missed { flow.tcp_flags & conntrack::MISS_FLAGS } else { 0 },
            kernel: self.kernel_ct.is_some(),
        };
        (Some(x), Some((flow, in_kernel)))
    }

    /// After the decision on a frame (`frame`, untagged) from port `id` with key `key`:
    /// remembers its connection when the verdict says so — in the kernel's table when the
    /// kernel tracks it — (a full table drops it: `ct_full`), and counts the rules' hits.
    pub(super) fn acl_after(
        &mut self,
        key: &Key,
        frame: &[u8],
        flow: Option<(Flow, bool)>,
        v: &mut Verdict,
        now_ms: u64,
    ) {
        if !v.acl.hits.is_empty() {
            self.acl.count(&v.acl.hits);
        }
        if v.acl.commit
            && v.action == Action::Forward
            && let Some((f, in_kernel)) = flow
            && key.extras.acl.is_some()
            && self.commit(frame, &f, in_kernel, now_ms).is_err()
        {
            v.action = Action::Drop(DropCause::CtFull);
            v.outputs.clear();
            v.flood = false;
            v.next_hop = None;
        }
    }

    fn commit(&mut self, frame: &[u8], f: &Flow, in_kernel: bool, now_ms: u64) -> Result<(), CtFull> {
        match self.kernel_ct.as_mut() {
            Some(k) if in_kernel => k.commit(frame),
            _ => self.ct.commit(f, now_ms),
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
