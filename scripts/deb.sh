#!/usr/bin/env bash
# Builds sluice's Debian package from this checkout with dpkg-deb (docs/install.md says why
# not cargo-deb or debhelper): target/debian/sluice_VERSION_ARCH.deb, holding
#   /usr/bin/sluice                         the binary, stripped
#   /usr/lib/cni/sluice-cni                 the CNI plugin, when the workspace builds one
#   /usr/lib/systemd/system/*               the units in dist/systemd/, when there are any
#   /usr/share/man/man1/sluice*.1.gz        `sluice man`'s pages
#   /usr/share/{bash-completion,zsh,fish}/… `sluice completion`'s scripts
#   /usr/share/doc/sluice/                  README, docs/*.md, examples/, copyright, changelog
# Depends comes from the binaries' shared libraries (dpkg-shlibdeps) plus iproute2, which
# the daemon runs. Needs dpkg-dev and binutils; no root (dpkg-deb --root-owner-group).
#
#   scripts/deb.sh                 build (cargo build --release --locked) and package
#   scripts/deb.sh --no-build      package the binaries target/release already holds
#                                  ($CARGO_TARGET_DIR/release when that is set)
#   scripts/deb.sh --out DIR       write the package to DIR instead of target/debian
#
# The maintainer named in the package is $DEBFULLNAME <$DEBEMAIL> when both are set, else
# git's user.name and user.email, else the last commit's author. SOURCE_DATE_EPOCH (default: the last commit's time) dates
# the changelog and the manual pages and clamps the files' times, so that two runs on the
# same commit give the same package.
set -euo pipefail
cd "$(dirname "$0")/.."

usage="usage: scripts/deb.sh [--no-build] [--out DIR]"
build=true
out=target/debian
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build=false ;;
        --out)
            [ $# -ge 2 ] || { echo "scripts/deb.sh: --out needs a directory ($usage)" >&2; exit 2; }
            out="$2"
            shift
            ;;
        -h | --help) echo "$usage"; exit 0 ;;
        *) echo "scripts/deb.sh: unknown argument $1 ($usage)" >&2; exit 2 ;;
    esac
    shift
done

for t in dpkg-deb dpkg-shlibdeps dpkg-architecture strip gzip md5sum; do
    command -v "$t" >/dev/null 2>&1 || {
        echo "scripts/deb.sh needs $t: apt-get install dpkg-dev binutils gzip" >&2
        exit 1
    }
done

# The CNI plugin's crate, when the workspace has it.
cni_manifest=crates/cni/Cargo.toml
if $build; then
    cargo build --release --locked -p sluice
    if [ -f "$cni_manifest" ]; then
        cargo build --release --locked --manifest-path "$cni_manifest"
    fi
fi
bin="${CARGO_TARGET_DIR:-target}/release/sluice"
cni="${CARGO_TARGET_DIR:-target}/release/sluice-cni"
if [ ! -x "$bin" ]; then
    echo "scripts/deb.sh: no $bin: build it (cargo build --release --locked -p sluice), or leave out --no-build" >&2
    exit 1
fi
have_cni=false
if [ -f "$cni_manifest" ]; then
    if [ -x "$cni" ]; then
        have_cni=true
    else
        echo "scripts/deb.sh: note: no $cni (build it, or leave out --no-build): the package has no CNI plugin" >&2
    fi
fi

version="$("$bin" --version | awk '{ print $2 }')"
if ! [[ "$version" =~ ^[0-9][A-Za-z0-9.+~]*$ ]]; then
    echo "scripts/deb.sh: \`$bin --version\` gave version \"$version\", which is not a Debian version" >&2
    exit 1
fi
arch="$(dpkg-architecture -qDEB_HOST_ARCH)"

if [ -n "${DEBFULLNAME:-}" ] && [ -n "${DEBEMAIL:-}" ]; then
    maintainer="$DEBFULLNAME <$DEBEMAIL>"
elif git config user.name >/dev/null && git config user.email >/dev/null; then
    maintainer="$(git config user.name) <$(git config user.email)>"
elif git log -1 --format=%ae >/dev/null 2>&1; then
    maintainer="$(git log -1 --format='%an <%ae>')"
else
    echo "scripts/deb.sh: who maintains the package? set DEBFULLNAME and DEBEMAIL (or git's user.name and user.email)" >&2
    exit 1
fi
commit="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
    SOURCE_DATE_EPOCH="$(git log -1 --format=%ct 2>/dev/null || date +%s)"
fi
export SOURCE_DATE_EPOCH

umask 022
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
root="$work/root"
doc="$root/usr/share/doc/sluice"
install -d "$root/DEBIAN" "$root/usr/bin" "$root/usr/share/man/man1" "$doc/examples" \
    "$root/usr/share/bash-completion/completions" "$root/usr/share/zsh/vendor-completions" \
    "$root/usr/share/fish/vendor_completions.d"

# Binaries, stripped as dh_strip does (the release profile keeps line tables).
strip_into() {
    install -m 0755 "$1" "$2"
    strip --strip-unneeded --remove-section=.comment --remove-section=.note "$2"
}
strip_into "$bin" "$root/usr/bin/sluice"
if $have_cni; then
    install -d "$root/usr/lib/cni"
    strip_into "$cni" "$root/usr/lib/cni/sluice-cni"
fi

# systemd units: whatever dist/systemd holds.
units=()
if [ -d dist/systemd ]; then
    mapfile -t units < <(find dist/systemd -maxdepth 1 -type f \( -name '*.service' -o -name '*.socket' \
        -o -name '*.target' -o -name '*.timer' -o -name '*.path' \) | sort)
fi
if [ ${#units[@]} -gt 0 ]; then
    install -d "$root/usr/lib/systemd/system"
    install -m 0644 "${units[@]}" "$root/usr/lib/systemd/system/"
fi

# Manual pages and completions, from the binary's own command line.
"$bin" man --out "$work/man" >/dev/null
install -m 0644 "$work"/man/*.1 "$root/usr/share/man/man1/"
gzip -9n "$root"/usr/share/man/man1/*.1
"$bin" completion bash >"$root/usr/share/bash-completion/completions/sluice"
"$bin" completion zsh >"$root/usr/share/zsh/vendor-completions/_sluice"
"$bin" completion fish >"$root/usr/share/fish/vendor_completions.d/sluice.fish"
chmod 0644 "$root/usr/share/bash-completion/completions/sluice" "$root/usr/share/zsh/vendor-completions/_sluice" \
    "$root/usr/share/fish/vendor_completions.d/sluice.fish"

# Documentation.
install -m 0644 README.md docs/*.md "$doc/"
compgen -G 'docs/*.json' >/dev/null && install -m 0644 docs/*.json "$doc/"
install -m 0644 docs/examples/*.toml "$doc/examples/"

# copyright: the licence of sluice (MIT's text, Apache-2.0 by reference to Debian's copy,
# as Debian does) and of every crate the binaries hold, as cargo tree reports them.
crates="$(
    {
        cargo tree --locked --offline -p sluice -e normal --prefix none -f '{p} {l}'
        if $have_cni; then
            cargo tree --locked --offline --manifest-path "$cni_manifest" -e normal --prefix none -f '{p} {l}'
        fi
    } | sed -e 's/ (\*)$//' -e 's/ (proc-macro)//' -e 's| (/[^)]*)||' | grep -v '^sluice' | sort -u
)"
{
    cat <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: sluice
Comment: The binaries are built from this source with Rust crates statically linked;
 each is used under its licence, as its Cargo.toml states:
EOF
    echo "$crates" | sed 's/^/  /'
    cat <<EOF

Files: *
Copyright: the sluice authors
License: MIT or Apache-2.0

License: MIT
EOF
    sed -e 's/^$/./' -e 's/^/ /' LICENSE-MIT
    cat <<EOF

License: Apache-2.0
 On Debian systems the full text of the Apache License, Version 2.0, is in
 /usr/share/common-licenses/Apache-2.0.
EOF
} >"$doc/copyright"
chmod 0644 "$doc/copyright"

# changelog.gz: this is a native package, its history is the repository's.
{
    echo "sluice ($version) unstable; urgency=medium"
    echo
    echo "  * Built from the sluice repository at commit $commit."
    echo
    echo " -- $maintainer  $(date -u -R -d "@$SOURCE_DATE_EPOCH")"
} | gzip -9n >"$doc/changelog.gz"
chmod 0644 "$doc/changelog.gz"

# Maintainer scripts, as dh_installsystemd's snippets: with units, systemd reads them anew
# at install, upgrade and removal; a purge removes the switches' state.
if [ ${#units[@]} -gt 0 ]; then
    cat >"$root/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
fi
EOF
    chmod 0755 "$root/DEBIAN/postinst"
fi
{
    echo '#!/bin/sh'
    echo 'set -e'
    if [ ${#units[@]} -gt 0 ]; then
        echo 'if [ -d /run/systemd/system ]; then'
        echo '    systemctl --system daemon-reload >/dev/null || true'
        echo 'fi'
    fi
    echo 'if [ "$1" = purge ]; then'
    echo '    rm -rf /var/lib/sluice'
    echo 'fi'
} >"$root/DEBIAN/postrm"
chmod 0755 "$root/DEBIAN/postrm"

# Depends: the binaries' shared libraries, mapped to packages by the system's shlibs and
# symbols files (dpkg-shlibdeps reads debian/control, so it runs in a directory of its own).
shl="$work/shlibdeps"
install -d "$shl/debian"
printf 'Source: sluice\n\nPackage: sluice\nArchitecture: any\n' >"$shl/debian/control"
elves=("$root/usr/bin/sluice")
$have_cni && elves+=("$root/usr/lib/cni/sluice-cni")
shlibs="$(cd "$shl" && dpkg-shlibdeps -O "${elves[@]}" 2>"$work/shlibdeps.err")" || {
    cat "$work/shlibdeps.err" >&2
    echo "scripts/deb.sh: dpkg-shlibdeps could not map the binaries' libraries to packages" >&2
    exit 1
}
depends="${shlibs#shlibs:Depends=}"
[ -n "$depends" ] && [ "$depends" != "$shlibs" ] || {
    echo "scripts/deb.sh: dpkg-shlibdeps said \"$shlibs\", not shlibs:Depends=…" >&2
    exit 1
}
recommends="iputils-ping"
$have_cni && recommends+=", containernetworking-plugins, nftables"

# Installed-Size as dpkg-gencontrol counts it: KiB per file, rounded up, 1 per other entry.
installed_size="$(cd "$root" && find . -path ./DEBIAN -prune -o ! -path . -printf '%y %s\n' |
    awk '$1 == "f" { n += int(($2 + 1023) / 1024); next } { n += 1 } END { print n }')"

cat >"$root/DEBIAN/control" <<EOF
Package: sluice
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $installed_size
Depends: $depends, iproute2
Recommends: $recommends
Suggests: tcpdump | tshark, qemu-system-x86, busybox-static, linux-image-$arch, iperf3
Section: net
Priority: optional
Description: virtual switch for Linux hosts and their guests
 sluice connects network namespaces, containers and VMs to each other and to
 the LAN: veth pairs forwarded by TC programs in the kernel, TAP ports
 forwarded by a user-space thread, or QEMU VMs attached by vhost-user, with
 MAC learning or Layer 3 switching, VLANs, jumbo and GSO frames, a lossless
 mode, VXLAN tunnels and counters that account for every frame.
 .
 One daemon runs per switch (sluice switch run, or the service sluice@NAME
 with /etc/sluice/NAME.toml); the other commands talk to it over its control
 socket.
EOF
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/md5sums"

# Every file's time is SOURCE_DATE_EPOCH at most, as dh_builddeb leaves them.
find "$root" -newermt "@$SOURCE_DATE_EPOCH" -print0 | xargs -0r touch --no-dereference --date="@$SOURCE_DATE_EPOCH"
mkdir -p "$out"
deb="$out/sluice_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
