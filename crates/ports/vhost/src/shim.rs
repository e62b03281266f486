//! Between QEMU and the `vhost` crate's request dispatcher: one message rule that QEMU and
//! the crate disagree on.
//!
//! QEMU (7.2) sends VHOST_USER_SET_VRING_ENABLE as soon as the virtio-net device is made or
//! reset — before SET_FEATURES — and the crate's dispatcher refuses it then (the protocol
//! feature it belongs to is not acknowledged yet) and ends the connection. So the port
//! answers SET_VRING_ENABLE itself, always (acknowledging it when QEMU asks for a reply),
//! and relays every other message, with the descriptors it carries, to the dispatcher over
//! a socket pair. Replies come back whole, one message at a time.

use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::handler::NetHandler;

const HDR: usize = 12;
const SET_VRING_ENABLE: u32 = 18;
const FLAG_VERSION: u32 = 0x1;
const FLAG_REPLY: u32 = 0x4;
const FLAG_NEED_REPLY: u32 = 0x8;
/// The largest message body either side sends (a memory table of 8 regions is 200 bytes;
/// config space up to 256 bytes; 4 KiB is plenty).
const MAX_BODY: usize = 4096;
/// Descriptors in one message at most (the protocol's limit).
const MAX_FDS: usize = 32;

/// One message read whole: header, body, descriptors.
struct Msg {
    hdr: [u8; HDR],
    body: Vec<u8>,
    fds: Vec<OwnedFd>,
}

impl Msg {
    fn request(&self) -> u32 {
        u32::from_le_bytes(self.hdr[0..4].try_into().expect("4 bytes"))
    }
    fn flags(&self) -> u32 {
        u32::from_le_bytes(self.hdr[4..8].try_into().expect("4 bytes"))
    }
}

/// Reads one message; `None` at the end of the stream.
fn recv(s: &UnixStream) -> io::Result<Option<Msg>> {
    let mut hdr = [0u8; HDR];
    let mut raw = [-1 as RawFd; MAX_FDS];
    let mut iov = [libc::iovec { iov_base: hdr.as_mut_ptr().cast(), iov_len: HDR }];
    // SAFETY: the iovec points at `hdr`, valid for HDR bytes of writes for the call.
    let (n, nfds) =
        unsafe { s.recv_with_fds(&mut iov, &mut raw) }.map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
    // SAFETY: the first `nfds` entries are descriptors the kernel just gave this process.
    let fds: Vec<OwnedFd> = raw[..nfds].iter().map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) }).collect();
    if n == 0 {
        return Ok(None);
    }
    let mut s2 = s;
    if n < HDR {
        s2.read_exact(&mut hdr[n..])?;
    }
    let size = u32::from_le_bytes(hdr[8..12].try_into().expect("4 bytes")) as usize;
    if size > MAX_BODY {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a vhost-user message of {size} bytes")));
    }
    let mut body = vec![0u8; size];
    s2.read_exact(&mut body)?;
    Ok(Some(Msg { hdr, body, fds }))
}

fn send(s: &UnixStream, m: &Msg) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let raw: Vec<RawFd> = m.fds.iter().map(|f| f.as_raw_fd()).collect();
    let mut whole = Vec::with_capacity(HDR + m.body.len());
    whole.extend_from_slice(&m.hdr);
    whole.extend_from_slice(&m.body);
    let n = s.send_with_fds(&[&whole[..]], &raw).map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
    let mut s2 = s;
    s2.write_all(&whole[n..])
}

/// Starts relaying between `qemu` and a new socket, which it returns for the dispatcher,
/// with the two relay threads (each ends when either socket does).
pub(crate) fn start(
    qemu: UnixStream,
    handler: Arc<Mutex<NetHandler>>,
    name: &str,
) -> io::Result<(UnixStream, [std::thread::JoinHandle<()>; 2])> {
    let (inner, ours) = UnixStream::pair()?;
    let to_qemu = Arc::new(Mutex::new(qemu.try_clone()?));
    let (q_in, back) = (qemu, ours.try_clone()?);
    let replies = to_qemu.clone();
    // QEMU → dispatcher (SET_VRING_ENABLE answered here).
    let inbound = std::thread::Builder::new().name(format!("vhost-{name}-in")).spawn(move || {
        let _ = (|| -> io::Result<()> {
            while let Some(m) = recv(&q_in)? {
                if m.request() == SET_VRING_ENABLE && m.body.len() >= 8 {
                    let index = u32::from_le_bytes(m.body[0..4].try_into().expect("4 bytes"));
                    let num = u32::from_le_bytes(m.body[4..8].try_into().expect("4 bytes"));
                    let res = {
                        use vhost::vhost_user::VhostUserBackendReqHandlerMut;
                        handler.lock().unwrap_or_else(|p| p.into_inner()).set_vring_enable(index, num == 1)
                    };
                    if m.flags() & FLAG_NEED_REPLY != 0 {
                        let mut hdr = [0u8; HDR];
                        hdr[0..4].copy_from_slice(&SET_VRING_ENABLE.to_le_bytes());
                        hdr[4..8].copy_from_slice(&(FLAG_VERSION | FLAG_REPLY).to_le_bytes());
                        hdr[8..12].copy_from_slice(&8u32.to_le_bytes());
                        let body = u64::from(res.is_err()).to_le_bytes().to_vec();
                        send(&replies.lock().unwrap_or_else(|p| p.into_inner()), &Msg { hdr, body, fds: vec![] })?;
                    }
                    continue;
                }
                send(&ours, &m)?;
            }
            Ok(())
        })();
        let _ = ours.shutdown(std::net::Shutdown::Both);
        let _ = q_in.shutdown(std::net::Shutdown::Both);
    })?;
    // Dispatcher → QEMU: replies, whole.
    let outbound = std::thread::Builder::new().name(format!("vhost-{name}-out")).spawn(move || {
        let _ = (|| -> io::Result<()> {
            while let Some(m) = recv(&back)? {
                send(&to_qemu.lock().unwrap_or_else(|p| p.into_inner()), &m)?;
            }
            Ok(())
        })();
        let q = to_qemu.lock().unwrap_or_else(|p| p.into_inner());
        let _ = q.shutdown(std::net::Shutdown::Both);
    })?;
    Ok((inner, [inbound, outbound]))
}
