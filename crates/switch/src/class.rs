//! Traffic classes (docs/architecture.md, "Lossless without head-of-line blocking"): a
//! frame's class is decided once at ingress, by the first class whose match fits — its
//! 802.1p priority, its IP DSCP, or its input port — and decides the output queue it waits
//! in and whether a full queue holds it back (lossless) or drops it (lossy).

use sluice_wire::ETH_HDR_LEN;

/// Most classes a switch may have (802.1p has eight priorities).
pub const MAX_CLASSES: usize = 8;

/// What frames a class takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClassMatch {
    /// Every frame (a catch-all, usually last).
    Any,
    /// 802.1p priority code point 0–7 of the received tag (untagged frames have 0).
    Pcp(u8),
    /// IPv4 DSCP or IPv6 traffic class (upper six bits), 0–63; non-IP frames never match.
    Dscp(u8),
    /// Frames received from the port of this name.
    Port(String),
}

/// One class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassConfig {
    /// Name, as counters and `sluice stats` show it.
    pub name: String,
    /// Which frames belong to it.
    pub matches: ClassMatch,
    /// A full output queue holds the frame back (true) or drops it (false).
    pub lossless: bool,
    /// Frames each output's queue of this class holds; the switch's `queue_len` when `None`.
    pub queue_len: Option<usize>,
}

impl ClassConfig {
    /// The class a switch has when none is configured: everything, lossless as the switch.
    pub fn default_for(lossless: bool) -> ClassConfig {
        ClassConfig { name: "default".into(), matches: ClassMatch::Any, lossless, queue_len: None }
    }
}

/// Why a set of classes is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClassError {
    /// More than [`MAX_CLASSES`].
    #[error("{0} classes: a switch has at most {MAX_CLASSES}")]
    TooMany(usize),
    /// Two classes of one name.
    #[error("two classes are named {0:?}: names must differ")]
    Duplicate(String),
    /// A name that is empty or not printable.
    #[error("class name {0:?}: use 1 to 32 letters, digits, '-' or '_'")]
    BadName(String),
    /// A priority or DSCP out of range.
    #[error("class {name:?}: {what} {value} is out of range (0 to {max})")]
    OutOfRange {
        /// The class.
        name: String,
        /// "pcp" or "dscp".
        what: &'static str,
        /// The value given.
        value: u8,
        /// The largest allowed.
        max: u8,
    },
    /// A queue that holds nothing.
    #[error("class {0:?}: queue_len must be at least 1")]
    EmptyQueue(String),
}

/// Checks a list of classes; an empty list means the default class.
pub fn check(classes: &[ClassConfig]) -> Result<(), ClassError> {
    if classes.len() > MAX_CLASSES {
        return Err(ClassError::TooMany(classes.len()));
    }
    for (i, c) in classes.iter().enumerate() {
        let ok = |ch: char| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_';
        if c.name.is_empty() || c.name.len() > 32 || !c.name.chars().all(ok) {
            return Err(ClassError::BadName(c.name.clone()));
        }
        if classes[..i].iter().any(|o| o.name == c.name) {
            return Err(ClassError::Duplicate(c.name.clone()));
        }
        let range = |what, value: u8, max: u8| {
            if value > max { Err(ClassError::OutOfRange { name: c.name.clone(), what, value, max }) } else { Ok(()) }
        };
        match c.matches {
            ClassMatch::Pcp(p) => range("pcp", p, 7)?,
            ClassMatch::Dscp(d) => range("dscp", d, 63)?,
            _ => {}
        }
        if c.queue_len == Some(0) {
            return Err(ClassError::EmptyQueue(c.name.clone()));
        }
    }
    Ok(())
}

/// The DSCP of an untagged Ethernet frame carrying IPv4 or IPv6, if it does.
pub fn dscp(frame: &[u8]) -> Option<u8> {
    let ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let ip = frame.get(ETH_HDR_LEN..)?;
    match ethertype {
        0x0800 if ip.first()? >> 4 == 4 => Some(ip.get(1)? >> 2),
        0x86dd if ip.first()? >> 4 == 6 => Some(((ip[0] & 0x0f) << 2) | (ip.get(1)? >> 6)),
        _ => None,
    }
}

/// The index of the class frame `frame` (untagged, with priority `pcp`, received from the
/// port named `port`) belongs to: the first whose match fits, else the last class.
pub fn classify(classes: &[ClassConfig], frame: &[u8], pcp: u8, port: &str) -> u8 {
    let mut dscp_seen: Option<Option<u8>> = None;
    for (i, c) in classes.iter().enumerate() {
        let fits = match &c.matches {
            ClassMatch::Any => true,
            ClassMatch::Pcp(p) => *p == pcp,
            ClassMatch::Dscp(d) => *dscp_seen.get_or_insert_with(|| dscp(frame)) == Some(*d),
            ClassMatch::Port(name) => name == port,
        };
        if fits {
            return i as u8;
        }
    }
    classes.len().saturating_sub(1) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str, m: ClassMatch) -> ClassConfig {
        ClassConfig { name: name.into(), matches: m, lossless: true, queue_len: None }
    }

    fn ipv4(tos: u8) -> Vec<u8> {
        let mut f = vec![0u8; 34];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[15] = tos;
        f
    }

    fn ipv6(tc: u8) -> Vec<u8> {
        let mut f = vec![0u8; 54];
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        f[14] = 0x60 | (tc >> 4);
        f[15] = (tc & 0x0f) << 4;
        f
    }

    #[test]
    fn dscp_is_read_from_ipv4_and_ipv6() {
        assert_eq!(dscp(&ipv4(46 << 2)), Some(46));
        assert_eq!(dscp(&ipv4((10 << 2) | 1)), Some(10), "ECN bits are not DSCP");
        assert_eq!(dscp(&ipv6(46 << 2)), Some(46));
        assert_eq!(dscp(&ipv6(63 << 2 | 3)), Some(63));
        let mut arp = ipv4(0);
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(dscp(&arp), None);
        assert_eq!(dscp(&ipv4(0)[..14]), None, "cut short");
    }

    #[test]
    fn the_first_class_that_fits_takes_the_frame() {
        let classes = [
            class("voice", ClassMatch::Dscp(46)),
            class("storage", ClassMatch::Pcp(3)),
            class("backup", ClassMatch::Port("g9".into())),
            class("rest", ClassMatch::Any),
        ];
        assert_eq!(classify(&classes, &ipv4(46 << 2), 3, "g9"), 0);
        assert_eq!(classify(&classes, &ipv4(0), 3, "g9"), 1);
        assert_eq!(classify(&classes, &ipv4(0), 0, "g9"), 2);
        assert_eq!(classify(&classes, &ipv4(0), 0, "g1"), 3);
        // Without a catch-all, what fits nothing goes to the last class.
        assert_eq!(classify(&classes[..2], &ipv4(0), 0, "g1"), 1);
    }

    #[test]
    fn bad_class_lists_are_refused_naming_the_class() {
        assert_eq!(check(&[]), Ok(()));
        let many: Vec<_> = (0..9).map(|i| class(&format!("c{i}"), ClassMatch::Any)).collect();
        assert_eq!(check(&many), Err(ClassError::TooMany(9)));
        let dup = [class("a", ClassMatch::Any), class("a", ClassMatch::Pcp(1))];
        assert_eq!(check(&dup), Err(ClassError::Duplicate("a".into())));
        let e = check(&[class("x", ClassMatch::Pcp(8))]).unwrap_err();
        assert!(e.to_string().contains("class \"x\": pcp 8 is out of range (0 to 7)"), "{e}");
        assert!(check(&[class("y", ClassMatch::Dscp(64))]).is_err());
        assert!(check(&[class("bad name", ClassMatch::Any)]).is_err());
        let mut q = class("q", ClassMatch::Any);
        q.queue_len = Some(0);
        assert_eq!(check(&[q]), Err(ClassError::EmptyQueue("q".into())));
    }
}
