//! Which connections stay on TCP, as the launcher is told: `--tcp RULE`, `--short SIZE`
//! and the host's file (`/etc/sluice/smc.toml`, or `--config FILE`), handed to the
//! library in `SLUICE_SMC` (docs/smc.md, "Which connections move").

use std::path::{Path, PathBuf};

use sluice_smc::auto::DEFAULT_SHORT_BYTES;
use sluice_smc::rules::{Rule, Rules};

/// The host's file, read when it exists and no other is named.
pub const DEFAULT_FILE: &str = "/etc/sluice/smc.toml";

/// What the file may say.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    /// Rules: connections (and programs) that stay on TCP.
    #[serde(default)]
    tcp: Vec<toml::Spanned<String>>,
    /// The automatic rule's threshold ("64k"; "0" turns it off).
    short: Option<toml::Spanned<String>>,
}

/// The rules and the threshold a program runs with.
#[derive(Debug, PartialEq, Eq)]
pub struct Choice {
    /// The rules, as written (each one parses).
    pub rules: Vec<String>,
    /// The automatic rule's threshold in bytes (0: off).
    pub short_bytes: u64,
}

/// A threshold: bytes, or with `k`, `m` or `g` (powers of 1024); 0 turns the rule off.
pub fn parse_short(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = sluice_smc::size::split_unit(t);
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("{t:?} is not a size (bytes, or with k, m or g: 64k; 0 turns the automatic rule off)"))
}

/// Parses a rule for `--tcp`.
pub fn parse_rule(s: &str) -> Result<String, String> {
    Rule::parse(s).map(|_| s.trim().to_string())
}

/// The rules and threshold of the file at `path` (`None`: the host's file, if it exists),
/// then the command line's (`tcp` added, `short` in place of the file's).
pub fn gather(path: Option<&Path>, tcp: &[String], short: Option<u64>) -> Result<Choice, String> {
    let (file, text) = match path {
        Some(p) => (p.to_path_buf(), Some(read(p)?)),
        None => {
            let p = PathBuf::from(DEFAULT_FILE);
            let t = if p.exists() { Some(read(&p)?) } else { None };
            (p, t)
        }
    };
    let mut c = Choice { rules: Vec::new(), short_bytes: DEFAULT_SHORT_BYTES };
    if let Some(text) = text {
        from_text(&text, &mut c).map_err(|e| format!("{}: {e}", file.display()))?;
    }
    c.rules.extend(tcp.iter().cloned());
    if let Some(s) = short {
        c.short_bytes = s;
    }
    if c.rules.len() > Rules::MAX {
        return Err(format!("{} rules: at most {} are taken", c.rules.len(), Rules::MAX));
    }
    Ok(c)
}

fn read(p: &Path) -> Result<String, String> {
    use std::io::Read;
    let f = std::fs::File::open(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
    let mut s = String::new();
    f.take(1 << 20).read_to_string(&mut s).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
    Ok(s)
}

/// The file's rules and threshold into `c`; a bad one is named by its line.
fn from_text(text: &str, c: &mut Choice) -> Result<(), String> {
    let f: File = toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())?;
    let line = |at: usize| text[..at.min(text.len())].matches('\n').count() + 1;
    for r in f.tcp {
        let rule = parse_rule(r.get_ref()).map_err(|e| format!("line {}: tcp: {e}", line(r.span().start)))?;
        c.rules.push(rule);
    }
    if let Some(s) = f.short {
        c.short_bytes = parse_short(s.get_ref()).map_err(|e| format!("line {}: short: {e}", line(s.span().start)))?;
    }
    Ok(())
}

/// The part of `SLUICE_SMC` that says it.
pub fn settings(c: &Choice) -> String {
    let mut s = format!("short={}", c.short_bytes);
    for r in &c.rules {
        s.push_str(",tcp=");
        s.push_str(r);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_and_the_command_line_combine_and_a_bad_rule_names_its_line() {
        let dir = std::env::temp_dir().join(format!("sluice-smc-choice-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("smc.toml");
        std::fs::write(&f, "# kept on TCP\ntcp = [\"5432\", \"prog:psql\"]\nshort = \"128k\"\n").unwrap();
        let c = gather(Some(&f), &["10.1.0.0/16:443".into()], None).unwrap();
        assert_eq!(c.rules, ["5432", "prog:psql", "10.1.0.0/16:443"]);
        assert_eq!(c.short_bytes, 128 * 1024);
        assert_eq!(settings(&c), "short=131072,tcp=5432,tcp=prog:psql,tcp=10.1.0.0/16:443");
        assert_eq!(gather(Some(&f), &[], Some(0)).unwrap().short_bytes, 0, "--short overrides the file");
        std::fs::write(&f, "tcp = [\n  \"5432\",\n  \"10.1.0.0/40\",\n]\n").unwrap();
        let e = gather(Some(&f), &[], None).unwrap_err();
        assert!(e.contains("line 3: tcp:") && e.contains("a rule is a port"), "{e}");
        std::fs::write(&f, "tcp = []\nshort = \"lots\"\n").unwrap();
        assert!(gather(Some(&f), &[], None).unwrap_err().contains("line 2: short:"));
        std::fs::write(&f, "tpc = [\"80\"]\n").unwrap();
        let e = gather(Some(&f), &[], None).unwrap_err();
        assert!(e.contains("line 1") && e.contains("tpc"), "{e}");
        assert!(gather(Some(&dir.join("missing.toml")), &[], None).unwrap_err().contains("cannot read"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sizes_and_rules_parse_as_the_flags_take_them() {
        assert_eq!(parse_short("64k"), Ok(65536));
        assert_eq!(parse_short("0"), Ok(0));
        assert_eq!(parse_short("1M"), Ok(1 << 20));
        assert!(parse_short("x").is_err());
        assert_eq!(parse_rule(" 80 "), Ok("80".into()));
        assert!(parse_rule("80-").is_err());
    }
}
