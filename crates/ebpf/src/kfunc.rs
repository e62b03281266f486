//! Kernel functions (kfuncs) for an aya that cannot load them: the program calls each one
//! as a helper with a placeholder id ([`KFUNCS`]), and before aya reads the object every
//! such call in its program sections is rewritten into a kfunc call
//! (`BPF_PSEUDO_KFUNC_CALL`) with the function's id in the running kernel's BTF. aya 0.13
//! leaves those calls alone; the verifier checks each against the kernel's prototype.
//! A placeholder whose kfunc the kernel lacks is an error that names it.

use object::{Object, ObjectSection, SectionFlags};

/// The kfuncs the programs may call: (placeholder helper id, name in the kernel's BTF).
/// The programs declare `static … (*NAME)(…) = (void *)ID;` with these ids.
pub const KFUNCS: [(i32, &str); 8] = [
    (0x7f00, "bpf_skb_ct_lookup"),
    (0x7f01, "bpf_skb_ct_alloc"),
    (0x7f02, "bpf_ct_insert_entry"),
    (0x7f03, "bpf_ct_release"),
    (0x7f04, "bpf_ct_set_timeout"),
    (0x7f05, "bpf_ct_change_timeout"),
    (0x7f06, "bpf_ct_set_status"),
    (0x7f07, "bpf_ct_change_status"),
];

/// `BPF_JMP | BPF_CALL`.
const CALL: u8 = 0x85;
/// `BPF_LD | BPF_IMM | BPF_DW`: the one instruction of two slots.
const LDDW: u8 = 0x18;
/// The call's `src_reg` for a kfunc.
const PSEUDO_KFUNC_CALL: u8 = 2;
/// `SHF_EXECINSTR`.
const SHF_EXECINSTR: u64 = 0x4;

/// Rewrites, in ELF object `elf`, every placeholder call of the program sections into a call
/// of the kfunc whose id `id_of` gives (its name → its BTF id, `None`: the kernel lacks it).
/// Returns how many calls it rewrote.
pub fn rewrite_calls(elf: &mut [u8], id_of: impl Fn(&str) -> Option<u32>) -> Result<usize, String> {
    let ranges: Vec<(u64, u64, String)> = {
        let file = object::File::parse(&*elf).map_err(|e| format!("not an ELF object: {e}"))?;
        file.sections()
            .filter(|s| matches!(s.flags(), SectionFlags::Elf { sh_flags } if sh_flags & SHF_EXECINSTR != 0))
            .filter_map(|s| {
                let (off, len) = s.file_range()?;
                Some((off, len, s.name().unwrap_or("?").to_string()))
            })
            .collect()
    };
    let mut n = 0;
    for (off, len, section) in ranges {
        let (off, len) =
            (usize::try_from(off).map_err(|e| e.to_string())?, usize::try_from(len).map_err(|e| e.to_string())?);
        let code = elf.get_mut(off..off + len).ok_or_else(|| format!("section {section} lies past the file's end"))?;
        if !len.is_multiple_of(8) {
            return Err(format!("section {section} is not a whole number of instructions"));
        }
        let mut i = 0;
        while i < len {
            let insn = &mut code[i..i + 8];
            if insn[0] == LDDW {
                i += 16;
                continue;
            }
            let imm = i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
            if insn[0] == CALL
                && insn[1] == 0
                && let Some((_, name)) = KFUNCS.iter().find(|(id, _)| *id == imm)
            {
                let id = id_of(name).ok_or_else(|| {
                    format!(
                        "this kernel has no kfunc {name} (needs nf_conntrack built in, or loaded, with BTF: CONFIG_NF_CONNTRACK and CONFIG_DEBUG_INFO_BTF)"
                    )
                })?;
                insn[1] = PSEUDO_KFUNC_CALL << 4;
                insn[2..4].copy_from_slice(&0u16.to_le_bytes());
                insn[4..8].copy_from_slice(&id.to_le_bytes());
                n += 1;
            }
            i += 8;
        }
    }
    Ok(n)
}

/// The ids of [`KFUNCS`] in the running kernel's BTF (`/sys/kernel/btf/vmlinux`), or why
/// not: the check a switch makes before it relies on them.
pub fn kernel_ids() -> Result<Vec<(&'static str, u32)>, String> {
    let btf = aya::Btf::from_sys_fs().map_err(|e| format!("cannot read the kernel's BTF: {e}"))?;
    KFUNCS
        .iter()
        .map(|&(_, name)| {
            btf.id_by_type_name_kind(name, aya_obj::btf::BtfKind::Func)
                .map(|id| (name, id))
                .map_err(|_| format!("this kernel has no kfunc {name} in its BTF (CONFIG_NF_CONNTRACK=y is needed)"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 relocatable object: a program section `classifier` holding `code`,
    /// and a data section `.data` holding the same bytes (not to be touched).
    fn elf(code: &[u8]) -> Vec<u8> {
        let shstr = b"\0classifier\0.data\0.shstrtab\0";
        let mut f = vec![0u8; 64];
        f[..4].copy_from_slice(b"\x7fELF");
        f[4] = 2; // 64-bit
        f[5] = 1; // little endian
        f[6] = 1;
        f[16..18].copy_from_slice(&1u16.to_le_bytes()); // ET_REL
        f[18..20].copy_from_slice(&247u16.to_le_bytes()); // EM_BPF
        f[20..24].copy_from_slice(&1u32.to_le_bytes());
        let text = f.len();
        f.extend_from_slice(code);
        let data = f.len();
        f.extend_from_slice(code);
        let strtab = f.len();
        f.extend_from_slice(shstr);
        while !f.len().is_multiple_of(8) {
            f.push(0);
        }
        let shoff = f.len();
        let sh = |name: u32, ty: u32, flags: u64, off: usize, size: usize| {
            let mut h = vec![0u8; 64];
            h[0..4].copy_from_slice(&name.to_le_bytes());
            h[4..8].copy_from_slice(&ty.to_le_bytes());
            h[8..16].copy_from_slice(&flags.to_le_bytes());
            h[24..32].copy_from_slice(&(off as u64).to_le_bytes());
            h[32..40].copy_from_slice(&(size as u64).to_le_bytes());
            h[48..56].copy_from_slice(&8u64.to_le_bytes());
            h
        };
        f.extend(sh(0, 0, 0, 0, 0));
        f.extend(sh(1, 1, 0x2 | SHF_EXECINSTR, text, code.len()));
        f.extend(sh(12, 1, 0x2 | 0x1, data, code.len()));
        f.extend(sh(18, 3, 0, strtab, shstr.len()));
        f[40..48].copy_from_slice(&(shoff as u64).to_le_bytes());
        f[52..54].copy_from_slice(&64u16.to_le_bytes()); // ehsize
        f[58..60].copy_from_slice(&64u16.to_le_bytes()); // shentsize
        f[60..62].copy_from_slice(&4u16.to_le_bytes()); // shnum
        f[62..64].copy_from_slice(&3u16.to_le_bytes()); // shstrndx
        f
    }

    fn insn(code: u8, regs: u8, imm: i32) -> [u8; 8] {
        let mut i = [0u8; 8];
        i[0] = code;
        i[1] = regs;
        i[4..8].copy_from_slice(&imm.to_le_bytes());
        i
    }

    #[test]
    fn placeholder_calls_in_program_sections_become_kfunc_calls() {
        let mut code = Vec::new();
        code.extend(insn(CALL, 0, 0x7f00)); // a kfunc placeholder
        code.extend(insn(CALL, 0, 1)); // a helper: left as it is
        code.extend(insn(LDDW, 0x01, 0)); // lddw whose second slot looks like a placeholder call
        code.extend(insn(CALL, 0, 0x7f03));
        code.extend(insn(CALL, 0, 0x7f03)); // a real one after it
        code.extend(insn(0x95, 0, 0)); // exit
        let mut f = elf(&code);
        let ids = |n: &str| KFUNCS.iter().position(|(_, k)| *k == n).map(|p| 1000 + p as u32);
        assert_eq!(rewrite_calls(&mut f, ids), Ok(2));
        let text = 64;
        assert_eq!(&f[text..text + 8], &insn(CALL, 2 << 4, 1000), "lookup");
        assert_eq!(&f[text + 8..text + 16], &insn(CALL, 0, 1), "the helper");
        assert_eq!(&f[text + 24..text + 32], &insn(CALL, 0, 0x7f03), "lddw's second half is data");
        assert_eq!(&f[text + 32..text + 40], &insn(CALL, 2 << 4, 1003), "release");
        let data = text + code.len();
        assert_eq!(&f[data..data + code.len()], &code[..], "a data section is not code");
        let e = rewrite_calls(&mut elf(&code), |_| None).unwrap_err();
        assert!(e.contains("bpf_skb_ct_lookup"), "{e}");
    }
}
