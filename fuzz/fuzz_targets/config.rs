//! Fuzzes the switch's configuration reader (`sluice switch run --config FILE`): the input
//! is the file's text (non-UTF-8 input is read lossily). Besides "never panics", an error
//! names a line and column inside the text, and whatever is accepted keeps the promises
//! the daemon relies on: a valid switch name, every port valid and named once, static MAC
//! entries unicast on ports that exist, an MTU in range.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use sluice_api::config::{check_switch_name, parse};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match parse(&text, Path::new("fuzz.toml")) {
        Err(e) => {
            if let Some(line) = e.line {
                assert!(line >= 1 && line <= text.lines().count().max(1) + 1, "line {line} of {text:?}: {e}");
            }
            assert!(!e.to_string().is_empty());
        }
        Ok(s) => {
            check_switch_name(&s.name).unwrap();
            assert!(sluice_switch::switch_mtu_range().contains(&s.core.mtu), "{}", s.core.mtu);
            for (i, p) in s.ports.iter().enumerate() {
                p.validate().unwrap();
                assert!(s.ports[..i].iter().all(|q| q.name != p.name), "port {:?} twice", p.name);
            }
            for (vlan, mac, port) in &s.macs {
                assert!(!mac.is_multicast() && !mac.is_zero(), "{mac}");
                assert!((1..=4094).contains(vlan), "{vlan}");
                assert!(s.ports.iter().any(|p| &p.name == port), "{port:?}");
            }
        }
    }
});
