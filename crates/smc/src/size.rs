//! Buffer sizes: SMC's default rule and the `-r`/`-t` sizes the launcher accepts.
//!
//! Seed 003 describes the rule: take the default TCP buffer size (`tcp_rmem[1]` for the
//! receive buffer, `tcp_wmem[1]` for the send buffer), round it up to a power of two,
//! halve it, and use at least 16 KiB.

/// The smallest buffer SMC uses.
pub const MIN: usize = 16 * 1024;
/// The largest buffer sluice accepts.
pub const MAX: usize = 64 * 1024 * 1024;

/// SMC's buffer for a TCP default buffer of `tcp_default` bytes.
pub fn from_tcp_default(tcp_default: usize) -> usize {
    (tcp_default.max(1).next_power_of_two() / 2).clamp(MIN, MAX)
}

/// The middle value of a `/proc/sys/net/ipv4/tcp_[rw]mem` line ("4096 131072 6291456").
pub fn tcp_default_of(line: &str) -> Option<usize> {
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The largest value of a `tcp_[rw]mem` line, the most TCP lets a buffer grow to.
pub fn tcp_max_of(line: &str) -> Option<usize> {
    line.split_whitespace().nth(2)?.parse().ok()
}

/// The most a buffer grows to for a TCP maximum of `tcp_max` bytes: rounded down to a
/// power of two, within 16 KiB to 64 MiB.
pub fn max_from_tcp_max(tcp_max: usize) -> usize {
    let down = if tcp_max == 0 { 0 } else { 1usize << (usize::BITS - 1 - tcp_max.leading_zeros()) };
    down.clamp(MIN, MAX)
}

/// The most (receive, send) buffers grow to on this host: the TCP maxima (the last value
/// of `tcp_rmem` and `tcp_wmem`) rounded down to a power of two (256 KiB each if they
/// cannot be read), and no more than the CPU's caches hold well ([`cache_cap`]).
pub fn host_maxima() -> (usize, usize) {
    let read =
        |f: &str| std::fs::read_to_string(f).ok().as_deref().and_then(tcp_max_of).map_or(256 * 1024, max_from_tcp_max);
    let cap = cache_cap(host_last_level_cache());
    (read("/proc/sys/net/ipv4/tcp_rmem").min(cap), read("/proc/sys/net/ipv4/tcp_wmem").min(cap))
}

/// The most a ring grows to for a last-level cache of `llc` bytes (`None`: unknown): an
/// eighth of it, rounded down to a power of two, 1 MiB to 64 MiB (4 MiB when unknown). A
/// stream whose ring stays in the cache copies at the cache's rate, one whose ring is the
/// size of the cache nearer memory's (docs/results/2026-11-28-smc-ring-size.md).
pub fn cache_cap(llc: Option<usize>) -> usize {
    let Some(llc) = llc.filter(|l| *l > 0) else { return 4 << 20 };
    let eighth = llc / 8;
    let down = if eighth == 0 { 0 } else { 1usize << (usize::BITS - 1 - eighth.leading_zeros()) };
    down.clamp(1 << 20, MAX)
}

/// The size of the largest cache CPU 0 has (its last level), from sysfs.
pub fn host_last_level_cache() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.flatten()
        .take(16)
        .filter_map(|e| std::fs::read_to_string(e.path().join("size")).ok())
        .filter_map(|s| cache_size_of(&s))
        .max()
}

/// A sysfs cache size ("32768K", "1M", "512").
pub fn cache_size_of(s: &str) -> Option<usize> {
    let (num, mult) = split_unit(s.trim());
    num.parse::<usize>().ok()?.checked_mul(mult as usize)
}

/// A size's number and the multiplier its unit says: none (bytes), `k`, `m` or `g`
/// (powers of 1024, either case).
pub fn split_unit(t: &str) -> (&str, u64) {
    match t.char_indices().last() {
        Some((i, c)) if c.eq_ignore_ascii_case(&'k') => (&t[..i], 1 << 10),
        Some((i, c)) if c.eq_ignore_ascii_case(&'m') => (&t[..i], 1 << 20),
        Some((i, c)) if c.eq_ignore_ascii_case(&'g') => (&t[..i], 1 << 30),
        _ => (t, 1),
    }
}

/// The default (receive, send) buffer sizes on this host, from the calling thread's
/// network namespace's TCP settings (16 KiB each if they cannot be read).
pub fn host_defaults() -> (usize, usize) {
    let read =
        |f: &str| std::fs::read_to_string(f).ok().as_deref().and_then(tcp_default_of).map_or(MIN, from_tcp_default);
    (read("/proc/sys/net/ipv4/tcp_rmem"), read("/proc/sys/net/ipv4/tcp_wmem"))
}

/// Parses a size as `smc_run -r/-t` takes it: bytes, or with a `k`, `m` or `g` suffix
/// (powers of 1024). The result is rounded up to a power of two and must lie between
/// 16 KiB and 64 MiB.
pub fn parse(s: &str) -> Result<usize, String> {
    let (num, mult) = split_unit(s.trim());
    let n: usize = num.parse().map_err(|_| format!("{s:?} is not a size: write it as 65536, 64k or 1m"))?;
    let bytes = n.checked_mul(mult as usize).ok_or_else(|| format!("{s:?} is too large"))?;
    if !(MIN..=MAX).contains(&bytes.next_power_of_two()) || bytes == 0 {
        return Err(format!("buffer size {s} is out of range: use 16k to 64m"));
    }
    Ok(bytes.next_power_of_two())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_rule_of_seed_003() {
        // The seed's tuned setting: a 256 KiB TCP default gives 128 KiB SMC buffers.
        assert_eq!(from_tcp_default(262_144), 131_072);
        // Not a power of two: rounded up first (87380 → 131072 → 64 KiB).
        assert_eq!(from_tcp_default(87_380), 65_536);
        // Small defaults give the 16 KiB minimum.
        assert_eq!(from_tcp_default(16_384), MIN);
        assert_eq!(from_tcp_default(0), MIN);
        assert_eq!(tcp_default_of("4096\t131072\t33554432\n"), Some(131_072));
        assert_eq!(tcp_default_of("4096"), None);
        // The maxima: Debian's 6 MiB receive and 4 MiB send maxima.
        assert_eq!(tcp_max_of("4096\t131072\t6291456\n").map(max_from_tcp_max), Some(4 << 20));
        assert_eq!(tcp_max_of("4096 16384 4194304").map(max_from_tcp_max), Some(4 << 20));
        assert_eq!(max_from_tcp_max(1 << 40), MAX);
        assert_eq!(max_from_tcp_max(1000), MIN);
    }

    #[test]
    fn rings_grow_to_an_eighth_of_the_last_level_cache() {
        assert_eq!(cache_size_of("32768K\n"), Some(32 << 20));
        assert_eq!(cache_size_of("1M"), Some(1 << 20));
        assert_eq!(cache_size_of("x"), None);
        assert_eq!(cache_cap(Some(32 << 20)), 4 << 20);
        assert_eq!(cache_cap(Some(48 << 20)), 4 << 20, "rounded down");
        assert_eq!(cache_cap(Some(2 << 20)), 1 << 20, "at least 1 MiB");
        assert_eq!(cache_cap(Some(1 << 40)), MAX);
        assert_eq!(cache_cap(None), 4 << 20);
    }

    #[test]
    fn sizes_parse_like_smc_run() {
        assert_eq!(parse("128k"), Ok(131_072));
        assert_eq!(parse("1M"), Ok(1 << 20));
        assert_eq!(parse("65536"), Ok(65_536));
        assert_eq!(parse("100k"), Ok(131_072), "rounded up to a power of two");
        assert!(parse("8k").unwrap_err().contains("16k to 64m"));
        assert!(parse("1g").unwrap_err().contains("out of range"));
        assert!(parse("lots").unwrap_err().contains("not a size"));
    }
}
