//! Compiles the kernel datapath's programs (`bpf/exec.c`: the verdict executor and the
//! egress guard), a program the verifier refuses for a test (`bpf/rejected.c`) and the
//! user-space tunnels' socket filter (`bpf/tunnel_filter.c`), and the conntrack kfuncs'
//! probe (`bpf/ct_probe.c`) with clang into objects the crate embeds. First it
//! writes the header they include, `OUT_DIR/abi.h`, from the declarations in
//! sluice-ebpf-abi that are also the crate's Rust structs: the maps' layouts are written
//! once. Without clang the crate builds all the same, with no programs in it:
//! `--datapath kernel` then says so and how to get them, and a tunnel checks its senders in
//! user space (docs/architecture.md, "The kernel datapath", "Tunnels and the underlay").

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo"));
    println!("cargo::rustc-check-cfg=cfg(sluice_bpf)");
    for f in ["bpf/exec.c", "bpf/rejected.c", "bpf/tunnel_filter.c", "bpf/ct_probe.c", "bpf/conntrack.h"] {
        println!("cargo::rerun-if-changed={}", manifest.join(f).display());
    }
    println!("cargo::rerun-if-env-changed=CLANG");
    std::fs::write(out.join("abi.h"), sluice_ebpf_abi::header()).expect("writing OUT_DIR/abi.h");
    let clang = std::env::var_os("CLANG").unwrap_or_else(|| "clang".into());
    // The UAPI headers' <asm/…> live under the target's multiarch directory on Debian.
    let arch = match std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => "x86_64-linux-gnu",
        Ok("aarch64") => "aarch64-linux-gnu",
        Ok(other) => panic!("sluice-ebpf: no multiarch include directory known for {other}"),
        Err(_) => "x86_64-linux-gnu",
    };
    if !std::path::Path::new("/usr/include/bpf/bpf_helpers.h").exists() {
        println!(
            "cargo::warning=sluice-ebpf: no libbpf headers (/usr/include/bpf): this build has no kernel datapath; install clang and libbpf-dev (apt-get install clang libbpf-dev) and build again to get it"
        );
        return;
    }
    let compile = |src: &str, obj: &str| {
        Command::new(&clang)
            .args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpf"])
            .arg("-I")
            .arg(&out)
            .arg(format!("-I/usr/include/{arch}"))
            .arg("-c")
            .arg(manifest.join(src))
            .arg("-o")
            .arg(out.join(obj))
            .status()
    };
    match compile("bpf/exec.c", "exec.o") {
        Ok(s) if s.success() => {
            println!("cargo::rustc-cfg=sluice_bpf");
            for (src, obj) in [
                ("bpf/rejected.c", "rejected.o"),
                ("bpf/tunnel_filter.c", "tunnel_filter.o"),
                ("bpf/ct_probe.c", "ct_probe.o"),
            ] {
                let r = compile(src, obj);
                assert!(r.is_ok_and(|s| s.success()), "sluice-ebpf: clang failed to compile {src}");
            }
        }
        Ok(s) => panic!("sluice-ebpf: clang failed to compile bpf/exec.c ({s})"),
        Err(e) => println!(
            "cargo::warning=sluice-ebpf: no clang ({e}): this build has no kernel datapath; install clang and libbpf-dev (apt-get install clang libbpf-dev) and build again to get it"
        ),
    }
}
