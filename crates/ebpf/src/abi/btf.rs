//! A reader of the BTF clang writes into a program's `.BTF` section (the kernel's
//! Documentation/bpf/btf.rst): just what the layout test needs — every struct's size, and
//! each member's name, offset and type as C spells it (`__u8`, `struct sluice_port`, with
//! array dimensions). Test code, reading the crate's own objects; every read is
//! bounds-checked all the same, and a type chain is followed at most `MAX_CHAIN` steps.

use object::{Object, ObjectSection};

/// The most typedefs, qualifiers and array levels a member's type may go through.
const MAX_CHAIN: usize = 32;

/// A struct as BTF describes it.
#[derive(Clone, Debug)]
pub struct BtfStruct {
    /// `sizeof`.
    pub size: u32,
    /// The members, in order.
    pub members: Vec<Member>,
}

/// A struct member.
#[derive(Clone, Debug)]
pub struct Member {
    /// Its name.
    pub name: String,
    /// The id of its type.
    pub ty: u32,
    /// Its offset in bits.
    pub bit_offset: u32,
    /// Its width in bits if it is a bitfield, else 0.
    pub bitfield: u32,
}

#[derive(Clone, Debug)]
enum Ty {
    Int {
        name: String,
    },
    Array {
        elem: u32,
        n: u32,
    },
    Struct {
        name: String,
        s: BtfStruct,
    },
    Typedef {
        name: String,
    },
    /// `const`, `volatile`, `restrict`, a type tag: the type it qualifies.
    Qualified {
        of: u32,
    },
    Other,
}

/// The types of one object.
pub struct Btf {
    /// By id; id 0 is `void`.
    types: Vec<Ty>,
}

impl Btf {
    /// The BTF of the ELF object `elf`.
    pub fn of_object(elf: &[u8]) -> Result<Btf, String> {
        let file = object::File::parse(elf).map_err(|e| format!("not an ELF object: {e}"))?;
        let section = file.section_by_name(".BTF").ok_or("the object has no .BTF section (compiled without -g?)")?;
        Btf::parse(section.data().map_err(|e| format!("reading .BTF: {e}"))?)
    }

    /// Parses a `.BTF` section.
    pub fn parse(data: &[u8]) -> Result<Btf, String> {
        let le = match data.get(..2) {
            Some([0x9f, 0xeb]) => true,
            Some([0xeb, 0x9f]) => false,
            _ => return Err("no BTF magic".into()),
        };
        let u32_at = |d: &[u8], at: usize| -> Result<u32, String> {
            let b: [u8; 4] = d
                .get(at..at.checked_add(4).ok_or("offset overflows")?)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| format!("BTF cut short at byte {at}"))?;
            Ok(if le { u32::from_le_bytes(b) } else { u32::from_be_bytes(b) })
        };
        let hdr_len = u32_at(data, 4)? as usize;
        let (type_off, type_len) = (u32_at(data, 8)? as usize, u32_at(data, 12)? as usize);
        let (str_off, str_len) = (u32_at(data, 16)? as usize, u32_at(data, 20)? as usize);
        let section = |off: usize, len: usize| {
            let start = hdr_len.checked_add(off).ok_or("offset overflows")?;
            data.get(start..start.checked_add(len).ok_or("length overflows")?).ok_or("a BTF section past its end")
        };
        let (types, strings) = (section(type_off, type_len)?, section(str_off, str_len)?);
        let string = |off: u32| -> Result<String, String> {
            let s = strings.get(off as usize..).ok_or_else(|| format!("string offset {off} past the strings"))?;
            let end = s.iter().position(|&b| b == 0).ok_or("an unterminated string")?;
            String::from_utf8(s[..end].to_vec()).map_err(|_| "a string that is not UTF-8".into())
        };

        let mut out = vec![Ty::Other];
        let mut at = 0;
        while at < types.len() {
            let (name_off, info, size_or_type) = (u32_at(types, at)?, u32_at(types, at + 4)?, u32_at(types, at + 8)?);
            at += 12;
            let (kind, vlen, kind_flag) = ((info >> 24) & 0x1f, (info & 0xffff) as usize, info >> 31 == 1);
            let ty = match kind {
                1 => Ty::Int { name: string(name_off)? },
                3 => Ty::Array { elem: u32_at(types, at)?, n: u32_at(types, at + 8)? },
                4 => {
                    let mut members = Vec::with_capacity(vlen);
                    for m in 0..vlen {
                        let base = at + 12 * m;
                        let off = u32_at(types, base + 8)?;
                        let (bit_offset, bitfield) = if kind_flag { (off & 0xff_ffff, off >> 24) } else { (off, 0) };
                        members.push(Member {
                            name: string(u32_at(types, base)?)?,
                            ty: u32_at(types, base + 4)?,
                            bit_offset,
                            bitfield,
                        });
                    }
                    Ty::Struct { name: string(name_off)?, s: BtfStruct { size: size_or_type, members } }
                }
                8 => Ty::Typedef { name: string(name_off)? },
                9 | 10 | 11 | 18 => Ty::Qualified { of: size_or_type },
                2 | 5..=7 | 12..=17 | 19 => Ty::Other,
                k => return Err(format!("BTF kind {k}, which this reader does not know")),
            };
            at += match kind {
                1 | 14 | 17 => 4,
                3 => 12,
                4 | 5 | 15 | 19 => 12 * vlen,
                6 | 13 => 8 * vlen,
                _ => 0,
            };
            out.push(ty);
        }
        Ok(Btf { types: out })
    }

    /// The struct tagged `name`, if the object has it.
    pub fn struct_named(&self, name: &str) -> Option<&BtfStruct> {
        self.types.iter().find_map(|t| match t {
            Ty::Struct { name: n, s } if n == name => Some(s),
            _ => None,
        })
    }

    /// How C spells the type `id`: its base type (a typedef's or an integer's name,
    /// `struct NAME`) and its array dimensions, outermost first.
    pub fn c_type(&self, mut id: u32) -> Result<(String, Vec<usize>), String> {
        let mut dims = Vec::new();
        for _ in 0..MAX_CHAIN {
            match self.types.get(id as usize).ok_or_else(|| format!("no type {id}"))? {
                Ty::Int { name } | Ty::Typedef { name } => return Ok((name.clone(), dims)),
                Ty::Struct { name, .. } => return Ok((format!("struct {name}"), dims)),
                Ty::Array { elem, n } => {
                    dims.push(*n as usize);
                    id = *elem;
                }
                Ty::Qualified { of } => id = *of,
                Ty::Other => return Err(format!("type {id} is neither an integer, an array nor a struct")),
            }
        }
        Err(format!("type {id} goes through more than {MAX_CHAIN} arrays and qualifiers"))
    }
}
