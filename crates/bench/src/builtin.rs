//! The built-in profiles: the reference studies' workloads as profile.xml texts, so that
//! `sluice bench profiles --show NAME` prints something a user can copy and edit. `$h` is the
//! server (replaced by `--to`), `$d` the duration of the timed transaction (default 20 s,
//! replaced by `--duration`), `$n` the connections (replaced by `--conns`).

use crate::profile::{Profile, ProfileError, parse};

/// (name, what it is, profile.xml)
pub const BUILTINS: &[(&str, &str, &str)] = &[
    ("rr-200x1000", "request-response: 200-byte request, 1000-byte response, on one open connection", RR_200X1000),
    ("crr-64x8k", "connect-request-response: connect, 64-byte request, 8 KiB response, disconnect", CRR_64X8K),
    ("str-20x20m", "streaming: 20-byte request, 20 MiB response", STR_20X20M),
    ("rr1c-200x1000", "request-response 200/1000 bytes with TCP_NODELAY", RR1C_200X1000),
    ("str-readx30k", "streaming read: the server sends 30 KiB chunks, the client reads", STR_READX30K),
    (
        "rr1c-200x200",
        "request-response 200/200 bytes with TCP_NODELAY: what `sockperf ping-pong -m 200` does (calibration)",
        RR1C_200X200,
    ),
    (
        "str-write128k",
        "streaming write: the client writes 128 KiB chunks, the server reads: what iperf3 does (calibration)",
        STR_WRITE128K,
    ),
];

/// The profile text of built-in `name`.
pub fn get(name: &str) -> Option<&'static str> {
    BUILTINS.iter().find(|b| b.0 == name).map(|b| b.2)
}

/// Names of the built-ins, for error messages.
pub fn names() -> String {
    BUILTINS.iter().map(|b| b.0).collect::<Vec<_>>().join(", ")
}

const RR_200X1000: &str = r#"<?xml version="1.0"?>
<profile name="rr-200x1000">
  <group nthreads="$n">
    <transaction iterations="1">
      <flowop type="connect" options="remotehost=$h protocol=tcp tcp_nodelay"/>
    </transaction>
    <transaction duration="$d">
      <flowop type="write" options="size=200"/>
      <flowop type="read" options="size=1000"/>
    </transaction>
    <transaction iterations="1">
      <flowop type="disconnect"/>
    </transaction>
  </group>
</profile>
"#;

const CRR_64X8K: &str = r#"<?xml version="1.0"?>
<profile name="crr-64x8k">
  <group nthreads="$n">
    <transaction duration="$d">
      <flowop type="connect" options="remotehost=$h protocol=tcp tcp_nodelay"/>
      <flowop type="write" options="size=64"/>
      <flowop type="read" options="size=8k"/>
      <flowop type="disconnect"/>
    </transaction>
  </group>
</profile>
"#;

const STR_20X20M: &str = r#"<?xml version="1.0"?>
<profile name="str-20x20m">
  <group nthreads="$n">
    <transaction iterations="1">
      <flowop type="connect" options="remotehost=$h protocol=tcp"/>
    </transaction>
    <transaction duration="$d">
      <flowop type="write" options="size=20"/>
      <flowop type="read" options="size=20m"/>
    </transaction>
    <transaction iterations="1">
      <flowop type="disconnect"/>
    </transaction>
  </group>
</profile>
"#;

const RR1C_200X1000: &str = r#"<?xml version="1.0"?>
<profile name="rr1c-200x1000">
  <group nprocs="$n">
    <transaction iterations="1">
      <flowop type="connect" options="remotehost=$h protocol=tcp tcp_nodelay"/>
    </transaction>
    <transaction duration="$d">
      <flowop type="write" options="size=200"/>
      <flowop type="read" options="size=1000"/>
    </transaction>
    <transaction iterations="1">
      <flowop type="disconnect"/>
    </transaction>
  </group>
</profile>
"#;

const STR_READX30K: &str = r#"<?xml version="1.0"?>
<profile name="str-readx30k">
  <group nthreads="$n">
    <transaction iterations="1">
      <flowop type="connect" options="remotehost=$h protocol=tcp"/>
    </transaction>
    <transaction duration="$d">
      <flowop type="read" options="size=30k"/>
    </transaction>
    <transaction iterations="1">
      <flowop type="disconnect"/>
    </transaction>
  </group>
</profile>
"#;

const RR1C_200X200: &str = r#"<?xml version="1.0"?>
<profile name="rr1c-200x200">
  <group nthreads="$n">
    <transaction iterations="1">
      <flowop type="connect" options="remotehost=$h protocol=tcp tcp_nodelay"/>
    </transaction>
    <transaction duration="$d">
      <flowop type="write" options="size=200"/>
      <flowop type="read" options="size=200"/>
    </transaction>
    <transaction iterations="1">
      <flowop type="disconnect"/>
    </transaction>
  </group>
</profile>
"#;

const STR_WRITE128K: &str = r#"<?xml version="1.0"?>
<profile name="str-write128k">
  <group nthreads="$n">
    <transaction iterations="1">
      <flowop type="connect" options="remotehost=$h protocol=tcp"/>
    </transaction>
    <transaction duration="$d">
      <flowop type="write" options="size=128k"/>
    </transaction>
    <transaction iterations="1">
      <flowop type="disconnect"/>
    </transaction>
  </group>
</profile>
"#;

/// Parses a built-in profile's text with its variables filled: the server `host`, a 20 s
/// duration and one connection (the callers replace the last two as they need).
pub fn profile(name: &str, text: &str, host: &str) -> Result<Profile, ProfileError> {
    let host = host.to_string();
    let lookup = move |v: &str| match v {
        "h" => Some(host.clone()),
        "d" => Some("20s".into()),
        "n" => Some("1".into()),
        _ => std::env::var(v).ok(),
    };
    parse(text, name, &lookup)
}
