//! What every data connection of a group does, derived from the client's flowops, and the
//! rules that let both sides end timed loops with exact counts (docs/architecture.md, "The
//! workload modeler").
//!
//! A connection's life is a list of [`Segment`]s: flowops run once (between `connect` and the
//! end of its transaction, or up to `disconnect`), or whole transactions repeated a known
//! number of times or until time is up. The server runs the same segments mirrored.
//!
//! What a client may ask of a server is bounded here, before anything is bound or spawned
//! (docs/architecture.md, "The workload modeler's server"): a flowop's `count` stays a
//! repeat count on one [`Step`] (never one step per repetition), a script has at most
//! [`MAX_STEPS`] steps, a run at most [`MAX_GROUPS`] groups and [`MAX_RUN_CONNECTIONS`]
//! connections, the server opens no privileged data port, and a UDP script never makes the
//! server answer one datagram with more than [`MAX_ANSWERS`].

use std::fmt;
use std::time::Duration;

use crate::profile::{FlowOp, FlowOpKind, Group, MAX_DURATION, Profile, Protocol, Repeat, Size};

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

/// One data step of a connection, run `count` times in a row.
///
/// Two steps are equal when they do the same thing: `line` (where the step was written
/// first) is not compared, so the same flowops after two `connect`s make equal scripts.
#[derive(Clone, Debug)]
pub struct Step {
    /// What the step does, from the client's side.
    pub io: Io,
    /// How many times in a row (≥ 1): a flowop's `count`, plus identical flowops that
    /// follow it.
    pub count: u64,
    /// Line of the flowop the step comes from.
    pub line: u32,
}

impl PartialEq for Step {
    fn eq(&self, other: &Self) -> bool {
        self.io == other.io && self.count == other.count
    }
}

impl Eq for Step {}

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
    pub steps: Vec<Step>,
    /// Each pass completes one transaction of the profile (it belongs to a transaction that
    /// moves data, and holds that transaction's data steps).
    pub counts: bool,
}

impl Segment {
    /// The first step is a client read: the server sends first (it may run ahead).
    pub fn server_driven(&self) -> bool {
        matches!(self.steps.first(), Some(Step { io: Io::Read(_), .. }))
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
    /// The longest a client thread of the group may leave its connection untouched on
    /// purpose (its `think`s and `rate` pacing, see [`pause`]); the server allows a
    /// connection that much silence on top of its own allowance.
    pub pause: Duration,
}

/// Largest UDP payload (IPv4).
pub const MAX_DATAGRAM: u64 = 65_507;

/// The most steps one connection script may have (after identical neighbours are merged
/// into one step with a count).
pub const MAX_STEPS: usize = 4096;

/// The most groups a run may have (uperf's own limit, `MAXTHREADGROUPS`).
pub const MAX_GROUPS: usize = 1024;

/// The most connections (threads or processes of all groups together) a run may have.
pub const MAX_RUN_CONNECTIONS: u64 = crate::profile::MAX_STRANDS as u64;

/// The most datagrams the server sends in answer to one datagram it receives.
pub const MAX_ANSWERS: u64 = 4;

/// The lowest data port a `connect`'s `port=` may name: lower ports are privileged, and the
/// server does not open them for a client.
pub const MIN_DATA_PORT: u16 = 1024;

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

/// Appends `op`'s data step, merged into the last step if that one does the same.
fn push_io(steps: &mut Vec<Step>, op: &FlowOp) {
    let Some(io) = io_of(op) else { return };
    let count = op.count.max(1);
    match steps.last_mut() {
        Some(last) if last.io == io => last.count = last.count.saturating_add(count),
        _ => steps.push(Step { io, count, line: op.line }),
    }
}

/// Refuses a script of more than [`MAX_STEPS`] steps, naming the first step past them.
fn check_steps(segs: &[Segment]) -> Result<(), ScriptError> {
    match segs.iter().flat_map(|s| &s.steps).nth(MAX_STEPS) {
        None => Ok(()),
        Some(s) => Err(ScriptError {
            line: s.line,
            element: "flowop",
            message: format!(
                "a connection may have at most {MAX_STEPS} reads and writes (a flowop's count, and identical flowops in a row, make one); this one is past that: repeat them with a transaction's iterations instead"
            ),
        }),
    }
}

/// Derives the connection script of every group of `profile`, after checking what a run may
/// ask of a server as a whole: at most [`MAX_GROUPS`] groups and [`MAX_RUN_CONNECTIONS`]
/// connections.
pub fn derive_all(profile: &Profile) -> Result<Vec<ConnScript>, ScriptError> {
    if let Some(g) = profile.groups.get(MAX_GROUPS) {
        return Err(ScriptError {
            line: g.line,
            element: "group",
            message: format!(
                "a run may have at most {MAX_GROUPS} groups (uperf's limit too); this is group {}: merge groups that run the same flowops",
                MAX_GROUPS + 1
            ),
        });
    }
    let mut conns = 0u64;
    for g in &profile.groups {
        conns += u64::from(g.count);
        if conns > MAX_RUN_CONNECTIONS {
            return Err(ScriptError {
                line: g.line,
                element: "group",
                message: format!(
                    "a run may have at most {MAX_RUN_CONNECTIONS} connections (nthreads or nprocs of all groups together); this group brings it to {conns}"
                ),
            });
        }
    }
    profile.groups.iter().map(derive).collect()
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
                if let (FlowOpKind::Connect, Some(port)) = (f.kind, f.conn.port)
                    && port < MIN_DATA_PORT
                {
                    return Err(err(
                        f.line,
                        "flowop",
                        format!(
                            "port={port} is privileged: the bench server opens data ports from {MIN_DATA_PORT} to 65535 only; pick one there or leave port= out"
                        ),
                    ));
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
        let mut once: Vec<Step> = Vec::new();
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
    check_steps(&first)?;
    check_timed(&first, first_line)?;
    let udp = udp.unwrap_or(false);
    if udp {
        check_udp(group, &first, first_line)?;
    }
    Ok(ConnScript {
        segments: first,
        seeded,
        nodelay,
        udp,
        reverse: reverse.is_some_and(|(_, r)| r),
        pause: pause(group),
    })
}

/// The longest a client thread of `group` may leave its connection untouched on purpose:
/// an upper bound summed over the transactions. A transaction that moves data adds one
/// pass's `think`s and its `rate` interval (a silence spans at most that much of it); one
/// that moves none adds all its passes (or its duration and one pass). At most
/// [`MAX_DURATION`].
pub fn pause(group: &Group) -> Duration {
    let cap = MAX_DURATION.as_nanos();
    let mut total: u128 = 0;
    for t in &group.transactions {
        let mut pass: u128 = 0;
        for f in t.flowops.iter().filter(|f| f.kind == FlowOpKind::Think) {
            let think = f.think.unwrap_or_default().as_nanos();
            pass = pass.saturating_add(think.saturating_mul(u128::from(f.count.max(1))));
        }
        if let Some(rate) = t.rate.filter(|r| *r > 0.0) {
            pass = pass.saturating_add((1e9 / rate) as u128);
        }
        let idle = if t.flowops.iter().any(|f| is_io(f.kind)) {
            pass
        } else {
            match t.repeat {
                Repeat::Iterations(n) => pass.saturating_mul(u128::from(n)),
                Repeat::Duration(d) => d.as_nanos().saturating_add(pass),
            }
        };
        total = total.saturating_add(idle).min(cap);
    }
    Duration::from_nanos(total.min(cap) as u64)
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
    if let Some(first) = segs.iter().flat_map(|s| &s.steps).next()
        && matches!(first.io, Io::Read(_))
    {
        return Err(ScriptError {
            line: first.line,
            element: "flowop",
            message: "a UDP connection must start with a write: the server only answers datagrams, so a read first would wait for ever".into(),
        });
    }
    if segs.iter().any(|s| s.times == Times::Timed && s.server_driven()) {
        return Err(ScriptError {
            line,
            element: "flowop",
            message: "a timed UDP transaction must start with a write (the server only answers datagrams)".into(),
        });
    }
    check_answers(segs)
}

/// Refuses a UDP script that makes the client read more than [`MAX_ANSWERS`] datagrams
/// in a row without writing one: the server answers each datagram with at most that many.
fn check_answers(segs: &[Segment]) -> Result<(), ScriptError> {
    let refuse = |line: u32, run: u64| ScriptError {
        line,
        element: "flowop",
        message: format!(
            "the client would read {} datagrams in a row without writing one; the server answers each datagram with at most {MAX_ANSWERS}: put a write between the reads, or lower count or iterations",
            if run == u64::MAX { "unboundedly many".to_string() } else { run.to_string() }
        ),
    };
    // Server answers sent since the client's last datagram.
    let mut run = 0u64;
    for seg in segs {
        let passes = match seg.times {
            Times::Once => 1,
            Times::Count(k) => k,
            Times::Timed => u64::MAX,
        };
        if seg.steps.iter().all(|s| matches!(s.io, Io::Read(_))) {
            let per_pass = seg.steps.iter().fold(0u64, |a, s| a.saturating_add(s.count));
            run = run.saturating_add(per_pass.saturating_mul(passes));
            if run > MAX_ANSWERS {
                return Err(refuse(seg.steps.first().map_or(0, |s| s.line), run));
            }
            continue;
        }
        // Two passes show the run across the boundary between passes.
        for _ in 0..passes.min(2) {
            for s in &seg.steps {
                match s.io {
                    Io::Write(_) => run = 0,
                    Io::Read(_) => {
                        run = run.saturating_add(s.count);
                        if run > MAX_ANSWERS {
                            return Err(refuse(s.line, run));
                        }
                    }
                }
            }
        }
        if seg.times == Times::Timed {
            // The loop ends on the client's empty datagram.
            run = 0;
        }
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
        if segs[i].steps.iter().any(|s| matches!(s.io, Io::Write(_))) {
            return Err(err("a timed transaction that starts with a read may only read (the server sends until the client half-closes)".into()));
        }
        if rest.iter().any(|s| !s.steps.is_empty()) {
            return Err(err(
                "after a timed transaction whose first step is a read, the connection can only disconnect".into(),
            ));
        }
    } else if rest.iter().flat_map(|s| &s.steps).any(|s| matches!(s.io, Io::Write(_))) {
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

    fn step(io: Io, count: u64) -> Step {
        Step { io, count, line: 0 }
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
        assert_eq!(
            s.segments[0].steps,
            vec![step(Io::Write(Size::Fixed(200)), 1), step(Io::Read(Size::Fixed(1000)), 1)]
        );
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
                steps: vec![step(Io::Write(Size::Fixed(64)), 1), step(Io::Read(Size::Fixed(8192)), 1)],
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
        assert_eq!(s.segments[0].steps, vec![step(Io::Read(Size::Fixed(30 * 1024)), 2)]);
    }

    /// A flowop's count is one step with a count, never a step per repetition: a count of
    /// u64::MAX costs what a count of 2 does. Identical neighbours merge, so `write count=2`
    /// and two `write`s make the same script.
    #[test]
    fn counts_stay_counts_and_identical_neighbours_merge() {
        let g = group(
            r#"<profile name="c"><group nthreads="1"><transaction iterations="1">
<flowop type="connect" options="remotehost=h"/>
<flowop type="write" options="size=1 count=18446744073709551615"/>
<flowop type="write" options="size=1 count=2"/>
<flowop type="read" options="size=1"/>
<flowop type="disconnect"/></transaction></group></profile>"#,
        );
        let s = derive(&g).unwrap();
        assert_eq!(
            s.segments[0].steps,
            vec![step(Io::Write(Size::Fixed(1)), u64::MAX), step(Io::Read(Size::Fixed(1)), 1)]
        );
        assert_eq!(s.segments[0].steps[0].line, 3);
        let two = |ops: &str| {
            derive(&group(&format!(
                r#"<profile name="c"><group nthreads="1"><transaction iterations="1"><flowop type="connect" options="remotehost=h"/>{ops}</transaction></group></profile>"#
            )))
            .unwrap()
            .segments
        };
        assert_eq!(
            two(r#"<flowop type="write" options="size=8"/><flowop type="write" options="size=8"/>"#),
            two(r#"<flowop type="write" options="size=8 count=2"/>"#)
        );
    }

    /// A profile of N distinct reads and writes: the script's length is bounded, and the
    /// refusal names the first flowop past the bound.
    #[test]
    fn a_script_longer_than_max_steps_is_refused_at_its_flowop() {
        let ops: String =
            (0..=MAX_STEPS).map(|i| format!("<flowop type=\"write\" options=\"size={}\"/>\n", i % 2 + 1)).collect();
        let xml = format!(
            "<profile name=\"l\"><group nthreads=\"1\"><transaction iterations=\"1\">\n<flowop type=\"connect\" options=\"remotehost=h\"/>\n{ops}</transaction></group></profile>"
        );
        let e = derive(&group(&xml)).unwrap_err();
        assert_eq!((e.line, e.element), (MAX_STEPS as u32 + 3, "flowop"), "{e}");
        assert!(e.message.contains("at most 4096"), "{e}");
    }

    fn profile(xml: &str) -> Profile {
        parse(xml, "t.xml", &|_| None).unwrap()
    }

    #[test]
    fn groups_and_connections_per_run_are_bounded_and_named() {
        let g = |n: u32| {
            format!(
                "<group nthreads=\"{n}\"><transaction iterations=\"1\"><flowop type=\"connect\" options=\"remotehost=h\"/></transaction></group>\n"
            )
        };
        let many: String = (0..=MAX_GROUPS).map(|_| g(1)).collect();
        let e = derive_all(&profile(&format!("<profile name=\"g\">\n{many}</profile>"))).unwrap_err();
        assert_eq!((e.line, e.element), (MAX_GROUPS as u32 + 2, "group"), "{e}");
        assert!(e.message.contains("at most 1024 groups"), "{e}");
        let ok: String = (0..MAX_GROUPS).map(|_| g(1)).collect();
        assert_eq!(derive_all(&profile(&format!("<profile name=\"g\">{ok}</profile>"))).unwrap().len(), MAX_GROUPS);
        let e = derive_all(&profile(&format!("<profile name=\"c\">\n{}{}</profile>", g(6000), g(4001)))).unwrap_err();
        assert_eq!((e.line, e.element), (3, "group"), "{e}");
        assert!(e.message.contains("at most 10000 connections") && e.message.contains("10001"), "{e}");
        assert!(derive_all(&profile(&format!("<profile name=\"c\">{}{}</profile>", g(6000), g(4000)))).is_ok());
    }

    #[test]
    fn privileged_data_ports_are_refused() {
        let e = derive(&group(&RR.replace("protocol=tcp", "port=22 protocol=tcp"))).unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("port=22 is privileged"), "{e}");
        assert!(derive(&group(&RR.replace("protocol=tcp", "port=1024 protocol=tcp"))).is_ok());
    }

    fn udp(body: &str) -> Result<ConnScript, ScriptError> {
        derive(&group(&format!(
            "<profile name=\"u\"><group nthreads=\"1\">\n<transaction iterations=\"1\"><flowop type=\"connect\" options=\"remotehost=h protocol=udp\"/></transaction>\n{body}</group></profile>"
        )))
    }

    /// The shape of the amplification the review found: a UDP connection that only reads,
    /// for ever. Refused, as is any script that would have the server answer one datagram
    /// with more than MAX_ANSWERS; request-response shapes run.
    #[test]
    fn udp_scripts_never_need_more_than_max_answers_per_datagram() {
        let e = udp(r#"<transaction iterations="18446744073709551615"><flowop type="read" options="size=60000"/></transaction>"#)
            .unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.message.contains("must start with a write"), "{e}");
        let e = udp(r#"<transaction iterations="1"><flowop type="write" options="size=1"/></transaction>
<transaction iterations="18446744073709551615"><flowop type="read" options="size=60000"/></transaction>"#)
        .unwrap_err();
        assert_eq!(e.line, 4);
        assert!(e.message.contains("at most 4") && e.message.contains("unboundedly many"), "{e}");
        let e = udp(r#"<transaction duration="1s"><flowop type="write" options="size=1"/><flowop type="read" options="size=1 count=1000000000000"/></transaction>"#)
            .unwrap_err();
        assert!(e.line == 3 && e.message.contains("1000000000000"), "{e}");
        // Three answers at the end of one pass and two at the start of the next: five in a row.
        let e = udp(r#"<transaction iterations="3"><flowop type="read" options="size=1 count=2"/><flowop type="write" options="size=1"/><flowop type="read" options="size=1 count=3"/></transaction>"#)
            .unwrap_err();
        assert!(e.message.contains("must start with a write"), "{e}");
        let e = udp(r#"<transaction iterations="1"><flowop type="write" options="size=1"/></transaction>
<transaction iterations="3"><flowop type="read" options="size=1 count=2"/><flowop type="write" options="size=1"/><flowop type="read" options="size=1 count=3"/></transaction>"#)
            .unwrap_err();
        assert!(e.line == 4 && e.message.contains(" 5 datagrams"), "{e}");
        for ok in [
            r#"<transaction duration="1s"><flowop type="write" options="size=200"/><flowop type="read" options="size=1000 count=4"/></transaction>"#,
            r#"<transaction iterations="300"><flowop type="write" options="size=64"/><flowop type="read" options="size=8k"/></transaction>"#,
            r#"<transaction duration="1s"><flowop type="write" options="size=200"/></transaction><transaction iterations="4"><flowop type="read" options="size=10"/></transaction>"#,
        ] {
            udp(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn the_pause_covers_thinks_and_pacing() {
        let s = derive(&group(RR)).unwrap();
        assert_eq!(s.pause, Duration::ZERO);
        let g = group(
            r#"<profile name="p"><group nthreads="1">
<transaction iterations="1"><flowop type="connect" options="remotehost=h"/></transaction>
<transaction iterations="3"><flowop type="think" options="duration=2s"/></transaction>
<transaction duration="5s" rate="2"><flowop type="write" options="size=1"/><flowop type="think" options="duration=1s count=3"/></transaction>
<transaction duration="7s"><flowop type="nop"/></transaction>
</group></profile>"#,
        );
        assert_eq!(pause(&g), Duration::from_millis(6_000 + 3_500 + 7_000));
        let g = group(
            r#"<profile name="p"><group nthreads="1"><transaction iterations="18446744073709551615"><flowop type="think" options="duration=8760h"/></transaction></group></profile>"#,
        );
        assert_eq!(pause(&g), MAX_DURATION);
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
