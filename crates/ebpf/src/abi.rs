//! The maps' layouts and the constants the programs share with this crate: the items of
//! sluice-ebpf-abi, where each is declared once. build.rs writes the programs' C header
//! (`OUT_DIR/abi.h`) from the same declarations, and the tests below hold every struct's
//! size, field offsets and field types in the compiled programs' BTF to the Rust layout.

pub use sluice_ebpf_abi::*;

#[cfg(all(test, sluice_bpf))]
mod btf;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_bounds_gso_frames_as_the_core_does() {
        assert_eq!((MIN_GSO_SIZE, MAX_GSO_SEGMENTS), (sluice_switch::MIN_GSO_SIZE, sluice_switch::MAX_GSO_SEGMENTS));
    }

    #[test]
    fn drop_causes_are_counted_at_the_cores_indexes() {
        use sluice_switch::DropCause;
        let all = DropCause::ALL;
        assert!(all.len() <= c::TX_DROP - c::RX_DROP && all.len() <= c::FLOODED - c::TX_DROP, "a row per direction");
        for (cause, at) in [
            (DropCause::Malformed, d::MALFORMED),
            (DropCause::VlanFilter, d::VLAN_FILTER),
            (DropCause::OverMtu, d::OVER_MTU),
            (DropCause::UnknownPort, d::UNKNOWN_PORT),
            (DropCause::SamePort, d::SAME_PORT),
            (DropCause::TxError, d::TX_ERROR),
            (DropCause::Isolated, d::ISOLATED),
            (DropCause::SpoofedMac, d::SPOOFED_MAC),
            (DropCause::SpoofedIp, d::SPOOFED_IP),
            (DropCause::NotIp, d::NOT_IP),
            (DropCause::NoRoute, d::NO_ROUTE),
            (DropCause::UpcallLost, d::UPCALL_LOST),
            (DropCause::GsoLimit, d::GSO_LIMIT),
            (DropCause::UnknownEndpoint, d::UNKNOWN_ENDPOINT),
            (DropCause::EgressRefused, d::EGRESS_REFUSED),
            (DropCause::UpcallLimit, d::UPCALL_LIMIT),
            (DropCause::LinkLocal, d::LINK_LOCAL),
            (DropCause::Storm, d::STORM),
            (DropCause::RateLimit, d::RATE_LIMIT),
        ] {
            assert_eq!(all.iter().position(|&c| c == cause), Some(at), "{cause:?}");
        }
    }

    #[cfg(sluice_bpf)]
    mod layouts {
        use super::super::btf::{Btf, BtfStruct};
        use super::*;

        /// How the struct `b` of `btf` differs from the Rust layout `s`, a sentence each.
        fn differences(s: &Struct, b: &BtfStruct, btf: &Btf) -> Vec<String> {
            let mut d = Vec::new();
            if b.size as usize != s.size {
                d.push(format!("{} bytes in C, {} in Rust", b.size, s.size));
            }
            if b.members.len() != s.fields.len() {
                d.push(format!("{} members in C, {} fields in Rust", b.members.len(), s.fields.len()));
            }
            for (m, f) in b.members.iter().zip(s.fields) {
                if m.name != f.name {
                    d.push(format!("member `{}` in C where Rust has `{}`", m.name, f.name));
                }
                if m.bitfield != 0 || m.bit_offset % 8 != 0 {
                    d.push(format!("`{}` is a bitfield or at bit {} in C", f.name, m.bit_offset));
                } else if (m.bit_offset / 8) as usize != f.offset {
                    d.push(format!("`{}` at byte {} in C, {} in Rust", f.name, m.bit_offset / 8, f.offset));
                }
                match btf.c_type(m.ty) {
                    Ok((base, dims)) if (base.as_str(), dims.as_slice()) == (f.ty.base, f.ty.dims()) => {}
                    Ok((base, dims)) => d.push(format!(
                        "`{}` is {} in C, {} in Rust",
                        f.name,
                        spell(&base, &dims),
                        spell(f.ty.base, f.ty.dims())
                    )),
                    Err(e) => d.push(format!("`{}`: {e}", f.name)),
                }
            }
            d
        }

        /// `__u8[6]`.
        fn spell(base: &str, dims: &[usize]) -> String {
            dims.iter().fold(base.to_string(), |t, n| format!("{t}[{n}]"))
        }

        /// Every difference between the programs' structs and the Rust ones.
        fn check(btfs: &[(&str, Btf)]) -> Vec<String> {
            let mut wrong = Vec::new();
            for s in Struct::all() {
                let mut seen = false;
                for (obj, btf) in btfs {
                    if let Some(b) = btf.struct_named(s.name) {
                        seen = true;
                        wrong.extend(
                            differences(s, b, btf).into_iter().map(|d| format!("{obj}: struct {}: {d}", s.name)),
                        );
                    }
                }
                if !seen {
                    wrong.push(format!(
                        "struct {} ({}) is in no program's BTF, so its layout is not checked: use it in a map",
                        s.name, s.rust
                    ));
                }
            }
            wrong
        }

        /// The types of each program the crate embeds, by the program's name.
        fn btfs() -> Vec<(&'static str, Btf)> {
            [("exec.o", crate::exec::OBJECT), ("tunnel_filter.o", crate::tunnel_filter::OBJECT)]
                .into_iter()
                .map(|(name, o)| (name, Btf::of_object(o).unwrap_or_else(|e| panic!("{name}: {e}"))))
                .collect()
        }

        #[test]
        fn every_shared_struct_has_the_rust_layout_in_the_programs() {
            let wrong = check(&btfs());
            assert!(wrong.is_empty(), "the programs' layouts are not the Rust ones:\n{}", wrong.join("\n"));
        }

        /// The check itself: a struct whose member moved, changed type or grew is reported.
        #[test]
        fn a_layout_that_differs_is_reported() {
            let btfs = btfs();
            let (_, btf) = &btfs[0];
            let out = Struct::all().find(|s| s.name == "sluice_out").expect("declared");
            let real = btf.struct_named("sluice_out").expect("in exec.o");
            let field = |n: &str| real.members.iter().position(|m| m.name == n).expect("a member");
            let (mtu, ifindex) = (field("mtu"), field("ifindex"));

            let mut wider = real.clone();
            wider.members[mtu].ty = real.members[ifindex].ty;
            let mut moved = real.clone();
            moved.members[mtu].bit_offset += 8;
            let mut bigger = real.clone();
            bigger.size += 8;
            for (wrong, says) in [
                (wider, "`mtu` is __u32 in C, __u16 in Rust"),
                (moved, "`mtu` at byte 11 in C, 10 in Rust"),
                (bigger, "48 bytes in C, 40 in Rust"),
            ] {
                let d = differences(out, &wrong, btf);
                assert!(d.len() == 1 && d[0].contains(says), "{d:?}");
            }
        }
    }
}
