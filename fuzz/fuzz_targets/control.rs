//! Fuzzes what a switch daemon reads from its control socket: the input is the byte stream
//! a client sends. It is read with the daemon's own reader (`proto::read_request`, with a
//! small line limit so that over-long lines are reached too), and each request goes
//! through the checks the daemon makes before acting on it. Besides "never panics", the
//! reader always makes progress and never yields more requests than there are lines; and
//! an answer the daemon writes reads back as the same answer.

#![no_main]

use std::io::{BufReader, Cursor};

use libfuzzer_sys::fuzz_target;
use sluice_api::config::{DatapathKind, check_datapath};
use sluice_api::proto::{Incoming, Request, Response, read_request};
use sluice_wire::MacAddr;

fuzz_target!(|data: &[u8]| {
    let max = 64 + usize::from(data.first().copied().unwrap_or(0)) * 8;
    let mut r = BufReader::with_capacity(16, Cursor::new(data));
    let lines = data.split(|&b| b == b'\n').count();
    let mut requests = 0;
    loop {
        match read_request(&mut r, max) {
            Incoming::End | Incoming::TooLong => break,
            Incoming::Malformed(why) => assert!(why.starts_with("malformed request")),
            Incoming::Request(req) => {
                requests += 1;
                assert!(requests <= lines);
                match req {
                    Request::PortAdd { port, .. } => {
                        if port.validate().is_ok() {
                            let _ = check_datapath(&port, DatapathKind::User);
                            let _ = check_datapath(&port, DatapathKind::Kernel);
                            let _ = port.policy();
                        }
                    }
                    Request::FibAdd { mac, .. } | Request::FibDel { mac, .. } => {
                        let _ = mac.parse::<MacAddr>();
                    }
                    _ => {}
                }
            }
        }
    }
    let resp = Response { ok: false, error: Some(String::from_utf8_lossy(data).into_owned()), data: None };
    let text = serde_json::to_string(&resp).unwrap();
    let back: Response = serde_json::from_str(&text).unwrap();
    assert_eq!(back.error, resp.error);
});
