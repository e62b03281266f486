//! What every data connection of a group does, derived from the client's flowops, and the
//! rules that let both sides end timed loops with exact counts (docs/architecture.md, "The
//! workload modeler").
//!
//! A connection's life is a list of [`Segment`]s: flowops run once (between `connect` and the
//! end of its transaction, or up to `disconnect`), or whole transactions repeated a known
//! number of times or until time is up. The server runs the same segments mirrored.

use std::fmt;

use crate::profile::{FlowOp, FlowOpKind, Group, Protocol, Repeat, Size};

/// One data step, from the client's side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Io {
    /// The client writes (the server reads) this many bytes.
    Write(Size),
    /// The client reads (the server writes) this many bytes.
    Read(Size),
}

impl Io {
    /// The step as the server sees it: writes and reads swapped.
    pub fn mirrored(&self) -> Io {
        match self {
            Io::Write(s) => Io::Read(s.clone()),
            Io::Read(s) => Io::Write(s.clone()),
        }
    }
}

/// How often a segment runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Times {
    /// Once per connection.
    Once,
    /// A fixed number of times.
    Count(u64),
    /// Until the client's time is up.
    Timed,
}

/// A run of data steps on one connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// How often.
    pub times: Times,
    /// The steps of one pass, client's view.
    pub steps: Vec<Io>,
    /// Each pass completes one transaction of the profile (it belongs to a transaction that
    /// moves data, and holds that transaction's data steps).
    pub counts: bool,
}

impl Segment {
    /// The first step is a client read: the server sends first (it may run ahead).
    pub fn server_driven(&self) -> bool {
        matches!(self.steps.first(), Some(Io::Read(_)))
    }
}

/// Everything one data connection of a group does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnScript {
    /// Segments in order.
    pub segments: Vec<Segment>,
    /// The client sends an 8-byte seed first (the group draws `rand` sizes).
    pub seeded: bool,
    /// TCP_NODELAY on both ends.
    pub nodelay: bool,
    /// Datagrams (protocol=udp) instead of a TCP stream.
    pub udp: bool,
    /// The group opens its connections with a client-side `accept`: the server connects
    /// back to the client (TCP only). Once open, the connection runs the same script.
    pub reverse: bool,
}

/// Largest UDP payload (IPv4).
pub const MAX_DATAGRAM: u64 = 65_507;

/// A profile shape the engine cannot run with exact counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScriptError {
    /// Line of the element at fault.
    pub line: u32,
    /// The element (`group`, `transaction` or `flowop`).
    pub element: &'static str,
    /// What is wrong and what to do.
    pub message: String,
}

impl fmt::Display for ScriptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: <{}>: {}", self.line, self.element, self.message)
    }
}

impl std::error::Error for ScriptError {}

/// True for flowops that open a connection: `connect`, or `accept` (the server connects).
pub(crate) fn opens(k: FlowOpKind) -> bool {
    matches!(k, FlowOpKind::Connect | FlowOpKind::Accept)
}

/// True for flowops that move data.
pub(crate) fn is_io(k: FlowOpKind) -> bool {
    matches!(k, FlowOpKind::Read | FlowOpKind::Write | FlowOpKind::Send | FlowOpKind::Recv)
}

fn io_of(op: &FlowOp) -> Option<Io> {
    let size = op.size.clone().unwrap_or(Size::Fixed(0));
    let one = match op.kind {
        FlowOpKind::Write | FlowOpKind::Send => Io::Write(size),
        FlowOpKind::Read | FlowOpKind::Recv => Io::Read(size),
        _ => return None,
    };
    Some(one)
}

fn push_io(steps: &mut Vec<Io>, op: &FlowOp) {
    if let Some(io) = io_of(op) {
        for _ in 0..op.count.max(1) {
            steps.push(io.clone());
        }
    }
}

/// Derives the connection script of `group` and checks the rules.
pub fn derive(group: &Group) -> Result<ConnScript, ScriptError> {
    let err = |line: u32, element: &'static str, message: String| ScriptError { line, element, message };
    let mut scripts: Vec<(u32, Vec<Segment>)> = Vec::new();
    let mut open: Option<(u32, Vec<Segment>)> = None;
    let mut nodelay = false;
    let mut seeded = false;
    let mut udp: Option<bool> = None;
    let mut reverse: Option<(u32, bool)> = None;

    for t in &group.transactions {
        let has_io = t.flowops.iter().any(|f| is_io(f.kind));
        let opens_or_closes = t.flowops.iter().any(|f| opens(f.kind) || f.kind == FlowOpKind::Disconnect);
        for f in &t.flowops {
            if opens(f.kind) {
                let rev = f.kind == FlowOpKind::Accept;
                match reverse {
                    None => reverse = Some((f.line, rev)),
                    Some((line, r)) if r != rev => {
                        return Err(err(
                            f.line,
                            "flowop",
                            format!(
                                "a group opens all its connections one way: this {} differs from line {line}; put connects and accepts in separate groups",
                                f.kind
                            ),
                        ));
                    }
                    _ => {}
                }
                if rev && f.conn.protocol == Protocol::Udp {
                    return Err(err(
                        f.line,
                        "flowop",
                        "accept works over TCP only (a UDP server cannot open a connection to the client); use connect with protocol=udp".into(),
                    ));
                }
                nodelay |= f.conn.tcp_nodelay;
                match (udp, f.conn.protocol == Protocol::Udp) {
                    (None, u) => udp = Some(u),
                    (Some(a), b) if a != b => {
                        return Err(err(
                            f.line,
                            "flowop",
                            "a group's connects must all use the same protocol; put TCP and UDP in separate groups"
                                .into(),
                        ));
                    }
                    _ => {}
                }
            }
            if matches!(f.size, Some(Size::Rand { .. })) {
                seeded = true;
            }
        }
        let repeat_once = matches!(t.repeat, Repeat::Iterations(1));
        if !opens_or_closes {
            if let Some((_, segs)) = open.as_mut()
                && has_io
            {
                let mut steps = Vec::new();
                for f in &t.flowops {
                    push_io(&mut steps, f);
                }
                let times = match t.repeat {
                    Repeat::Iterations(1) => Times::Once,
                    Repeat::Iterations(n) => Times::Count(n),
                    Repeat::Duration(_) => Times::Timed,
                };
                segs.push(Segment { times, steps, counts: true });
            } else if has_io {
                let line = t.flowops.iter().find(|f| is_io(f.kind)).map_or(t.line, |f| f.line);
                return Err(err(
                    line,
                    "flowop",
                    "reads and writes need a connection: add a connect (or accept) flowop before them".into(),
                ));
            }
            continue;
        }
        // A transaction that opens or closes connections is walked flowop by flowop. If it
        // repeats, each pass must open and close its own connection (connect-request-response).
        if !repeat_once && open.is_some() {
            return Err(err(t.line, "transaction", "a repeated transaction with connect or disconnect must open and close its own connection; disconnect before it".into()));
        }
        let mut once: Vec<Io> = Vec::new();
        for f in &t.flowops {
            match f.kind {
                k if opens(k) => {
                    if open.is_some() {
                        return Err(err(
                            f.line,
                            "flowop",
                            format!(
                                "{k} while a connection is open: one connection per thread at a time; disconnect first"
                            ),
                        ));
                    }
                    open = Some((f.line, Vec::new()));
                    once.clear();
                }
                FlowOpKind::Disconnect => {
                    let Some((line, mut segs)) = open.take() else {
                        return Err(err(f.line, "flowop", "disconnect without a connection".into()));
                    };
                    if !once.is_empty() {
                        segs.push(Segment { times: Times::Once, steps: std::mem::take(&mut once), counts: has_io });
                    }
                    scripts.push((line, segs));
                }
                k if is_io(k) => {
                    if open.is_none() {
                        return Err(err(
                            f.line,
                            "flowop",
                            "reads and writes need a connection: add a connect (or accept) flowop before them".into(),
                        ));
                    }
                    push_io(&mut once, f);
                }
                _ => {}
            }
        }
        if !repeat_once && open.is_some() {
            return Err(err(
                t.line,
                "transaction",
                "a repeated transaction that connects must also disconnect in the same transaction".into(),
            ));
        }
        if let Some((_, segs)) = open.as_mut()
            && !once.is_empty()
        {
            segs.push(Segment { times: Times::Once, steps: once, counts: has_io });
        }
    }
    if let Some(s) = open.take() {
        scripts.push(s);
    }
    let Some((first_line, first)) = scripts.first().cloned() else {
        return Err(err(group.line, "group", "the group never connects: add a connect (or accept) flowop".into()));
    };
    if let Some((line, _)) = scripts.iter().find(|(_, s)| *s != first) {
        return Err(err(
            *line,
            "flowop",
            format!(
                "this connection is followed by other flowops than the one opened on line {first_line}; put each connection pattern in a group of its own"
            ),
        ));
    }
    check_timed(&first, first_line)?;
    let udp = udp.unwrap_or(false);
    if udp {
        check_udp(group, &first, first_line)?;
    }
    Ok(ConnScript { segments: first, seeded, nodelay, udp, reverse: reverse.is_some_and(|(_, r)| r) })
}

fn check_udp(group: &Group, segs: &[Segment], line: u32) -> Result<(), ScriptError> {
    for f in group.transactions.iter().flat_map(|t| &t.flowops) {
        if let Some(size) = &f.size
            && is_io(f.kind)
            && (size.max() > MAX_DATAGRAM || size.min() == 0)
        {
            return Err(ScriptError {
                line: f.line,
                element: "flowop",
                message: format!("a UDP datagram carries 1 to {MAX_DATAGRAM} bytes; size {size} does not fit"),
            });
        }
    }
    if segs.iter().any(|s| s.times == Times::Timed && s.server_driven()) {
        return Err(ScriptError {
            line,
            element: "flowop",
            message: "a timed UDP transaction must start with a write (the server only answers datagrams)".into(),
        });
    }
    Ok(())
}

fn check_timed(segs: &[Segment], line: u32) -> Result<(), ScriptError> {
    let err = |message: String| ScriptError { line, element: "flowop", message };
    let Some(i) = segs.iter().position(|s| s.times == Times::Timed) else { return Ok(()) };
    let rest = &segs[i + 1..];
    if rest.iter().any(|s| s.times == Times::Timed) {
        return Err(err(
            "a connection may have one timed (duration) transaction; use one connection per timed phase".into()
        ));
    }
    if segs[i].server_driven() {
        if segs[i].steps.iter().any(|io| matches!(io, Io::Write(_))) {
            return Err(err("a timed transaction that starts with a read may only read (the server sends until the client half-closes)".into()));
        }
        if rest.iter().any(|s| !s.steps.is_empty()) {
            return Err(err(
                "after a timed transaction whose first step is a read, the connection can only disconnect".into(),
            ));
        }
    } else if rest.iter().flat_map(|s| &s.steps).any(|io| matches!(io, Io::Write(_))) {
        return Err(err("after a timed transaction the client can only read on that connection (it has signalled the end by half-closing)".into()));
    }
    Ok(())
}

/// A small, fast generator both ends seed identically (splitmix64).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The size to use for `s`.
    pub fn size(&mut self, s: &Size) -> u64 {
        match s {
            Size::Fixed(n) => *n,
            Size::Rand { .. } => s.pick(self.next_u64()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::parse;

    fn group(xml: &str) -> Group {
        parse(xml, "t.xml", &|_| None).unwrap().groups.remove(0)
    }

    const RR: &str = r#"<profile name="rr"><group nthreads="2">
<transaction iterations="1"><flowop type="connect" options="remotehost=h protocol=tcp tcp_nodelay"/></transaction>
<transaction duration="5s"><flowop type="write" options="size=200"/><flowop type="read" options="size=1000"/></transaction>
<transaction iterations="1"><flowop type="disconnect"/></transaction>
</group></profile>"#;

    #[test]
    fn request_response_is_one_timed_client_driven_segment() {
        let s = derive(&group(RR)).unwrap();
        assert!(s.nodelay && !s.seeded);
        assert_eq!(s.segments.len(), 1);
        assert_eq!(s.segments[0].times, Times::Timed);
        assert_eq!(s.segments[0].steps, vec![Io::Write(Size::Fixed(200)), Io::Read(Size::Fixed(1000))]);
        assert!(!s.segments[0].server_driven());
    }

    #[test]
    fn connect_request_response_is_once_per_connection() {
        let g = group(
            r#"<profile name="crr"><group nthreads="1"><transaction duration="5s">
<flowop type="connect" options="remotehost=h"/><flowop type="write" options="size=64"/>
<flowop type="read" options="size=8k"/><flowop type="disconnect"/></transaction></group></profile>"#,
        );
        let s = derive(&g).unwrap();
        assert_eq!(
            s.segments,
            vec![Segment {
                times: Times::Once,
                steps: vec![Io::Write(Size::Fixed(64)), Io::Read(Size::Fixed(8192))],
                counts: true
            }]
        );
    }

    #[test]
    fn streaming_read_is_server_driven_and_counts_flowop_repeats() {
        let g = group(
            r#"<profile name="s"><group nthreads="1">
<transaction iterations="1"><flowop type="connect" options="remotehost=h"/></transaction>
<transaction duration="5s"><flowop type="read" options="size=30k count=2"/></transaction>
</group></profile>"#,
        );
        let s = derive(&g).unwrap();
        assert!(s.segments[0].server_driven());
        assert_eq!(s.segments[0].steps.len(), 2);
    }

    #[test]
    fn shapes_without_exact_counts_are_refused_with_the_line() {
        let e = derive(&group(
            r#"<profile name="x"><group nthreads="1">
<transaction iterations="1"><flowop type="connect" options="remotehost=h"/></transaction>
<transaction duration="1s"><flowop type="read" options="size=10"/></transaction>
<transaction iterations="1"><flowop type="write" options="size=10"/></transaction>
</group></profile>"#,
        ))
        .unwrap_err();
        assert!(e.message.contains("can only disconnect"), "{e}");
        let e = derive(&group(
            r#"<profile name="x"><group nthreads="1">
<transaction iterations="1"><flowop type="write" options="size=10"/></transaction>
</group></profile>"#,
        ))
        .unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("need a connection"), "{e}");
        let e = derive(&group(r#"<profile name="x"><group nthreads="1"><transaction iterations="1"><flowop type="nop"/></transaction></group></profile>"#)).unwrap_err();
        assert_eq!(e.element, "group");
    }

    #[test]
    fn accept_opens_a_reverse_connection_with_the_same_script() {
        let s = derive(&group(&RR.replace(r#"type="connect" options="remotehost=h"#, r#"type="accept" options=""#)))
            .unwrap();
        assert!(s.reverse && s.nodelay);
        assert_eq!(s.segments, derive(&group(RR)).unwrap().segments);
        assert!(!derive(&group(RR)).unwrap().reverse);
    }

    #[test]
    fn both_ends_draw_the_same_sizes() {
        let s = Size::Rand { min: 10, max: 20 };
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..1000 {
            let x = a.size(&s);
            assert_eq!(x, b.size(&s));
            assert!((10..=20).contains(&x));
        }
    }
}
