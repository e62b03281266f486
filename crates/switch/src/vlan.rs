//! VLAN membership of a port: the ingress rule (which VLAN a received frame belongs to)
//! and the egress rule (whether, and how tagged, a frame of a VLAN leaves the port).
//!
//! Inside the switch every frame is untagged and carries its VLAN id as metadata; tags
//! are removed on ingress and inserted on egress. Frames never cross from one VLAN to
//! another.

use std::fmt;

/// Lowest and highest usable VLAN ids (0 means "priority tag only", 4095 is reserved).
pub const VID_MIN: u16 = 1;
/// Highest usable VLAN id.
pub const VID_MAX: u16 = 4094;

/// A set of VLAN ids, as a 4096-bit map.
#[derive(Clone, PartialEq, Eq)]
pub struct VlanSet([u64; 64]);

impl VlanSet {
    /// No VLAN.
    pub fn empty() -> Self {
        VlanSet([0; 64])
    }

    /// Adds `vid` (ignored outside 1..=4094).
    pub fn insert(&mut self, vid: u16) {
        if (VID_MIN..=VID_MAX).contains(&vid) {
            self.0[vid as usize / 64] |= 1 << (vid % 64);
        }
    }

    /// True if `vid` is in the set.
    pub fn contains(&self, vid: u16) -> bool {
        vid < 4096 && self.0[vid as usize / 64] & (1 << (vid % 64)) != 0
    }

    /// The ids in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        (VID_MIN..=VID_MAX).filter(|&v| self.contains(v))
    }
}

impl FromIterator<u16> for VlanSet {
    fn from_iter<I: IntoIterator<Item = u16>>(iter: I) -> Self {
        let mut s = VlanSet::empty();
        for v in iter {
            s.insert(v);
        }
        s
    }
}

/// Compact form: `10,20-29,100`.
impl fmt::Display for VlanSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut it = self.iter().peekable();
        while let Some(lo) = it.next() {
            let mut hi = lo;
            while it.peek() == Some(&(hi + 1)) {
                hi = it.next().unwrap_or(hi);
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if lo == hi { write!(f, "{lo}")? } else { write!(f, "{lo}-{hi}")? }
        }
        Ok(())
    }
}

impl fmt::Debug for VlanSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VlanSet({self})")
    }
}

/// How a port takes part in VLANs.
// One per port, never per frame: the 512-byte bitmap costs nothing worth boxing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VlanMode {
    /// Untagged at the guest; every frame belongs to this VLAN. Tagged frames received
    /// (other than priority-only tags, VLAN 0) are dropped.
    Access(u16),
    /// Tagged frames of the allowed VLANs pass with their tag; untagged frames belong to
    /// the native VLAN (dropped when there is none) and leave untagged.
    Trunk {
        /// VLANs whose tagged frames the port carries.
        allowed: VlanSet,
        /// The VLAN of untagged frames; implicitly allowed.
        native: Option<u16>,
    },
}

/// The VLAN a received frame joins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ingress {
    /// VLAN id.
    pub vid: u16,
    /// Priority from the tag (0 when untagged).
    pub pcp: u8,
}

impl VlanMode {
    /// The default port: access port of VLAN 1.
    pub fn default_access() -> Self {
        VlanMode::Access(1)
    }

    /// Decides the VLAN of a frame received with outer tag control `tci` (None when
    /// untagged). `None` means the port does not accept the frame.
    pub fn ingress(&self, tci: Option<u16>) -> Option<Ingress> {
        let (vid, pcp) = match tci {
            None => (None, 0),
            Some(t) => (Some(t & 0x0fff), (t >> 13) as u8),
        };
        let vid = match (self, vid) {
            (VlanMode::Access(v), None | Some(0)) => *v,
            (VlanMode::Access(_), Some(_)) => return None,
            (VlanMode::Trunk { native, .. }, None | Some(0)) => (*native)?,
            (VlanMode::Trunk { allowed, native }, Some(v)) => {
                if allowed.contains(v) || *native == Some(v) {
                    v
                } else {
                    return None;
                }
            }
        };
        Some(Ingress { vid, pcp })
    }

    /// Whether a frame of VLAN `vid` may leave through this port: `None` if not a member,
    /// `Some(false)` to send it untagged, `Some(true)` to send it tagged.
    pub fn egress(&self, vid: u16) -> Option<bool> {
        match self {
            VlanMode::Access(v) => (*v == vid).then_some(false),
            VlanMode::Trunk { allowed, native } => {
                if *native == Some(vid) {
                    Some(false)
                } else {
                    allowed.contains(vid).then_some(true)
                }
            }
        }
    }

    /// True if frames of `vid` can enter or leave through this port.
    pub fn is_member(&self, vid: u16) -> bool {
        self.egress(vid).is_some()
    }
}

/// Display like `access 10` or `trunk 10,20 native 1`.
impl fmt::Display for VlanMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VlanMode::Access(v) => write!(f, "access {v}"),
            VlanMode::Trunk { allowed, native } => {
                write!(f, "trunk {allowed}")?;
                if let Some(n) = native {
                    write!(f, " native {n}")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trunk(allowed: &[u16], native: Option<u16>) -> VlanMode {
        VlanMode::Trunk { allowed: allowed.iter().copied().collect(), native }
    }

    #[test]
    fn access_port_takes_untagged_and_priority_tagged_only() {
        let p = VlanMode::Access(10);
        assert_eq!(p.ingress(None), Some(Ingress { vid: 10, pcp: 0 }));
        assert_eq!(p.ingress(Some(0xa000)), Some(Ingress { vid: 10, pcp: 5 }));
        assert_eq!(p.ingress(Some(10)), None);
        assert_eq!(p.egress(10), Some(false));
        assert_eq!(p.egress(20), None);
    }

    #[test]
    fn trunk_port_allowed_list_and_native_vlan() {
        let p = trunk(&[10, 20], Some(1));
        assert_eq!(p.ingress(Some(20)).map(|i| i.vid), Some(20));
        assert_eq!(p.ingress(Some(30)), None);
        assert_eq!(p.ingress(None).map(|i| i.vid), Some(1));
        assert_eq!(p.ingress(Some(1)).map(|i| i.vid), Some(1));
        assert_eq!(p.egress(1), Some(false));
        assert_eq!(p.egress(10), Some(true));
        assert_eq!(p.egress(30), None);
    }

    #[test]
    fn trunk_without_native_drops_untagged() {
        let p = trunk(&[10], None);
        assert_eq!(p.ingress(None), None);
    }

    #[test]
    fn vlan_set_display_compacts_ranges() {
        let s: VlanSet = [1, 2, 3, 10, 4094].into_iter().collect();
        assert_eq!(s.to_string(), "1-3,10,4094");
        assert!(!s.contains(0) && !s.contains(4095));
    }
}
