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
    rewrite(elf, id_of, false).map(|(n, _)| n)
}

/// As [`rewrite_calls`], but a call of a kfunc the kernel lacks becomes `r0 = 0` (no
/// entry, no allocation, success): the executor then sees every connection as new and
/// commits none. Returns how many calls it rewrote and how many it replaced so.
pub fn rewrite_calls_or_null(elf: &mut [u8], id_of: impl Fn(&str) -> Option<u32>) -> Result<(usize, usize), String> {
    rewrite(elf, id_of, true)
}

/// `BPF_ALU64 | BPF_MOV | BPF_K`.
const MOV64_IMM: u8 = 0xb7;

fn rewrite(elf: &mut [u8], id_of: impl Fn(&str) -> Option<u32>, stub: bool) -> Result<(usize, usize), String> {
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
    let (mut n, mut stubbed) = (0, 0);
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
                if stub && id_of(name).is_none() {
                    insn.copy_from_slice(&[MOV64_IMM, 0, 0, 0, 0, 0, 0, 0]);
                    stubbed += 1;
                    i += 8;
                    continue;
                }
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
    Ok((n, stubbed))
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

/// The probe (`bpf/ct_probe.c`): the conntrack kfuncs called as the kernel datapath is to
/// call them, loaded (so this kernel's verifier took the rewritten calls).
pub struct Probe {
    ebpf: aya::Ebpf,
}

/// What [`Probe::run`] found of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probed {
    /// Not an IPv4 TCP or UDP frame, or a kfunc failed.
    Other,
    /// No connection: it was remembered now.
    Committed,
    /// Its connection, in the direction it was opened.
    Original,
    /// Its connection's return direction.
    Reply,
    /// No connection, and the table is full.
    Full,
}

const PROBE_PROGRAM: &str = "sluice_ct_probe";

impl Probe {
    /// Loads the probe (its kfunc calls rewritten for this kernel): the check that this
    /// kernel takes conntrack kfunc calls from a TC program.
    pub fn load() -> Result<Probe, String> {
        #[cfg(sluice_bpf)]
        static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ct_probe.o"));
        #[cfg(not(sluice_bpf))]
        static OBJECT: &[u8] = &[];
        if OBJECT.is_empty() {
            return Err(crate::Error::NotBuilt.to_string());
        }
        let ids = kernel_ids()?;
        let mut object = OBJECT.to_vec();
        rewrite_calls(&mut object, |n| ids.iter().find(|(k, _)| *k == n).map(|&(_, id)| id))?;
        let mut ebpf = aya::EbpfLoader::new().load(&object).map_err(|e| format!("{e:#}"))?;
        let prog: &mut aya::programs::SchedClassifier = ebpf
            .program_mut(PROBE_PROGRAM)
            .ok_or("the probe has no program")?
            .try_into()
            .map_err(|e| format!("{e}"))?;
        prog.load().map_err(|e| crate::verifier_log(&e))?;
        Ok(Probe { ebpf })
    }

    /// Runs the probe on `frame` (`BPF_PROG_TEST_RUN`, in the calling thread's network
    /// namespace's connection table, zone 77).
    pub fn run(&self, frame: &[u8]) -> Result<Probed, String> {
        use std::os::fd::{AsFd, AsRawFd};
        let prog: &aya::programs::SchedClassifier =
            self.ebpf.program(PROBE_PROGRAM).and_then(|p| p.try_into().ok()).ok_or("the probe has no program")?;
        let fd = prog.fd().map_err(|e| e.to_string())?;
        let mut skb = crate::sys::SkBuff::default();
        let mut out = vec![0u8; frame.len() + 256];
        let (code, _) = crate::sys::prog_test_run(fd.as_fd().as_raw_fd(), frame, &mut out, &mut skb)
            .map_err(|e| format!("running the probe (BPF_PROG_TEST_RUN): {e}"))?;
        Ok(match code {
            1 => Probed::Committed,
            2 => Probed::Original,
            3 => Probed::Reply,
            4 => Probed::Full,
            _ => Probed::Other,
        })
    }
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
        // Or, for the executor, a missing kfunc's call is `r0 = 0`.
        let mut f = elf(&code);
        let only_release = |n: &str| (n == "bpf_ct_release").then_some(7);
        assert_eq!(rewrite_calls_or_null(&mut f, only_release), Ok((1, 1)));
        assert_eq!(&f[text..text + 8], &insn(MOV64_IMM, 0, 0), "lookup: r0 = 0");
        assert_eq!(&f[text + 32..text + 40], &insn(CALL, 2 << 4, 7), "release");
    }
}
