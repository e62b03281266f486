//! Fuzzes what a switch daemon reads from its control socket: the input is the byte stream
//! a client sends. It is read with the daemon's own reader (`proto::read_request`, with a
//! small line limit so that over-long lines are reached too), and each request goes
//! through the checks the daemon makes before acting on it. Besides "never panics", the
//! reader always makes progress and never yields more requests than there are lines; an
//! answer the daemon writes, in either framing (JSON-RPC 2.0 or the line protocol), is one
//! JSON line that reads back as the same answer.

#![no_main]

use std::io::{BufReader, Cursor};

use libfuzzer_sys::fuzz_target;
use sluice_api::config::{DatapathKind, check_datapath};
use sluice_api::proto::{Framing, Incoming, Request, Response, read_request};
use sluice_wire::MacAddr;

fuzz_target!(|data: &[u8]| {
    let max = 64 + usize::from(data.first().copied().unwrap_or(0)) * 8;
    let mut r = BufReader::with_capacity(16, Cursor::new(data));
    let lines = data.split(|&b| b == b'\n').count();
    let mut requests = 0;
    loop {
        match read_request(&mut r, max) {
            Incoming::End | Incoming::TooLong => break,
            Incoming::Malformed(framing, e) => {
                let (code, message) = (e.code, e.message.clone());
                if let Some(line) = framing.answer(Err(e)) {
                    let v = one_json_line(&line);
                    match framing {
                        Framing::V1 => assert_eq!(v["error"].as_str(), Some(message.as_str())),
                        Framing::Rpc(_) => assert_eq!(v["error"]["code"].as_i64(), Some(code)),
                    }
                }
            }
            Incoming::Request(framing, req) => {
                requests += 1;
                assert!(requests <= lines);
                if let Some(line) = framing.answer(Ok(None)) {
                    one_json_line(&line);
                }
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

/// An answer line: one JSON object and its newline, nothing else.
fn one_json_line(line: &str) -> serde_json::Value {
    let body = line.strip_suffix('\n').expect("an answer ends its line");
    assert!(!body.contains('\n'), "an answer is one line");
    serde_json::from_str(body).expect("an answer is JSON")
}
