//! The crate's one error type.
//!
//! Every variant is `Copy` and carries no heap data, so returning an error costs nothing on
//! the hot path. No function in this module panics on any input.

/// Why a frame, a virtio-net header or a MAC address string was refused.
///
/// Each message says what is wrong and what to do about it; the switch counts these as
/// malformed frames and drops them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum WireError {
    /// The buffer is shorter than the headers it must contain.
    #[error("frame is too short ({len} bytes) for the headers it must carry; drop it or check the length passed in")]
    Runt {
        /// Length of the buffer that was too short.
        len: usize,
    },
    /// The virtio-net header is inconsistent with itself or with the frame it describes.
    #[error("invalid virtio-net header: {0}; the sender (guest or TAP user) must fix its offload settings")]
    BadVnetHeader(&'static str),
    /// `csum_start + csum_offset` points outside the frame (or too close to its end).
    #[error(
        "virtio-net checksum offsets (csum_start + csum_offset + 2) lie beyond the end of the frame; the sender wrote a bad header"
    )]
    BadChecksumOffsets,
    /// The frame uses a feature this crate does not implement.
    #[error("unsupported: {0}; disable that offload on the sending interface")]
    Unsupported(&'static str),
    /// The caller's scratch buffer cannot hold one segment.
    #[error("scratch buffer is too small: need at least {need} bytes; pass a larger buffer")]
    ScratchTooSmall {
        /// Bytes the scratch buffer must hold for this frame.
        need: usize,
    },
    /// A MAC address string did not parse.
    #[error("not a MAC address: write six two-digit hex bytes separated by ':' or '-', e.g. 02:00:00:00:00:01")]
    BadMac,
    /// An IP, TCP or UDP header does not parse, or its lengths disagree with the frame.
    #[error("malformed packet: {0}; drop the frame")]
    Malformed(&'static str),
}
