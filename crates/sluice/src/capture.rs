//! `sluice capture PORT [-w FILE] [-c N] [--direction in|out|both] [FILTER]`: a port's
//! frames as pcap that tcpdump and tshark read (docs/architecture.md, "Seeing inside the
//! switch"). The switch copies the frames; FILTER, in libpcap's syntax, is compiled by
//! libpcap itself (through the `pcap` crate) and run here, on the copies, so the switch
//! never runs code a user wrote.

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{Result, anyhow, bail};

use sluice_api::client::{Client, Target};
use sluice_api::proto::{CAPTURE_RECORD_HEADER, Request};

/// Arguments of `sluice capture`.
#[derive(clap::Args, Debug)]
pub struct CaptureArgs {
    /// The port to capture.
    pub port: String,
    /// A capture filter in libpcap's syntax (as tcpdump takes it), e.g. `icmp or arp`,
    /// `tcp port 80`, `vlan 10 and host 10.77.0.2`.
    #[arg(trailing_var_arg = true, value_name = "FILTER")]
    pub filter: Vec<String>,
    /// Write pcap to FILE (`-` or nothing: standard output, e.g. `| tshark -r -`).
    #[arg(long, short = 'w', value_name = "FILE")]
    pub write: Option<PathBuf>,
    /// Stop after N frames (that pass the filter).
    #[arg(long, short = 'c', value_name = "N")]
    pub count: Option<u64>,
    /// Frames the port delivers to the switch (`in`), frames the switch sends it (`out`),
    /// or both.
    #[arg(long, value_enum, default_value = "both")]
    pub direction: DirArg,
    /// Bytes kept of each frame (64 to 262144).
    #[arg(long, short = 's', default_value_t = 262_144, value_name = "BYTES")]
    pub snaplen: u32,
    #[command(flatten)]
    pub target: Target,
}

/// `--direction`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum DirArg {
    /// Frames the port delivers.
    In,
    /// Frames the port is sent.
    Out,
    /// Both.
    Both,
}

/// Runs `sluice capture`.
pub fn run(a: CaptureArgs) -> Result<()> {
    if !(64..=262_144).contains(&a.snaplen) {
        bail!("--snaplen must be 64 to 262144");
    }
    let expr = a.filter.join(" ");
    let program = if expr.trim().is_empty() {
        None
    } else {
        let dead = pcap::Capture::dead(pcap::Linktype::ETHERNET).map_err(|e| anyhow!("libpcap: {e}"))?;
        Some(dead.compile(&expr, true).map_err(|e| anyhow!("capture filter {expr:?}: {e} (see pcap-filter(7))"))?)
    };
    let to_stdout = a.write.as_ref().is_none_or(|p| p.as_os_str() == "-");
    if to_stdout && std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        bail!(
            "pcap is binary: write it to a file (-w FILE) or into a reader (`sluice capture {} | tshark -r -`)",
            a.port
        );
    }
    let direction = match a.direction {
        DirArg::In => "in",
        DirArg::Out => "out",
        DirArg::Both => "both",
    };
    let req = Request::Capture { port: a.port.clone(), direction: direction.into(), snaplen: a.snaplen };
    let mut r = Client::for_target(&a.target)?.into_capture(&req)?;
    // The output is opened only now that the switch has taken the capture, as tcpdump
    // opens its file only once the device is: a mistyped switch or port name leaves an
    // existing FILE as it was. Never through a link, nor into someone else's file (a name
    // planted under /tmp); emptied only after those checks.
    let mut sink: Box<dyn Write> = if to_stdout {
        Box::new(std::io::stdout().lock())
    } else {
        let p = a.write.clone().unwrap_or_default();
        Box::new(sluice_sys::fs::output_checked(&p, 0o644).map_err(|e| anyhow!("cannot write the capture: {e}"))?)
    };
    let stream = r.get_ref().try_clone()?;
    // Ctrl-C ends the capture as its count does, the file complete and the summary
    // printed: this side closes, and the switch sends what it copied until then and ends.
    let s = stream.try_clone()?;
    sluice_sys::on_stop_signal(move |_| {
        let _ = s.shutdown(std::net::Shutdown::Write);
    })?;
    sink.write_all(&sluice_wire::pcap::file_header(a.snaplen))?;
    sink.flush()?;
    eprintln!(
        "sluice: capturing {} ({direction}){}; Ctrl-C stops",
        a.port,
        if expr.is_empty() { String::new() } else { format!(", filter {expr:?}") }
    );
    let (mut kept, mut skipped, mut lost, mut gone) = (0u64, 0u64, 0u64, false);
    let mut head = [0u8; CAPTURE_RECORD_HEADER];
    let mut data = vec![0u8; 262_144];
    while a.count.is_none_or(|n| kept < n) {
        if r.read_exact(&mut head).is_err() {
            break;
        }
        let kind = head[0];
        let ts = u64::from_be_bytes(head[1..9].try_into().expect("8 bytes"));
        let len = u32::from_be_bytes(head[9..13].try_into().expect("4 bytes"));
        let dlen = u32::from_be_bytes(head[13..17].try_into().expect("4 bytes")) as usize;
        if dlen > data.len() {
            bail!("the switch sent a capture record of {dlen} bytes (at most {})", data.len());
        }
        if r.read_exact(&mut data[..dlen]).is_err() {
            break;
        }
        let d = &data[..dlen];
        match kind {
            0 | 1 => {
                if program.as_ref().is_some_and(|p| !p.filter(d)) {
                    skipped += 1;
                    continue;
                }
                sink.write_all(&sluice_wire::pcap::record_header(ts, dlen as u32, len))?;
                sink.write_all(d)?;
                kept += 1;
                // (Whole records for a reader on the other end of a pipe.)
                if r.buffer().is_empty() {
                    sink.flush()?;
                }
            }
            2 if dlen == 8 => lost = u64::from_be_bytes(d.try_into().expect("8 bytes")),
            3 => {
                gone = true;
                break;
            }
            _ => {}
        }
    }
    sink.flush()?;
    drop(r);
    let _ = stream.shutdown(std::net::Shutdown::Both);
    eprintln!(
        "sluice: {kept} frame(s) captured{}{}{}",
        if skipped > 0 { format!(", {skipped} not matching the filter") } else { String::new() },
        if lost > 0 { format!(", {lost} lost by the switch (the capture could not keep up)") } else { String::new() },
        if gone { format!("; port {} went away", a.port) } else { String::new() }
    );
    Ok(())
}
