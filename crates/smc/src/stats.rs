//! The statistics segments: one file per user in the runtime directory
//! (`/run/sluice/smc/stats/UID`), which that user's programs under `sluice smc run` map
//! shared and count into with atomic adds; `sluice smc stats` sums them. No user can write
//! or truncate a file another user's programs map. Each file's layout is a magic word and
//! then one `u64` per counter, in the order of [`Counter`], the fallback reasons and the
//! histograms.

use crate::msg::Reason;

/// First word of the segment: "SLSMCST8" (the layout of this build; "…7" had no
/// `doorbells` and `ring_events`, "…6" no `rule` and `short` reasons, "…5" no
/// `taken_as_tcp`, `io_uring` and `closed_early` reasons, "…4" no `zerocopy`, "…3" no
/// `buffers_grown`, "…2" one fallback reason fewer, "…1" two).
pub const MAGIC: u64 = 0x3854_5343_4d53_4c53;
/// Size of the segment file.
pub const LEN: usize = 4096;

/// Scalar counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Counter {
    /// Connections the library saw open as a client (connect).
    ConnsClient,
    /// Connections the library saw open as a server (accept on a sluice listener).
    ConnsServer,
    /// Client connections that moved to shared memory.
    SmcClient,
    /// Server connections that moved to shared memory.
    SmcServer,
    /// Handshakes that failed for a reason other than "the peer is not sluice".
    HandshakeErrors,
    /// Bytes written into shared memory.
    TxBytes,
    /// Bytes read from shared memory.
    RxBytes,
    /// Write calls on shared-memory connections.
    TxCalls,
    /// Read calls on shared-memory connections.
    RxCalls,
    /// Writes that found the peer's receive ring full.
    BufferFull,
    /// Connections reset because the peer broke the shared ring (a cursor out of range).
    PeerFaults,
    /// Times a connection that kept finding the peer's receive ring full doubled it.
    BuffersGrown,
    /// Doorbell bytes written: wake-ups a reader got through its descriptor.
    Doorbells,
    /// Readiness an event loop took from the rings it watches, with no doorbell.
    RingEvents,
}

impl Counter {
    /// Every counter, in segment order.
    pub const ALL: [Counter; 14] = [
        Counter::ConnsClient,
        Counter::ConnsServer,
        Counter::SmcClient,
        Counter::SmcServer,
        Counter::HandshakeErrors,
        Counter::TxBytes,
        Counter::RxBytes,
        Counter::TxCalls,
        Counter::RxCalls,
        Counter::BufferFull,
        Counter::PeerFaults,
        Counter::BuffersGrown,
        Counter::Doorbells,
        Counter::RingEvents,
    ];

    /// Its name in `sluice smc stats --json`.
    pub fn name(self) -> &'static str {
        match self {
            Counter::ConnsClient => "connections_client",
            Counter::ConnsServer => "connections_server",
            Counter::SmcClient => "smc_client",
            Counter::SmcServer => "smc_server",
            Counter::HandshakeErrors => "handshake_errors",
            Counter::TxBytes => "tx_bytes",
            Counter::RxBytes => "rx_bytes",
            Counter::TxCalls => "tx_calls",
            Counter::RxCalls => "rx_calls",
            Counter::BufferFull => "buffer_full",
            Counter::PeerFaults => "peer_faults",
            Counter::BuffersGrown => "buffers_grown",
            Counter::Doorbells => "doorbells",
            Counter::RingEvents => "ring_events",
        }
    }
}

/// Buffer-size histogram buckets: 16 KiB, 32 KiB, … 1 MiB, and larger.
pub const BUCKETS: [&str; 8] = ["16K", "32K", "64K", "128K", "256K", "512K", "1M", ">1M"];

/// Word index (after the magic) of a counter.
pub fn counter_index(c: Counter) -> usize {
    1 + c as usize
}

/// Word index of the fallback count for `reason` on the client (`server` false) or server.
pub fn fallback_index(reason: Reason, server: bool) -> usize {
    let base = 1 + Counter::ALL.len();
    let r = Reason::ALL.iter().position(|x| *x == reason).unwrap_or(0);
    base + usize::from(server) * Reason::ALL.len() + r
}

/// Word index of the histogram bucket of a receive (`send` false) or send buffer of
/// `size` bytes.
pub fn hist_index(size: usize, send: bool) -> usize {
    let base = 1 + Counter::ALL.len() + 2 * Reason::ALL.len();
    let b = (size.max(1).next_power_of_two().trailing_zeros() as usize).saturating_sub(14).min(7);
    base + usize::from(send) * BUCKETS.len() + b
}

/// Words in use.
pub const WORDS: usize = 1 + Counter::ALL.len() + 2 * Reason::ALL.len() + 2 * BUCKETS.len();

/// The name of `uid`'s file in the statistics directory.
pub fn file_name(uid: u32) -> String {
    uid.to_string()
}

const _: () = assert!(WORDS * 8 <= LEN);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_are_distinct_and_inside_the_segment() {
        let mut all: Vec<usize> = Counter::ALL.iter().map(|c| counter_index(*c)).collect();
        for r in Reason::ALL {
            all.push(fallback_index(r, false));
            all.push(fallback_index(r, true));
        }
        for b in 0..8 {
            all.push(hist_index(16384 << b, false));
            all.push(hist_index(16384 << b, true));
        }
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n);
        assert!(*all.last().unwrap() < WORDS);
        assert_eq!(hist_index(16384, false), hist_index(1000, false), "small buffers count as 16K");
        assert_eq!(hist_index(64 << 20, true), hist_index(2 << 20, true), "large ones as >1M");
    }
}
