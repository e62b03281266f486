//! What each declaration says about itself ([`Item`]), and the C header written from them
//! ([`header`]): include guard, `<linux/types.h>`, then every item in declaration order,
//! its doc comment as a C comment. The text depends on nothing but the declarations, so
//! the same sources give the same bytes.

use std::fmt::Write;

/// Array dimensions a field's type may have.
const MAX_DIMS: usize = 4;

/// A shared item, as `abi!` declared it.
#[derive(Clone, Copy, Debug)]
pub enum Item {
    /// A constant: `#define NAME value`.
    Const(Const),
    /// Constants declared together in a Rust module (`c`, `d`, `s`).
    Group {
        /// The module's doc comment, one entry per line.
        doc: &'static [&'static str],
        /// Its constants, in order.
        consts: &'static [Const],
    },
    /// A struct.
    Struct(Struct),
}

/// A shared constant.
#[derive(Clone, Copy, Debug)]
pub struct Const {
    /// Its doc comment, one entry per line.
    pub doc: &'static [&'static str],
    /// Its name in C.
    pub name: &'static str,
    /// Its path in Rust from the crate's root (`PF_KERNEL`, `c::COUNT`).
    pub rust: &'static str,
    /// Its value.
    pub value: u64,
    /// The suffix of its C literal (`u`, `ull` or none).
    pub suffix: &'static str,
    /// The Rust expression it was declared with: `1 << n` is written as a shift in C too,
    /// `0x…` in hexadecimal.
    pub expr: &'static str,
}

/// A shared struct.
#[derive(Clone, Copy, Debug)]
pub struct Struct {
    /// Its doc comment, one entry per line.
    pub doc: &'static [&'static str],
    /// Its tag in C (`struct NAME`).
    pub name: &'static str,
    /// Its name in Rust.
    pub rust: &'static str,
    /// `size_of` the Rust struct.
    pub size: usize,
    /// Its fields, in order.
    pub fields: &'static [Field],
}

/// A field of a shared struct.
#[derive(Clone, Copy, Debug)]
pub struct Field {
    /// Its doc comment, one entry per line.
    pub doc: &'static [&'static str],
    /// Its name (the same in both languages).
    pub name: &'static str,
    /// `offset_of` the field in the Rust struct.
    pub offset: usize,
    /// Its type.
    pub ty: Type,
}

/// A field's type as C spells it: a base type (`__u32`, `struct sluice_port`) and array
/// dimensions, outermost first (`[[u8; 16]; 8]` is `__u8 name[8][16]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Type {
    /// The base type.
    pub base: &'static str,
    dims: [usize; MAX_DIMS],
}

impl Type {
    /// A type that is not an array.
    pub const fn named(base: &'static str) -> Type {
        Type { base, dims: [0; MAX_DIMS] }
    }

    /// An array of `n` of this type.
    pub const fn array_of(self, n: usize) -> Type {
        assert!(n > 0, "a shared struct has no zero-length arrays");
        assert!(self.dims[MAX_DIMS - 1] == 0, "a shared struct's arrays have at most four dimensions");
        let d = self.dims;
        Type { base: self.base, dims: [n, d[0], d[1], d[2]] }
    }

    /// The array dimensions, outermost first; empty if not an array.
    pub fn dims(&self) -> &[usize] {
        let n = self.dims.iter().take_while(|&&d| d != 0).count();
        &self.dims[..n]
    }
}

impl Struct {
    /// Every shared struct, in declaration order.
    pub fn all() -> impl Iterator<Item = &'static Struct> {
        crate::ITEMS.iter().filter_map(|i| match i {
            Item::Struct(s) => Some(s),
            _ => None,
        })
    }
}

/// The widest a line with a comment after it may be (a tab counted as 8); a longer
/// comment goes above the line.
const WIDTH: usize = 100;

/// The C header: every shared item, for the programs (`#include "abi.h"`).
pub fn header() -> String {
    let mut h = String::new();
    h.push_str(concat!(
        "/* The maps sluice's kernel programs share with its daemon: layouts and constants.\n",
        " * Written by crates/ebpf/build.rs from the declarations in crates/ebpf-abi/src/lib.rs,\n",
        " * which are also the daemon's; do not edit, change those. A test in crates/ebpf holds\n",
        " * every struct's layout in the compiled programs' BTF to the Rust one. */\n",
        "#ifndef SLUICE_ABI_H\n",
        "#define SLUICE_ABI_H\n",
        "\n",
        "#include <linux/types.h>\n",
    ));
    // Constants that take a line each follow one another without a blank line.
    let mut after_one_line = false;
    for item in crate::ITEMS {
        match item {
            Item::Const(c) => define(&mut h, c, &mut after_one_line),
            Item::Group { doc, consts } => {
                h.push('\n');
                comment(&mut h, "", doc);
                after_one_line = true;
                for c in *consts {
                    define(&mut h, c, &mut after_one_line);
                }
            }
            Item::Struct(s) => {
                h.push('\n');
                comment(&mut h, "", s.doc);
                let _ = writeln!(h, "struct {} {{", s.name);
                for f in s.fields {
                    documented(&mut h, "\t", &format!("{};", declaration(f)), f.doc);
                }
                h.push_str("};\n");
                after_one_line = false;
            }
        }
    }
    h.push_str("\n#endif\n");
    h
}

/// `#define NAME value`, after a blank line unless it and the line before are each one
/// line.
fn define(h: &mut String, c: &Const, after_one_line: &mut bool) {
    let line = format!("#define {} {}", c.name, value(c));
    let one_line = fits("", &line, c.doc);
    if !(*after_one_line && one_line) {
        h.push('\n');
    }
    documented(h, "", &line, c.doc);
    *after_one_line = one_line;
}

/// A constant's value as a C literal: `(1u << n)` if it was declared as a shift, in
/// hexadecimal if it was declared so, else in decimal.
fn value(c: &Const) -> String {
    if c.expr.contains("<<") && c.value.is_power_of_two() {
        format!("(1{} << {})", c.suffix, c.value.trailing_zeros())
    } else if c.expr.starts_with("0x") {
        format!("0x{:x}{}", c.value, c.suffix)
    } else {
        format!("{}{}", c.value, c.suffix)
    }
}

/// Whether `line`, indented by `indent`, and its doc comment fit on one line.
fn fits(indent: &str, line: &str, doc: &[&str]) -> bool {
    match doc {
        [] => true,
        [text] => 8 * indent.len() + line.len() + c_text(text.trim()).len() + " /*  */".len() <= WIDTH,
        _ => false,
    }
}

/// `line` indented by `indent`, with its doc comment after it if both fit on one line,
/// else above it.
fn documented(h: &mut String, indent: &str, line: &str, doc: &[&str]) {
    match doc {
        [text] if fits(indent, line, doc) => {
            let _ = writeln!(h, "{indent}{line} /* {} */", c_text(text.trim()));
        }
        _ => {
            comment(h, indent, doc);
            let _ = writeln!(h, "{indent}{line}");
        }
    }
}

/// `base name[d0][d1]…`.
fn declaration(f: &Field) -> String {
    let mut d = format!("{} {}", f.ty.base, f.name);
    for n in f.ty.dims() {
        let _ = write!(d, "[{n}]");
    }
    d
}

/// A doc comment as a C block comment, each line indented by `indent`; nothing if empty.
fn comment(h: &mut String, indent: &str, doc: &[&str]) {
    for (i, line) in doc.iter().enumerate() {
        let text = c_text(line.strip_prefix(' ').unwrap_or(line));
        let open = if i == 0 { "/*" } else { " *" };
        let sep = if text.is_empty() { "" } else { " " };
        let _ = write!(h, "{indent}{open}{sep}{text}");
        h.push_str(if i + 1 == doc.len() { " */\n" } else { "\n" });
    }
}

/// A doc line as C comment text: rustdoc's links (``[`X`]``, ``[`X`](path)``) as plain
/// `` `X` ``, the Rust names of shared items as C spells them (`` `Port::flags` `` as
/// `` `sluice_port.flags` ``, `` `c::COUNT` `` as `` `C_COUNT` ``), and nothing that could end
/// the comment.
fn c_text(line: &str) -> String {
    let mut plain = String::new();
    let mut rest = line;
    while let Some(i) = rest.find("[`") {
        let Some(j) = rest[i..].find("`]").map(|j| i + j) else { break };
        plain.push_str(&rest[..i]);
        plain.push_str(&rest[i + 1..=j]);
        rest = &rest[j + 2..];
        if rest.starts_with('(')
            && let Some(k) = rest.find(')')
        {
            rest = &rest[k + 1..];
        }
    }
    plain.push_str(rest);
    let mut out = String::new();
    for (i, part) in plain.split('`').enumerate() {
        if i > 0 {
            out.push('`');
        }
        match c_name(part) {
            Some(c) if i % 2 == 1 => out.push_str(&c),
            _ => out.push_str(part),
        }
    }
    out.replace("*/", "* /")
}

/// How C spells the shared item Rust calls `rust` (a struct, a struct's field, a
/// constant), if it is one.
fn c_name(rust: &str) -> Option<String> {
    let (ty, field) = rust.split_once("::").unwrap_or((rust, ""));
    crate::ITEMS.iter().find_map(|item| match item {
        Item::Struct(s) if s.rust == ty && field.is_empty() => Some(format!("struct {}", s.name)),
        Item::Struct(s) if s.rust == ty => Some(format!("{}.{field}", s.name)),
        Item::Const(c) if c.rust == rust => Some(c.name.to_string()),
        Item::Group { consts, .. } => consts.iter().find(|c| c.rust == rust).map(|c| c.name.to_string()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_are_written_as_they_were_declared() {
        let h = header();
        assert!(h.contains("#define OF_REMOTE_DST (1 << 4)"), "{h}");
        assert!(h.contains("#define IN_GUEST (1u << 4)"), "{h}");
        assert!(h.contains("#define SLUICE_MARK 0x51ce0001u"), "{h}");
        assert!(h.contains("#define SLUICE_MAX_PORTS 1024u"), "{h}");
        assert!(h.contains(&format!("#define C_COUNT {} /* Counters per port. */\n", crate::c::COUNT)), "{h}");
        assert!(h.contains("#define HEARD_V6 6 /* `sluice_heard_event.family`: IPv6. */\n"), "{h}");
    }

    #[test]
    fn structs_are_written_field_by_field_with_their_arrays() {
        let h = header();
        let verdict = &h[h.find("struct sluice_verdict {").expect("declared")..];
        let verdict = &verdict[..verdict.find("};").expect("closed")];
        assert!(verdict.contains("\n\t__u8 n_out;"), "{verdict}");
        assert!(verdict.contains("\n\t__u8 next_mac[6];"), "{verdict}");
        assert!(verdict.contains("\n\tstruct sluice_out outputs[16];"), "{verdict}");
        assert!(h.contains(&format!("\t__u64 v[{}];", crate::c::COUNT)), "{h}");
    }

    #[test]
    fn every_item_has_a_c_name_of_its_own() {
        let h = header();
        assert!(h.starts_with("/*") && h.ends_with("#endif\n"));
        let mut names = std::collections::BTreeSet::new();
        for item in crate::ITEMS {
            let new = match item {
                Item::Const(c) => names.insert(c.name),
                Item::Group { consts, .. } => consts.iter().all(|c| names.insert(c.name)),
                Item::Struct(s) => names.insert(s.name),
            };
            assert!(new, "{item:?} reuses a C name");
        }
    }

    #[test]
    fn doc_comments_become_c_comments_that_cannot_be_closed_early() {
        let mut h = String::new();
        comment(&mut h, "\t", &[" one [`Input`]", "", " two */ [`c::COUNT`](crate::c::COUNT) `x` three"]);
        assert_eq!(h, "\t/* one `struct sluice_input`\n\t *\n\t * two * / `C_COUNT` `x` three */\n");
    }

    #[test]
    fn types_spell_their_arrays_outermost_first() {
        let t = Type::named("__u8").array_of(16).array_of(8);
        assert_eq!((t.base, t.dims()), ("__u8", &[8, 16][..]));
        assert_eq!(Type::named("__u32").dims(), &[] as &[usize]);
    }
}
