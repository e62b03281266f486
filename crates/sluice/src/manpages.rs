//! `sluice completion` and `sluice man`: shell completions and manual pages generated from
//! the CLI's own clap definition, so that neither can drift from `--help`.
//!
//! The pages are clap_mangen's sections (title, synopsis, options, subcommands) around text
//! of this module's: the NAME line as whatis(1) wants it, a DESCRIPTION whose example blocks
//! keep their lines (in an EXAMPLES section), and on sluice(1) the FILES, ENVIRONMENT, EXIT
//! STATUS and SEE ALSO an operator looks for. Every page is plain ASCII roff: other
//! characters are written as groff's `\[uXXXX]` escapes, so that a renderer without
//! preconv shows them too.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap_mangen::roff::{Roff, bold, roman};

/// Arguments of `sluice completion`.
#[derive(Debug, clap::Args)]
pub struct CompletionArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Arguments of `sluice man`.
#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// The directory to write the pages to (made if missing), e.g.
    /// /usr/local/share/man/man1.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

/// Prints the completion script of `shell` for command `cmd` to standard output.
pub fn completion(mut cmd: clap::Command, shell: clap_complete::Shell) -> Result<()> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "sluice", &mut script);
    let mut out = std::io::stdout().lock();
    out.write_all(&script).and_then(|()| out.flush()).context("writing the completion script to standard output")
}

/// Writes sluice.1 and a page per subcommand (sluice-port-add.1, …) of `cmd` to `a.out`.
pub fn man(cmd: clap::Command, a: &ManArgs) -> Result<()> {
    let pages = pages(cmd, date()?)?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("making the directory {}", a.out.display()))?;
    for (name, text) in &pages {
        write_page(&a.out, name, text.as_bytes())?;
    }
    println!("wrote {} manual pages to {} (read them with `man sluice`)", pages.len(), a.out.display());
    Ok(())
}

/// Every page of `cmd`'s tree, as (file name, roff text), the top command's first.
pub fn pages(cmd: clap::Command, date: String) -> Result<Vec<(String, String)>> {
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut out = Vec::new();
    walk(&cmd, &[], &date, &mut out)?;
    Ok(out)
}

fn walk(cmd: &clap::Command, parents: &[&str], date: &str, out: &mut Vec<(String, String)>) -> Result<()> {
    let mut path = parents.to_vec();
    path.push(cmd.get_name());
    out.push((format!("{}.1", path.join("-")), page(cmd, &path, date)?));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        walk(sub, &path, date, out)?;
    }
    Ok(())
}

/// One page: `path` is the command's words from `sluice` down.
fn page(cmd: &clap::Command, path: &[&str], date: &str) -> Result<String> {
    let name = path.join("-");
    let version = cmd.get_version().unwrap_or(env!("CARGO_PKG_VERSION"));
    let man = clap_mangen::Man::new(cmd.clone())
        .title(name.to_uppercase())
        .section("1")
        .date(date)
        .source(format!("sluice {version}"))
        .manual("sluice manual");
    let mut buf = Vec::new();
    man.render_title(&mut buf)?;
    // Left-adjusted and unhyphenated: option names and paths stay whole.
    buf.extend(b".ad l\n.nh\n");

    let mut r = Roff::new();
    r.control("SH", ["NAME"]);
    r.text([roman(format!("{name} - {}", summary(cmd)))]);
    buf.extend(r.to_roff().into_bytes());
    man.render_synopsis_section(&mut buf)?;

    let text = cmd.get_long_about().or_else(|| cmd.get_about()).map(|s| s.to_string()).unwrap_or_default();
    let (description, examples) = description(&text);
    let mut r = Roff::new();
    r.control("SH", ["DESCRIPTION"]);
    buf.extend(r.to_roff().into_bytes());
    buf.extend(description.to_roff().into_bytes());

    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut buf)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        let mut r = Roff::new();
        r.control("SH", ["COMMANDS"]);
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            r.control("TP", []);
            r.text([bold(format!("{name}-{}", sub.get_name())), roman("(1)")]);
            r.text([roman(summary(sub))]);
        }
        buf.extend(r.to_roff().into_bytes());
    }
    let examples = examples.to_roff();
    if !examples.is_empty() {
        buf.extend(Roff::new().control("SH", ["EXAMPLES"]).to_roff().into_bytes());
        buf.extend(examples.into_bytes());
    }
    let mut r = Roff::new();
    if path.len() == 1 {
        top_sections(&mut r);
    } else {
        exit_status(&mut r);
        r.control("SH", ["SEE ALSO"]);
        let see: Vec<String> = (1..path.len()).map(|n| path[..n].join("-")).collect();
        let last = see.len() - 1;
        for (i, p) in see.iter().enumerate() {
            r.text([bold(p.as_str()), roman(if i == last { "(1)" } else { "(1)," })]);
        }
    }
    buf.extend(r.to_roff().into_bytes());

    let text = String::from_utf8(buf).context("clap_mangen wrote a page that is not UTF-8")?;
    if text.lines().filter(|l| l.starts_with(".TH ")).count() != 1 {
        bail!("the page {name}.1 came out with other than one .TH line");
    }
    Ok(ascii(&text))
}

/// The command's first sentence, as NAME wants it: one line, lower-case first letter (not of
/// an acronym), no final full stop.
fn summary(cmd: &clap::Command) -> String {
    let about = cmd.get_about().map(|s| s.to_string()).unwrap_or_default();
    let joined = about.split_whitespace().collect::<Vec<_>>().join(" ");
    let first = joined.split_once(". ").map_or(joined.as_str(), |(s, _)| s).trim_end_matches('.');
    let mut chars = first.chars();
    match (chars.next(), chars.clone().next()) {
        (Some(c), Some(d)) if c.is_uppercase() && !d.is_uppercase() => c.to_lowercase().chain(chars).collect(),
        _ => first.to_string(),
    }
}

/// The help text as roff: paragraphs filled, a block of indented lines kept line by line
/// under the line that introduces it. Blocks introduced by `Example:` or `Examples:` are
/// returned apart, for an EXAMPLES section.
fn description(text: &str) -> (Roff, Roff) {
    let mut desc = Roff::new();
    let mut examples = Roff::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let block_follows = lines.get(i + 1).is_some_and(|l| l.starts_with("  "));
        if line.trim().is_empty() {
            desc.control("PP", []);
            i += 1;
        } else if line.trim_end().ends_with(':') && !line.starts_with(' ') && block_follows {
            let heading = line.trim_end();
            let example = matches!(heading, "Example:" | "Examples:");
            if !example {
                desc.text([roman(heading)]);
            }
            let target = if example { &mut examples } else { &mut desc };
            let start = i + 1;
            let mut end = start;
            while end < lines.len() && lines[end].starts_with("  ") {
                end += 1;
            }
            let indent = lines[start..end].iter().map(|l| l.len() - l.trim_start().len()).min().unwrap_or(0);
            target.control("RS", ["4"]);
            target.control("nf", []);
            for l in &lines[start..end] {
                target.text([roman(l[indent..].trim_end())]);
            }
            target.control("fi", []);
            target.control("RE", []);
            i = end;
        } else {
            desc.text([roman(line.trim())]);
            i += 1;
        }
    }
    (desc, examples)
}

/// FILES, ENVIRONMENT, EXIT STATUS and SEE ALSO of sluice(1).
fn top_sections(r: &mut Roff) {
    let entry = |r: &mut Roff, path: &str, text: &str| {
        r.control("TP", []);
        r.text([bold(path)]);
        r.text([roman(text)]);
    };
    r.control("SH", ["FILES"]);
    entry(
        r,
        "/etc/sluice/NAME.toml",
        "The configuration of switch NAME, as `sluice switch run -c /etc/sluice/NAME.toml` reads it \
         and the service sluice@NAME runs it. The format is in config.md (see DOCUMENTATION).",
    );
    entry(
        r,
        "/run/sluice",
        "The run directory (gone at reboot): each running switch's control \
         socket NAME.sock (mode 0600) unless its file sets `socket`, and what a switch keeps while \
         it runs, so that a restart in place or the next start after a crash takes its ports over.",
    );
    entry(
        r,
        "/var/lib/sluice",
        "State kept across reboots: NAME.ports.json, the ports added to switch NAME at run time \
         (`sluice port add`), attached again at every start; `sluice port del` removes them.",
    );
    entry(r, "/usr/share/doc/sluice", "The documentation, where the Debian package installs it (docs/ in the source).");
    r.control("SH", ["ENVIRONMENT"]);
    entry(
        r,
        "RUST_LOG",
        "What the daemon and the commands log to standard error: a level (error, warn, info, the \
         default, debug, trace) or per-module directives as tracing-subscriber's EnvFilter takes \
         them; RUST_LOG=debug shows every control request.",
    );
    entry(
        r,
        "SLUICE_RUN_DIR",
        "The run directory instead of /run/sluice (where switches' sockets are looked for too), \
         for tests and unprivileged experiments; set but empty, it counts as unset.",
    );
    exit_status(r);
    r.control("SH", ["DOCUMENTATION"]);
    r.text([roman(
        "README.md and docs/*.md: config.md (the configuration file), observability.md (counters, \
         capture, monitor and metrics), install.md (the package and cargo install) and the pages \
         they name; /usr/share/doc/sluice holds them where the Debian package is installed.",
    )]);
    r.control("SH", ["SEE ALSO"]);
    let refs = ["ip(8)", "ip-netns(8)", "tc(8)", "tcpdump(8)", "systemctl(1)", "qemu-system-x86_64(1)"];
    for (i, p) in refs.iter().enumerate() {
        let (page, section) = p.split_once('(').unwrap_or((p, ""));
        let end = if i + 1 == refs.len() { "" } else { "," };
        r.text([bold(page), roman(format!("({section}{end}"))]);
    }
}

/// The exit codes every command keeps.
fn exit_status(r: &mut Roff) {
    r.control("SH", ["EXIT STATUS"]);
    for (code, what) in [
        ("0", "Done."),
        ("1", "Refused or failed: the message on standard error says what happened and what to do."),
        ("2", "Usage: the command line is not one sluice understands (the message shows the usage)."),
        ("3", "No switch answers on the control socket (none is running, or it is another switch's socket)."),
    ] {
        r.control("TP", []);
        r.text([bold(code)]);
        r.text([roman(what)]);
    }
}

/// `text` with every character outside ASCII written as groff's `\[uXXXX]`.
fn ascii(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            out += &format!("\\[u{:04X}]", c as u32);
        }
    }
    out
}

/// The pages' date: `SOURCE_DATE_EPOCH`'s day (reproducible builds) or today's, as
/// YYYY-MM-DD.
fn date() -> Result<String> {
    let secs = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) => v.trim().parse::<u64>().map_err(|_| {
            anyhow::anyhow!("SOURCE_DATE_EPOCH={v:?} is not a number of seconds since 1970: unset it or fix it")
        })?,
        Err(_) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
    };
    Ok(sluice_sys::time::date(secs / 86_400))
}

/// Writes `dir/name` whole or not at all: a new file (never following a link someone left
/// at a temporary name) renamed over the old page.
fn write_page(dir: &Path, name: &str, text: &[u8]) -> Result<()> {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing the manual page {}", path.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command's words, from `sluice` down, as the parser knows them.
    fn commands() -> Vec<Vec<String>> {
        fn walk(c: &clap::Command, path: &[String], out: &mut Vec<Vec<String>>) {
            for s in c.get_subcommands().filter(|s| s.get_name() != "help") {
                let mut p = path.to_vec();
                p.push(s.get_name().to_string());
                walk(s, &p, out);
                out.push(p);
            }
        }
        let mut out = Vec::new();
        walk(&<crate::Cli as clap::CommandFactory>::command(), &[], &mut out);
        out
    }

    #[test]
    fn completions_name_every_command() {
        let cmds = commands();
        assert!(cmds.len() > 40, "{cmds:?}");
        for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh, clap_complete::Shell::Fish] {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut <crate::Cli as clap::CommandFactory>::command(), "sluice", &mut script);
            let script = String::from_utf8(script).unwrap();
            for c in &cmds {
                let word = c.last().unwrap();
                assert!(script.contains(word.as_str()), "{shell} completion lacks `sluice {}`", c.join(" "));
                if shell == clap_complete::Shell::Bash {
                    // bash's script has a case per command: `sluice__subcmd__port,add)`.
                    let parent = ["sluice"].into_iter().chain(c[..c.len() - 1].iter().map(|s| s.as_str()));
                    let case = format!("{},{word})", parent.collect::<Vec<_>>().join("__subcmd__"));
                    assert!(script.contains(&case), "bash completion lacks `sluice {}` ({case})", c.join(" "));
                }
            }
        }
    }

    #[test]
    fn a_page_per_command() {
        let pages = pages(<crate::Cli as clap::CommandFactory>::command(), "2026-11-28".into()).unwrap();
        let names: Vec<&str> = pages.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names[0], "sluice.1");
        let mut want: Vec<String> = commands().iter().map(|c| format!("sluice-{}.1", c.join("-"))).collect();
        want.push("sluice.1".into());
        want.sort();
        let mut got: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        got.sort();
        assert_eq!(got, want);
        for (name, text) in &pages {
            assert!(text.is_ascii(), "{name} is not ASCII");
            assert!(text.contains("\n.SH NAME\n"), "{name}");
            assert!(text.contains("\n.SH \"EXIT STATUS\"\n"), "{name}");
        }
        let top = &pages[0].1;
        for section in ["DESCRIPTION", "FILES", "ENVIRONMENT", "\"SEE ALSO\""] {
            assert!(top.contains(&format!("\n.SH {section}\n")), "sluice.1 lacks {section}");
        }
        for path in ["/etc/sluice/NAME.toml", "/run/sluice", "/var/lib/sluice"] {
            assert!(top.contains(&path.replace('-', "\\-")), "sluice.1's FILES lacks {path}");
        }
        let add = &pages.iter().find(|(n, _)| n == "sluice-port-add.1").unwrap().1;
        assert!(add.contains("\n.SH EXAMPLES\n.RS 4\n.nf\nsluice port add tap0"), "{add}");
        assert!(add.contains(".B sluice-port") || add.contains("\\fBsluice\\-port\\fR(1)"), "{add}");
    }

    #[test]
    fn civil_dates() {
        assert_eq!(sluice_sys::time::date(0), "1970-01-01");
        assert_eq!(sluice_sys::time::date(19_782), "2024-02-29");
        assert_eq!(sluice_sys::time::date(20_785), "2026-11-28");
    }

    #[test]
    fn description_keeps_example_lines_apart() {
        let (d, e) = description("Does a thing.\n\nFirst steps:\n  a b\n    c\nMore.\n\nExamples:\n  x --y\n");
        let d = d.to_roff();
        assert!(d.contains("First steps:\n.RS 4\n.nf\na b\n  c\n.fi\n.RE\nMore."), "{d}");
        assert!(!d.contains("Examples"), "{d}");
        assert_eq!(e.to_roff(), ".RS 4\n.nf\nx \\-\\-y\n.fi\n.RE\n");
    }

    #[test]
    fn non_ascii_becomes_groff_escapes() {
        assert_eq!(ascii("a — b …"), "a \\[u2014] b \\[u2026]");
    }
}
