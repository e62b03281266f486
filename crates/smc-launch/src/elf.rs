//! What the launcher reads of a program's ELF file: whether it has an interpreter (is
//! dynamically linked), which libraries it names as needed (`DT_NEEDED`), and the names of
//! its sections (a Go program has `.go.buildinfo`). 64-bit
//! little-endian files only; anything else, or a file cut short, reads as "cannot tell".

/// An ELF file's bytes, checked to be 64-bit little-endian.
pub struct Elf<'a>(&'a [u8]);

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;

impl<'a> Elf<'a> {
    /// The file, if it is a 64-bit little-endian ELF file.
    pub fn parse(b: &'a [u8]) -> Option<Elf<'a>> {
        (b.len() >= 64 && &b[..4] == b"\x7fELF" && b[4] == 2 && b[5] == 1).then_some(Elf(b))
    }

    fn u16_at(&self, o: usize) -> Option<u64> {
        Some(u16::from_le_bytes(self.0.get(o..o.checked_add(2)?)?.try_into().ok()?).into())
    }

    fn u32_at(&self, o: usize) -> Option<u64> {
        Some(u32::from_le_bytes(self.0.get(o..o.checked_add(4)?)?.try_into().ok()?).into())
    }

    fn u64_at(&self, o: usize) -> Option<u64> {
        Some(u64::from_le_bytes(self.0.get(o..o.checked_add(8)?)?.try_into().ok()?))
    }

    /// The program headers: (type, file offset, virtual address, file size).
    fn segments(&self) -> impl Iterator<Item = (u32, u64, u64, u64)> + '_ {
        let phoff = self.u64_at(32).unwrap_or(0) as usize;
        let size = self.u16_at(54).unwrap_or(0) as usize;
        let count = if size < 56 { 0 } else { self.u16_at(56).unwrap_or(0) as usize };
        (0..count).map_while(move |i| {
            let at = phoff.checked_add(i.checked_mul(size)?)?;
            Some((
                self.u32_at(at)? as u32,
                self.u64_at(at.checked_add(8)?)?,
                self.u64_at(at.checked_add(16)?)?,
                self.u64_at(at.checked_add(32)?)?,
            ))
        })
    }

    /// True when the file asks for an interpreter (the dynamic loader).
    pub fn has_interp(&self) -> bool {
        self.segments().any(|(t, ..)| t == PT_INTERP)
    }

    /// The file offset of virtual address `addr`, through the loaded segments.
    fn offset_of(&self, addr: u64) -> Option<u64> {
        self.segments()
            .find(|&(t, _, va, size)| t == PT_LOAD && addr >= va && addr - va < size)
            .and_then(|(_, off, va, _)| off.checked_add(addr - va))
    }

    /// The names of the file's sections (at most 512; none when it has no table of them).
    pub fn section_names(&self) -> Vec<String> {
        let shoff = self.u64_at(40).unwrap_or(0) as usize;
        let size = self.u16_at(58).unwrap_or(0) as usize;
        let count = if size < 64 { 0 } else { (self.u16_at(60).unwrap_or(0) as usize).min(512) };
        let strndx = self.u16_at(62).unwrap_or(0) as usize;
        let header = |i: usize| shoff.checked_add(i.checked_mul(size)?);
        // The section of names: its file offset.
        let Some(names) = header(strndx).and_then(|h| self.u64_at(h.checked_add(24)?)) else { return Vec::new() };
        (0..count)
            .filter_map(|i| {
                let name = self.u32_at(header(i)?)?;
                let start = usize::try_from(names.checked_add(name)?).ok()?;
                let rest = self.0.get(start..)?;
                let end = rest.iter().take(256).position(|&c| c == 0)?;
                Some(String::from_utf8_lossy(&rest[..end]).into_owned())
            })
            .collect()
    }

    /// The libraries the file names as needed, in order (empty for a static program).
    pub fn needed(&self) -> Vec<String> {
        let Some((_, dyn_off, _, dyn_size)) = self.segments().find(|&(t, ..)| t == PT_DYNAMIC) else {
            return Vec::new();
        };
        let entries: Vec<(u64, u64)> = (0..dyn_size / 16)
            .map_while(|i| {
                let at = usize::try_from(dyn_off.checked_add(i * 16)?).ok()?;
                Some((self.u64_at(at)?, self.u64_at(at.checked_add(8)?)?))
            })
            .take_while(|&(tag, _)| tag != 0)
            .collect();
        let Some(strtab) = entries.iter().find(|e| e.0 == DT_STRTAB).and_then(|e| self.offset_of(e.1)) else {
            return Vec::new();
        };
        entries
            .iter()
            .filter(|e| e.0 == DT_NEEDED)
            .filter_map(|e| {
                let start = usize::try_from(strtab.checked_add(e.1)?).ok()?;
                let rest = self.0.get(start..)?;
                let name = &rest[..rest.iter().position(|&c| c == 0)?];
                Some(String::from_utf8_lossy(name).into_owned())
            })
            .collect()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    #[test]
    fn a_dynamic_programs_libraries_are_read() {
        let b = std::fs::read("/bin/sh").unwrap();
        let e = Elf::parse(&b).unwrap();
        assert!(e.has_interp());
        assert!(e.needed().iter().any(|l| l.starts_with("libc.so")), "{:?}", e.needed());
    }

    /// A minimal dynamic ELF file naming `libs` as needed: the header, a PT_LOAD of the
    /// whole file, a PT_DYNAMIC, the dynamic entries and the string table.
    pub fn tiny(libs: &[&str]) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[..6].copy_from_slice(b"\x7fELF\x02\x01");
        b[32..40].copy_from_slice(&64u64.to_le_bytes());
        b[54..56].copy_from_slice(&56u16.to_le_bytes());
        b[56..58].copy_from_slice(&2u16.to_le_bytes());
        let dyn_at = 64 + 2 * 56;
        let dyn_len = (libs.len() + 2) * 16;
        let str_at = dyn_at + dyn_len;
        let mut strtab = vec![0u8];
        let mut offs = Vec::new();
        for l in libs {
            offs.push(strtab.len() as u64);
            strtab.extend_from_slice(l.as_bytes());
            strtab.push(0);
        }
        let total = (str_at + strtab.len()) as u64;
        let ph = |t: u32, off: u64, size: u64| {
            let mut p = vec![0u8; 56];
            p[..4].copy_from_slice(&t.to_le_bytes());
            p[8..16].copy_from_slice(&off.to_le_bytes());
            p[16..24].copy_from_slice(&(0x400000 + off).to_le_bytes());
            p[32..40].copy_from_slice(&size.to_le_bytes());
            p
        };
        b.extend(ph(PT_LOAD, 0, total));
        b.extend(ph(PT_DYNAMIC, dyn_at as u64, dyn_len as u64));
        let mut entry = |tag: u64, val: u64| {
            b.extend(tag.to_le_bytes());
            b.extend(val.to_le_bytes());
        };
        entry(DT_STRTAB, 0x400000 + str_at as u64);
        for o in offs {
            entry(DT_NEEDED, o);
        }
        entry(0, 0);
        b.extend(strtab);
        b
    }

    #[test]
    fn needed_libraries_are_read_through_the_string_table() {
        let b = tiny(&["libc.so.6", "liburing.so.2"]);
        let e = Elf::parse(&b).unwrap();
        assert_eq!(e.needed(), ["libc.so.6", "liburing.so.2"]);
        assert!(!e.has_interp());
    }

    #[test]
    fn what_is_not_elf_or_is_cut_short_reads_as_nothing() {
        assert!(Elf::parse(b"#!/bin/sh\n").is_none());
        let b = std::fs::read("/bin/sh").unwrap();
        let whole = Elf::parse(&b).unwrap().needed();
        for cut in (64..b.len().min(20_000)).step_by(97) {
            // No panic, and nothing read that is not there.
            let part = Elf::parse(&b[..cut]).unwrap().needed();
            assert!(part.iter().all(|l| whole.contains(l)), "{cut}: {part:?}");
        }
        let mut junk = b[..64].to_vec();
        junk[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        junk[54..58].copy_from_slice(&[56, 0, 0xff, 0xff]);
        let e = Elf::parse(&junk).unwrap();
        assert!(!e.has_interp() && e.needed().is_empty());
    }
}
