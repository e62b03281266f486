//! Output: each port's queue is drained into the port, in order, until it is empty or the
//! port is full (then the switch waits for it to be writable). A copy gets its tag, its
//! source address and whatever offload the port cannot do (segmentation, checksum) as it
//! leaves. Frames the switch writes itself (address-resolution answers, announcements)
//! are queued here too.

use std::num::NonZeroU16;

use sluice_wire::{ETH_HDR_LEN, MacAddr, VNET_HDR_LEN, VnetHdr};

use super::{Switch, WatchdogEvent};
use crate::counters::DropCause;
use crate::ids::PortId;
use crate::pool::FrameMeta;
use crate::port::{OutFrame, PortError, TxOutcome};
use crate::queue::QueuedCopy;

/// The most datagrams one GSO frame may become at a port that sends each frame to several
/// places itself (a tunnel flooding to its endpoints,
/// [`Port::fanout`](crate::Port::fanout)): its segments times those places. More is
/// [`DropCause::GsoLimit`] at that output, so that one send in a guest (a UDP-GSO
/// broadcast of tiny segments) cannot leave as thousands of datagrams. A port that sends
/// the frame to one place is bound by [`MAX_GSO_SEGMENTS`](crate::MAX_GSO_SEGMENTS) alone,
/// as any other.
pub const FLOOD_DATAGRAMS_PER_FRAME: usize = 64;

/// What became of a copy offered to a port.
enum Sent {
    Ok,
    Full,
    Drop(DropCause),
    Gone(String),
}

impl Switch {
    /// Port `id` can take frames again: sends what is queued for it.
    pub fn on_writable(&mut self, id: PortId) {
        if let Some(s) = self.slot_mut(id) {
            s.want_write = false;
            if !s.dirty {
                s.dirty = true;
                self.dirty.push(id);
            }
        }
        self.note_interest(id);
        self.settle();
    }

    /// Sends queued frames and retries held ones until nothing more can move.
    pub(super) fn settle(&mut self) {
        loop {
            let mut moved = false;
            while let Some(d) = self.dirty.pop() {
                moved |= self.flush_port(d);
            }
            if !moved || self.held_count == 0 || !self.retry_held() {
                break;
            }
        }
    }

    /// Sends port `d`'s queue until it is empty or the port is full. True if it sent any.
    pub(super) fn flush_port(&mut self, d: PortId) -> bool {
        let mut sent_any = false;
        loop {
            let Some(s) = self.slot_mut(d) else { return sent_any };
            s.dirty = false;
            if s.rules.failed.is_some() {
                return sent_any;
            }
            let Some((class, copy)) = s.queue.front() else { break };
            let (ci, fid) = (usize::from(class), copy.fid);
            // `rate_out`: the queue waits while the port's bucket is empty.
            if s.shaped_until_ms.is_some() {
                break;
            }
            let now_ms = self.now_ms;
            let len = u64::from(self.pool.meta(fid).len);
            let s = self.slot_mut(d).expect("live");
            let wait = s.rate_out.take_or_wait(now_ms.saturating_mul(1_000_000), len);
            if wait > 0 {
                s.shaped_until_ms = Some(now_ms + wait.div_ceil(1_000_000));
                break;
            }
            match self.transmit(d, copy) {
                Sent::Ok => {
                    let len = u64::from(self.pool.meta(fid).len);
                    let now = self.now_ms;
                    let s = self.slot_mut(d).expect("live");
                    s.queue.pop_front();
                    s.classes[ci].tx_frames += 1;
                    s.classes[ci].tx_bytes += len;
                    s.watch[ci].since_ms = now;
                    if s.watch[ci].stuck {
                        s.watch[ci].stuck = false;
                        let class = self.classes[ci].name.clone();
                        self.watchdog_events.push(WatchdogEvent { port: d, class, stuck: false });
                    }
                    self.pool.release(fid);
                    sent_any = true;
                }
                Sent::Full => {
                    let s = self.slot_mut(d).expect("live");
                    // (Not sent: the bucket gets back what the frame took.)
                    let cost = s.rate_out.meter.cost_ns(len);
                    s.rate_out.tat_ns = s.rate_out.tat_ns.saturating_sub(cost);
                    s.want_write = true;
                    self.note_interest(d);
                    break;
                }
                Sent::Drop(cause) => {
                    let s = self.slot_mut(d).expect("live");
                    s.queue.pop_front();
                    s.counters.tx_drops.add(cause);
                    s.classes[ci].tx_drops.add(cause);
                    self.pool.release(fid);
                    sent_any = true;
                }
                Sent::Gone(why) => {
                    self.fail_port(d, why);
                    return true;
                }
            }
        }
        sent_any
    }

    /// Offers a copy of a frame to port `d` as its verdict said (tag, source address),
    /// completing offloads in software where the port cannot take them.
    fn transmit(&mut self, d: PortId, copy: QueuedCopy) -> Sent {
        let fid = copy.fid;
        let Switch { ports, pool, scratch, captures, cfg, .. } = self;
        let s = ports[d as usize].as_mut().expect("caller checked");
        // Copies of what the port is sent, as on the wire, for its captures.
        let captured = s.captured > 0;
        let mut capture = |parts: &[&[u8]]| {
            for c in captures.iter_mut().flatten().filter(|c| c.port == d) {
                c.offer(true, parts);
            }
        };
        let meta = *pool.meta(fid);
        // The frame's MAC addresses, or a copy with the source replaced (the address the
        // verdict named: the port's own, read as the copy leaves).
        let src_mac = copy.own_src.then(|| s.rules.l3_src(cfg.router_mac));
        let macs_of = |m: &[u8]| -> ([u8; 12], bool) {
            let mut b = [0u8; 12];
            if let Some(src) = src_mac {
                b[..6].copy_from_slice(&m[..6]);
                b[6..].copy_from_slice(&src.0);
            }
            (b, src_mac.is_some())
        };
        let tag = copy.tag.map(|vid| {
            let tci = (u16::from(meta.pcp) << 13) | vid.get();
            let t = tci.to_be_bytes();
            [0x81, 0x00, t[0], t[1]]
        });
        let shift = if tag.is_some() { 4 } else { 0 };
        let len = u64::from(meta.len) + shift;

        if meta.vnet.is_gso() && !s.caps.offload {
            let skip = s.seg_done;
            if skip == 0 {
                // A port that sends each segment to several places itself: the frame costs
                // its segments times those places, within a bound.
                let dst = MacAddr(pool.frame(fid)[..6].try_into().unwrap_or_default());
                let fanout = s.port.fanout(meta.vlan, dst);
                if fanout > 1 && gso_segments(&meta).saturating_mul(fanout) > FLOOD_DATAGRAMS_PER_FRAME {
                    return Sent::Drop(DropCause::GsoLimit);
                }
            }
            let mut idx = 0u32;
            let mut outcome = Sent::Ok;
            let port = &mut s.port;
            let result = sluice_wire::segment(pool.frame(fid), &meta.vnet, scratch, |seg| {
                if idx < skip {
                    idx += 1;
                    return true;
                }
                let (b, rewritten) = macs_of(seg);
                let macs = if rewritten { &b[..] } else { &seg[..12] };
                let out = OutFrame { vnet: [0; VNET_HDR_LEN], macs, tag, rest: &seg[12..] };
                match port.send(&out) {
                    Ok(TxOutcome::Sent) => {
                        idx += 1;
                        if captured {
                            capture(&[macs, tag.as_ref().map_or(&[][..], |t| &t[..]), &seg[12..]]);
                        }
                        true
                    }
                    Ok(TxOutcome::Full) => {
                        outcome = Sent::Full;
                        false
                    }
                    Err(PortError::Io(_)) => {
                        outcome = Sent::Drop(DropCause::TxError);
                        false
                    }
                    Err(PortError::Refused(cause)) => {
                        outcome = Sent::Drop(cause);
                        false
                    }
                    Err(PortError::Gone(e)) => {
                        outcome = Sent::Gone(format!("transmit failed: {e}"));
                        false
                    }
                }
            });
            return match (result, outcome) {
                (Err(_), _) => {
                    s.seg_done = 0;
                    Sent::Drop(DropCause::Malformed)
                }
                (Ok(_), Sent::Full) => {
                    s.seg_done = idx;
                    Sent::Full
                }
                (Ok(_), Sent::Ok) => {
                    s.seg_done = 0;
                    s.counters.tx_frames += 1;
                    s.counters.tx_bytes += len;
                    s.counters.tx_segmented += 1;
                    s.counters.tx_segments += u64::from(idx - skip);
                    Sent::Ok
                }
                (Ok(_), other) => {
                    s.seg_done = 0;
                    other
                }
            };
        }

        if meta.vnet.needs_csum() && !s.caps.offload {
            let (frame, m) = pool.frame_and_meta_mut(fid);
            if sluice_wire::fill_partial_checksum(frame, &m.vnet).is_err() {
                return Sent::Drop(DropCause::Malformed);
            }
            // Every other output now sees a frame with a complete checksum.
            m.vnet.flags &= !VnetHdr::F_NEEDS_CSUM;
            s.counters.tx_csum_filled += 1;
        }
        let meta = *pool.meta(fid);
        let mut vnet = [0u8; VNET_HDR_LEN];
        if s.caps.offload {
            let mut h = meta.vnet;
            if h.needs_csum() {
                h.csum_start += shift as u16;
            }
            if h.is_gso() && h.hdr_len != 0 {
                h.hdr_len += shift as u16;
            }
            h.num_buffers = 0;
            h.emit(&mut vnet);
        }
        let frame = pool.frame(fid);
        let (b, rewritten) = macs_of(frame);
        let macs = if rewritten { &b[..] } else { &frame[..12] };
        let out = OutFrame { vnet, macs, tag, rest: &frame[12..] };
        match s.port.send(&out) {
            Ok(TxOutcome::Sent) => {
                if captured {
                    capture(&[macs, tag.as_ref().map_or(&[][..], |t| &t[..]), &frame[12..]]);
                }
                s.counters.tx_frames += 1;
                s.counters.tx_bytes += len;
                if meta.vnet.is_gso() {
                    s.counters.tx_gso += 1;
                }
                Sent::Ok
            }
            Ok(TxOutcome::Full) => Sent::Full,
            Err(PortError::Io(_)) => Sent::Drop(DropCause::TxError),
            Err(PortError::Refused(cause)) => Sent::Drop(cause),
            Err(PortError::Gone(e)) => Sent::Gone(format!("transmit failed: {e}")),
        }
    }

    /// Queues a frame the switch writes itself (`write` fills the buffer and returns the
    /// frame's length) for port `out` on `vlan`; counted as `generated` and `tx_offered`
    /// there. Nothing is sent when the frame pool is exhausted.
    pub(super) fn emit(&mut self, out: PortId, vlan: u16, write: impl FnOnce(&mut [u8]) -> Option<usize>) {
        // The switch's own frames leave tagged as the port's egress rule says.
        let tagged = match self.slot(out) {
            Some(s) if s.rules.failed.is_none() => s.rules.vlan.egress(vlan) == Some(true),
            _ => return,
        };
        let Some(fid) = self.pool.alloc() else { return };
        let buf = self.pool.buf_mut(fid);
        buf[..VNET_HDR_LEN].fill(0);
        let Some(len) = write(&mut buf[VNET_HDR_LEN..]) else {
            self.pool.release(fid);
            return;
        };
        *self.pool.meta_mut(fid) = FrameMeta {
            start: VNET_HDR_LEN as u32,
            len: len as u32,
            vnet: VnetHdr::default(),
            vlan,
            pcp: 0,
            l3_max: (len - ETH_HDR_LEN) as u32,
            class: self.gen_class,
        };
        let (now, class) = (self.now_ms, self.gen_class);
        let s = self.slot_mut(out).expect("checked above");
        s.counters.tx_offered += 1;
        s.counters.generated += 1;
        if s.queue.class_len(class) == 0 {
            s.watch[usize::from(class)].since_ms = now;
        }
        if s.queue.push(class, QueuedCopy { fid, tag: NonZeroU16::new(vlan).filter(|_| tagged), own_src: false }) {
            if !s.dirty {
                s.dirty = true;
                self.dirty.push(out);
            }
        } else {
            s.counters.tx_drops.add(DropCause::QueueFull);
            self.pool.release(fid);
        }
    }
}

/// The segments a GSO frame is cut into: its IP payload beyond the headers, in pieces of
/// `gso_size` (the largest segment's length, `l3_max`, is the headers plus one piece).
fn gso_segments(meta: &FrameMeta) -> usize {
    let gso = usize::from(meta.vnet.gso_size).max(1);
    let l3 = (meta.len as usize).saturating_sub(ETH_HDR_LEN);
    let headers = (meta.l3_max as usize).saturating_sub(gso);
    l3.saturating_sub(headers).div_ceil(gso).max(1)
}
