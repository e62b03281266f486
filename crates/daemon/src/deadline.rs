//! Whole-request deadlines for the daemon's servers (docs/architecture.md, "Servers and
//! files"): a socket's own timeouts bound one read or one write, so a client that sends a
//! byte just before each would run out could hold a connection for ever. Here every read
//! and write is given what is left of one deadline for the whole request (or answer), and
//! a read past it fails with `TimedOut` even while bytes keep trickling in. (The metrics
//! endpoint reads heads without blocking, and keeps their deadlines with [`Deadline`].)

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// A socket whose reads and writes can be given a timeout.
pub trait Timed {
    /// As `TcpStream::set_read_timeout`.
    fn limit_reads(&self, t: Duration) -> io::Result<()>;
    /// As `TcpStream::set_write_timeout`.
    fn limit_writes(&self, t: Duration) -> io::Result<()>;
}

impl Timed for TcpStream {
    fn limit_reads(&self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(t))
    }
    fn limit_writes(&self, t: Duration) -> io::Result<()> {
        self.set_write_timeout(Some(t))
    }
}

impl Timed for UnixStream {
    fn limit_reads(&self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(t))
    }
    fn limit_writes(&self, t: Duration) -> io::Result<()> {
        self.set_write_timeout(Some(t))
    }
}

/// A moment past which a request or an answer is late.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline(Instant);

impl Deadline {
    /// `d` from now.
    pub fn after(d: Duration) -> Deadline {
        Deadline(Instant::now() + d)
    }

    /// `d` after `t`.
    pub fn from(t: Instant, d: Duration) -> Deadline {
        Deadline(t + d)
    }

    /// What is left of it at `now`; `None` once it has passed (a zero timeout would mean
    /// "no timeout" to the socket).
    pub fn left_at(self, now: Instant) -> Option<Duration> {
        self.0.checked_duration_since(now).filter(|d| !d.is_zero())
    }

    /// What is left of it now.
    pub fn left(self) -> Option<Duration> {
        self.left_at(Instant::now())
    }
}

fn late(what: &str, d: Duration) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("{what} did not arrive whole within {} s", d.as_secs()))
}

/// A reader for a connection that carries requests one after another: it may wait `idle`
/// for a request's first byte; from that byte on, the whole request must arrive within
/// `whole`. [`Paced::next_request`] starts the next request's clock.
pub struct Paced<S> {
    s: S,
    idle: Duration,
    whole: Duration,
    due: Option<Deadline>,
    /// The last read failed because the request's deadline passed (not the idle wait).
    late: bool,
}

impl<S: Read + Timed> Paced<S> {
    /// Reads from `s`: at most `idle` before a request starts, `whole` for all of it.
    pub fn new(s: S, idle: Duration, whole: Duration) -> Paced<S> {
        Paced { s, idle, whole, due: None, late: false }
    }

    /// A request has been read: the next one's clock starts at its first byte, or now when
    /// some of it was already read (`pending`: bytes a buffer above holds).
    pub fn next_request(&mut self, pending: bool) {
        self.due = pending.then(|| Deadline::after(self.whole));
        self.late = false;
    }

    /// True when the last read failed because the request came too slowly.
    pub fn was_late(&self) -> bool {
        self.late
    }

    /// The socket, for a connection that turns into something else (a capture).
    pub fn into_inner(self) -> S {
        self.s
    }
}

impl<S: Read + Timed> Read for Paced<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let wait = match self.due {
            None => self.idle,
            Some(d) => match d.left() {
                Some(left) => left,
                None => {
                    self.late = true;
                    return Err(late("the request", self.whole));
                }
            },
        };
        self.s.limit_reads(wait)?;
        match self.s.read(buf) {
            Ok(n) => {
                if n > 0 && self.due.is_none() {
                    self.due = Some(Deadline::after(self.whole));
                }
                Ok(n)
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                if self.due.is_some() {
                    self.late = true;
                    Err(late("the request", self.whole))
                } else {
                    Err(io::Error::new(io::ErrorKind::TimedOut, "idle too long"))
                }
            }
            Err(e) => Err(e),
        }
    }
}

/// Writes all of `buf` to `s` by `due`, however slowly the peer reads.
pub fn write_all_by<S: Timed + Write>(mut s: S, buf: &[u8], due: Deadline) -> io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        let left = due
            .left()
            .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "the client did not take the answer in time"))?;
        s.limit_writes(left)?;
        match s.write(&buf[at..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "the client did not take the answer in time"));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl Timed for &UnixStream {
    fn limit_reads(&self, t: Duration) -> io::Result<()> {
        Timed::limit_reads(*self, t)
    }
    fn limit_writes(&self, t: Duration) -> io::Result<()> {
        Timed::limit_writes(*self, t)
    }
}

impl Timed for &TcpStream {
    fn limit_reads(&self, t: Duration) -> io::Result<()> {
        Timed::limit_reads(*self, t)
    }
    fn limit_writes(&self, t: Duration) -> io::Result<()> {
        Timed::limit_writes(*self, t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_has_time_left_until_it_passes() {
        let t = Instant::now();
        let d = Deadline::from(t, Duration::from_secs(5));
        assert_eq!(d.left_at(t), Some(Duration::from_secs(5)));
        assert_eq!(d.left_at(t + Duration::from_secs(4)), Some(Duration::from_secs(1)));
        assert_eq!(d.left_at(t + Duration::from_secs(5)), None, "no zero timeout");
        assert_eq!(d.left_at(t + Duration::from_secs(9)), None);
    }

    /// A peer that sends a byte every `gap`, `n` times.
    fn trickle(mut w: UnixStream, n: usize, gap: Duration) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            for _ in 0..n {
                if w.write_all(b"x").is_err() {
                    return;
                }
                std::thread::sleep(gap);
            }
        })
    }

    #[test]
    fn a_trickled_request_ends_at_its_deadline_though_every_read_succeeds() {
        let (a, b) = UnixStream::pair().unwrap();
        let t = trickle(b, 40, Duration::from_millis(50));
        let whole = Duration::from_millis(400);
        let mut r = Paced::new(&a, Duration::from_secs(60), whole);
        let started = Instant::now();
        let mut got = 0;
        let mut buf = [0u8; 16];
        let e = loop {
            match r.read(&mut buf) {
                Ok(n) => got += n,
                Err(e) => break e,
            }
        };
        let took = started.elapsed();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(r.was_late() && e.to_string().contains("within 0 s"), "{e}");
        assert!((2..40).contains(&got), "{got} bytes came before the deadline");
        // (Bounded from above only loosely: the machine may be slow.)
        assert!(took >= whole && took < Duration::from_secs(10), "{took:?}");
        drop(a);
        t.join().unwrap();
    }

    #[test]
    fn the_clock_starts_at_a_requests_first_byte_and_again_at_the_next() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut r = Paced::new(&a, Duration::from_millis(100), Duration::from_secs(5));
        let mut buf = [0u8; 4];
        // Nothing at all: the idle wait ends it, and it is not "late".
        let e = r.read(&mut buf).unwrap_err();
        assert!(e.kind() == io::ErrorKind::TimedOut && !r.was_late());
        b.write_all(b"ab").unwrap();
        assert_eq!(r.read(&mut buf).unwrap(), 2);
        r.next_request(false);
        assert!(r.due.is_none());
        r.next_request(true);
        assert!(r.due.is_some_and(|d| d.left().is_some()));
    }

    #[test]
    fn an_answer_nobody_reads_is_given_up_at_its_deadline() {
        let (a, _b) = UnixStream::pair().unwrap();
        let big = vec![0u8; 8 << 20];
        let started = Instant::now();
        let e = write_all_by(&a, &big, Deadline::after(Duration::from_millis(300))).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(10));
        let (a, mut b) = UnixStream::pair().unwrap();
        write_all_by(&a, b"answer\n", Deadline::after(Duration::from_secs(5))).unwrap();
        let mut got = [0u8; 7];
        b.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"answer\n");
    }
}
