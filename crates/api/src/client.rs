//! Finding a running switch and talking to it over its control socket (JSON-RPC 2.0,
//! docs/api.md).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use crate::proto::{JSONRPC, PROTOCOL, PROTOCOL_V1, Request, Response, RpcResponse, SwitchSummary};
use sluice_sys::error::Context;
use sluice_sys::paths;

/// How the user chose a switch on the command line.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct Target {
    /// The switch to talk to, by name (its socket is /run/sluice/NAME.sock). Default: the
    /// only running switch.
    #[arg(long, global = true, value_name = "NAME")]
    pub switch: Option<String>,
    /// The switch's control socket, when it is not in the default place.
    #[arg(long, global = true, value_name = "PATH", conflicts_with = "switch")]
    pub socket: Option<PathBuf>,
}

/// How `sluice port add` chooses a switch: by name only, since its `--socket` is a
/// vhost-user VM's socket, not the switch's.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct TargetByName {
    /// The switch to add the port to, by name (its socket is /run/sluice/NAME.sock).
    /// Default: the only running switch.
    #[arg(long, value_name = "NAME")]
    pub switch: Option<String>,
}

impl From<TargetByName> for Target {
    fn from(t: TargetByName) -> Target {
        Target { switch: t.switch, socket: None }
    }
}

/// A connection to a switch daemon.
pub struct Client {
    stream: BufReader<UnixStream>,
    path: PathBuf,
    /// The id of the next request.
    next_id: u64,
    /// The daemon speaks the line protocol alone (a sluice from before JSON-RPC): requests
    /// go in its framing. A newer CLI keeps driving an older daemon — after an upgrade, the
    /// daemon still running is the old one until `sluice switch restart`.
    v1: bool,
    /// The daemon's framing is known (it has answered once).
    known: bool,
}

impl Client {
    /// Connects to the socket at `path`.
    pub fn connect(path: &Path) -> Result<Client> {
        let s = UnixStream::connect(path).map_err(|cause| {
            let hint = match cause.kind() {
                std::io::ErrorKind::NotFound => {
                    "no switch is listening there; start one with `sluice switch run --config FILE` or `sluice lab up`"
                }
                std::io::ErrorKind::ConnectionRefused => {
                    "the switch that made this socket is gone (killed or crashed, not stopped); start it again \
                     with `sluice switch run --config FILE` (which removes the stale socket), or remove its lab \
                     with `sluice lab down`"
                }
                std::io::ErrorKind::PermissionDenied => {
                    "the control socket is owner-only: run as the user who started the switch (root)"
                }
                _ => "",
            };
            Error::Unreachable { path: path.into(), cause, hint }
        })?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Client { stream: BufReader::new(s), path: path.into(), next_id: 1, v1: false, known: false })
    }

    /// Connects to the switch the user chose.
    pub fn for_target(t: &Target) -> Result<Client> {
        let path = resolve(t)?;
        Client::connect(&path)?.handshake()
    }

    /// Says `hello` and checks that the daemon speaks this protocol's major version.
    fn handshake(mut self) -> Result<Client> {
        let path = self.path.clone();
        let c = &mut self;
        let hello: SwitchSummary = c.call(&Request::Hello)?;
        // The same major version works, whatever the minor: a newer daemon ignores nothing
        // this client sends, an older one answers an unknown method as such. A daemon of the
        // line protocol alone is spoken to in it ([`Client::call_value`]).
        let ours = if c.v1 { PROTOCOL_V1 } else { PROTOCOL };
        if hello.protocol != ours {
            return Err(Error::Protocol { path, theirs: hello.protocol, ours, version: hello.version });
        }
        Ok(self)
    }

    /// Sends a request and decodes the answer's data.
    pub fn call<T: DeserializeOwned>(&mut self, req: &Request) -> Result<T> {
        let v = self.call_value(req)?;
        Ok(serde_json::from_value(v).context("the switch sent an answer this sluice does not understand")?)
    }

    /// Sends a request that ends the daemon (stop, restart): its answer may race the
    /// process's exit, so a connection closed without an answer counts as accepted (the
    /// caller then checks that the daemon went).
    pub fn call_final(&mut self, req: &Request) -> Result<()> {
        match self.call_value(req) {
            Ok(_) => Ok(()),
            Err(Error::ClosedWithoutAnswer(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Sends a capture request; once the switch accepts it, the connection carries capture
    /// records (`proto::CAPTURE_RECORD_HEADER`), read without a time limit: a quiet port
    /// sends nothing, and a switch that goes away closes the connection.
    pub fn into_capture(mut self, req: &Request) -> Result<BufReader<UnixStream>> {
        self.call_value(req)?;
        self.stream.get_ref().set_read_timeout(None)?;
        Ok(self.stream)
    }

    /// Subscribes to the switch's events of `kinds` (all when empty); the connection then
    /// carries `event` notifications, one per line, read without a time limit (a quiet
    /// switch sends nothing; a switch that goes away closes the connection).
    pub fn into_events(mut self, kinds: Vec<String>) -> Result<BufReader<UnixStream>> {
        self.call_value(&Request::Subscribe { kinds })?;
        self.stream.get_ref().set_read_timeout(None)?;
        Ok(self.stream)
    }

    /// Sends a request and returns the answer's raw data (null when there is none).
    pub fn call_value(&mut self, req: &Request) -> Result<serde_json::Value> {
        let id = self.next_id;
        self.next_id += 1;
        let mut params = match serde_json::to_value(req).context("writing the request")? {
            serde_json::Value::Object(o) => o,
            _ => serde_json::Map::new(),
        };
        let call = if self.v1 {
            serde_json::Value::Object(params)
        } else {
            let method = params.remove("cmd").unwrap_or_default();
            serde_json::json!({"jsonrpc": JSONRPC, "id": id, "method": method, "params": params})
        };
        let mut line = call.to_string();
        line.push('\n');
        self.stream
            .get_mut()
            .write_all(line.as_bytes())
            .with_context(|| format!("sending to {}", self.path.display()))?;
        let mut answer = String::new();
        self.stream.read_line(&mut answer).with_context(|| format!("reading from {}", self.path.display()))?;
        if answer.is_empty() {
            return Err(Error::ClosedWithoutAnswer(self.path.clone()));
        }
        let v: serde_json::Value = serde_json::from_str(&answer).context("the switch sent a malformed answer")?;
        let known = std::mem::replace(&mut self.known, true);
        if !known
            && !self.v1
            && v.get("jsonrpc").is_none()
            && v["error"].as_str().is_some_and(|e| e.starts_with("malformed request"))
        {
            // A daemon of the line protocol alone read the first JSON-RPC request as a
            // malformed line (and kept the connection): it is asked again in its framing.
            self.v1 = true;
            return self.call_value(req);
        }
        if v.get("jsonrpc").is_none() {
            // The line protocol's framing: a daemon that speaks no other, or a refusal
            // made before the request was read (too many connections, too long a line).
            let r: Response = serde_json::from_value(v).context("the switch sent a malformed answer")?;
            if !r.ok {
                return Err(Error::Refused(r.error.unwrap_or_else(|| "the switch refused the request".into())));
            }
            return Ok(r.data.unwrap_or(serde_json::Value::Null));
        }
        let r: RpcResponse = serde_json::from_value(v).context("the switch sent a malformed answer")?;
        if let Some(e) = r.error {
            return Err(Error::Refused(e.message));
        }
        if r.id != id {
            return Err(Error::Refused(format!("the switch answered request {} when {id} was asked", r.id)));
        }
        Ok(r.result.unwrap_or(serde_json::Value::Null))
    }
}

/// Running switches: (name, socket) for every socket in the runtime directory that answers.
pub fn running() -> Vec<(String, PathBuf)> {
    let Ok(dir) = std::fs::read_dir(paths::run_dir()) else { return vec![] };
    let mut v: Vec<(String, PathBuf)> = dir
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "sock"))
        .filter(|p| UnixStream::connect(p).is_ok())
        .filter_map(|p| Some((p.file_stem()?.to_string_lossy().into_owned(), p)))
        .collect();
    v.sort();
    v
}

/// The socket the user means.
pub fn resolve(t: &Target) -> Result<PathBuf> {
    if let Some(s) = &t.socket {
        return Ok(s.clone());
    }
    if let Some(n) = &t.switch {
        return Ok(paths::socket_for(n));
    }
    let r = running();
    match r.len() {
        0 => Err(Error::NoSwitch { dir: paths::run_dir() }),
        1 => Ok(r[0].1.clone()),
        _ => Err(Error::SeveralSwitches { names: r.into_iter().map(|x| x.0).collect() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client's handshake against a daemon that answers `hello` with `answer` (the
    /// line's text): what the client made of it.
    fn handshake_with(answer: &'static str) -> Result<Client> {
        handshake_with_v1(answer, None).0
    }

    /// [`handshake_with`], and a daemon of the line protocol alone: if the client asks again
    /// in that framing (`{"cmd":"hello"}`), `v1` answers it. Also the lines the client sent.
    fn handshake_with_v1(answer: &'static str, v1: Option<&'static str>) -> (Result<Client>, Vec<String>) {
        let (mine, theirs) = UnixStream::pair().unwrap();
        let daemon = std::thread::spawn(move || {
            let mut r = BufReader::new(theirs.try_clone().unwrap());
            let mut seen = vec![];
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            let req: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!((&req["jsonrpc"], &req["method"]), (&"2.0".into(), &"hello".into()), "{line}");
            (&theirs).write_all(answer.replace("ID", &req["id"].to_string()).as_bytes()).unwrap();
            (&theirs).write_all(b"\n").unwrap();
            seen.push(line.clone());
            if let Some(v1) = v1 {
                line.clear();
                r.read_line(&mut line).unwrap();
                seen.push(line.clone());
                (&theirs).write_all(v1.as_bytes()).unwrap();
                (&theirs).write_all(b"\n").unwrap();
            }
            seen
        });
        let c = Client { stream: BufReader::new(mine), path: "test.sock".into(), next_id: 1, v1: false, known: false };
        let r = c.handshake();
        (r, daemon.join().unwrap())
    }

    const SUMMARY: &str =
        r#""version":"9.9.9","name":"sw","mode":"l2","pid":1,"lossless":false,"poll":false,"mtu":1500,"ports":0"#;

    #[test]
    fn a_daemon_of_the_same_major_version_is_accepted_whatever_its_minor() {
        let same = format!(r#"{{"jsonrpc":"2.0","id":ID,"result":{{"protocol":2,"protocol_minor":0,{SUMMARY}}}}}"#);
        assert!(handshake_with(same.leak()).is_ok());
        let newer = format!(
            r#"{{"jsonrpc":"2.0","id":ID,"result":{{"protocol":2,"protocol_minor":7,"a_later_field":[1],{SUMMARY}}}}}"#
        );
        assert!(handshake_with(newer.leak()).is_ok(), "a newer minor version, and a field this client does not know");
        let other = format!(r#"{{"jsonrpc":"2.0","id":ID,"result":{{"protocol":3,{SUMMARY}}}}}"#);
        let e = handshake_with(other.leak()).err().unwrap();
        assert!(matches!(e, Error::Protocol { theirs: 3, ours: 2, .. }), "{e}");
    }

    /// A daemon of the line protocol alone (a sluice from before JSON-RPC, still running
    /// after an upgrade) cannot read JSON-RPC and says so in its framing: the client asks
    /// again in the line protocol and goes on in it.
    #[test]
    fn a_daemon_of_the_line_protocol_alone_is_spoken_to_in_its_framing() {
        let refused = r#"{"ok":false,"error":"malformed request: missing field `cmd` at line 1 column 52"}"#;
        let v1 = format!(r#"{{"ok":true,"data":{{"protocol":1,{SUMMARY}}}}}"#);
        let (c, sent) = handshake_with_v1(refused, Some(v1.leak()));
        let c = c.unwrap();
        assert!(c.v1);
        assert_eq!(sent[1].trim_end(), r#"{"cmd":"hello"}"#);
        let other = format!(r#"{{"ok":true,"data":{{"protocol":3,{SUMMARY}}}}}"#);
        let e = handshake_with_v1(refused, Some(other.leak())).0.err().unwrap();
        assert!(matches!(e, Error::Protocol { theirs: 3, .. }), "{e}");
    }
}
