#!/usr/bin/env bash
# Installs sluice's Debian package with apt on a clean machine — a fresh minimal Debian
# chroot (debootstrap --variant=minbase) of this host's release — and checks what an
# operator gets: the package and its Depends install from the archive, `sluice --version`
# runs, `man sluice` and whatis(1) find the pages, the completions are where bash, zsh and
# fish look, and a purge leaves none of the package's files. Then lintian's verdict, when
# lintian is installed. Run by hand, as root (the suite checks the package's contents
# without a chroot; docs/install.md says why, and holds this script's last output):
#
#   scripts/check-deb.sh                 build the package (scripts/deb.sh) and check it
#   scripts/check-deb.sh PATH.deb        check that package
#   scripts/check-deb.sh --keep …        leave the chroot in place (its path is printed)
#
# The archive is the one this host's apt uses: the first URI of its sources for its own
# release. The chroot is a new directory (mkdtemp) under /var/tmp, removed at exit unless
# --keep; nothing is mounted into it.
set -euo pipefail
cd "$(dirname "$0")/.."

keep=false
deb=""
for a in "$@"; do
    case "$a" in
        --keep) keep=true ;;
        -h | --help) echo "usage: scripts/check-deb.sh [--keep] [PATH.deb]"; exit 0 ;;
        *.deb) deb="$a" ;;
        *) echo "scripts/check-deb.sh: unknown argument $a (usage: scripts/check-deb.sh [--keep] [PATH.deb])" >&2; exit 2 ;;
    esac
done
if [ "$(id -u)" != 0 ]; then
    echo "scripts/check-deb.sh makes a chroot and runs apt in it: run it as root" >&2
    exit 1
fi
command -v debootstrap >/dev/null || { echo "scripts/check-deb.sh needs debootstrap: apt-get install debootstrap" >&2; exit 1; }

step() { echo "== $*"; }
start=$SECONDS

if [ -z "$deb" ]; then
    step "scripts/deb.sh"
    deb="$(scripts/deb.sh | tail -1)"
fi
[ -f "$deb" ] || { echo "scripts/check-deb.sh: no package at $deb" >&2; exit 1; }
echo "$deb"

# This host's release and the archive its apt fetches it from.
. /etc/os-release
codename="${VERSION_CODENAME:?/etc/os-release names no VERSION_CODENAME}"
mirror="$(
    {
        # deb822 .sources files: the URIs of a stanza whose Suites hold the release.
        for f in /etc/apt/sources.list.d/*.sources; do
            [ -f "$f" ] || continue
            awk -v rel="$codename" '
                /^[ \t]*$/ { if (ok && uri) print uri; ok = 0; uri = ""; next }
                tolower($1) == "uris:" { uri = $2 }
                tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == rel) ok = 1 }
                END { if (ok && uri) print uri }' "$f"
        done
        # One-line sources: deb [options] URI SUITE COMPONENTS…
        { cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true; } |
            sed -e 's/#.*//' -e 's/\[[^]]*\]//' | awk -v rel="$codename" '$1 == "deb" && $3 == rel { print $2 }'
    } | awk 'NR == 1'
)"
[ -n "$mirror" ] || { echo "scripts/check-deb.sh: no apt source of this host names $codename: which archive should the chroot use?" >&2; exit 1; }

chroot_dir="$(mktemp -d /var/tmp/sluice-check-deb.XXXXXX)"
# The logs: in a directory of root's own (mode 0700), never at a name in a directory others
# may write (the chroot's /tmp is one).
logs="$(mktemp -d)"
cleanup() {
    local status=$?
    if $keep; then
        echo "the chroot stays in $chroot_dir (remove it with rm -rf)"
    elif ! findmnt -rno TARGET | grep -q "^$chroot_dir"; then
        rm -rf "$chroot_dir"
    else
        echo "warning: something is mounted under $chroot_dir: left in place" >&2
    fi
    rm -rf "$logs"
    exit $status
}
trap cleanup EXIT
# The root of a machine: other users (apt's _apt, man-db's man) must reach it.
chmod 0755 "$chroot_dir"

step "debootstrap --variant=minbase $codename (from $mirror)"
debootstrap --variant=minbase "$codename" "$chroot_dir" "$mirror" >"$logs/debootstrap.log" 2>&1 || {
    tail -20 "$logs/debootstrap.log" >&2
    exit 1
}
in_chroot() { chroot "$chroot_dir" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"; }

name="$(basename "$deb")"
# In the chroot, the package waits in a directory only root may write.
install -d -m 0755 "$chroot_dir/srv/sluice-check"
install -m 0644 "$deb" "$chroot_dir/srv/sluice-check/$name"
step "apt-get install ./$name (and man-db, which minbase leaves out)"
in_chroot apt-get update -qq
in_chroot apt-get install -y --no-install-recommends man-db "/srv/sluice-check/$name" >"$logs/apt.log" 2>&1 || {
    cat "$logs/apt.log" >&2
    exit 1
}
echo "  installed: $(awk '/^Setting up / { printf "%s ", $3 }' "$logs/apt.log")" | fold -s -w 92

failed=0
check() {
    local what="$1"
    shift
    if out="$("$@" 2>&1)"; then
        echo "ok: $what"
    else
        echo "FAILED: $what"
        echo "$out" | sed 's/^/  /'
        failed=1
    fi
}
step "checks"
check "sluice --version: $(in_chroot sluice --version 2>&1)" in_chroot sluice --version
check "man sluice renders, with EXIT STATUS and FILES" \
    sh -c "MANWIDTH=80 chroot '$chroot_dir' env -i PATH=/usr/bin:/bin man sluice 2>&1 | grep -q 'EXIT STATUS' &&
           MANWIDTH=80 chroot '$chroot_dir' env -i PATH=/usr/bin:/bin man sluice 2>&1 | grep -q '/etc/sluice/NAME.toml'"
check "man -w sluice-port-add: $(in_chroot man -w sluice-port-add 2>&1)" in_chroot man -w sluice-port-add
check "whatis sluice-port-add: $(in_chroot whatis sluice-port-add 2>&1 | cut -c1-60)…" in_chroot whatis sluice-port-add
check "bash completion loads: $(in_chroot bash -c '. /usr/share/bash-completion/completions/sluice && complete -p sluice' 2>&1)" \
    in_chroot bash -c '. /usr/share/bash-completion/completions/sluice && complete -p sluice'
check "zsh completion in /usr/share/zsh/vendor-completions/_sluice" test -s "$chroot_dir/usr/share/zsh/vendor-completions/_sluice"
check "fish completion in /usr/share/fish/vendor_completions.d/sluice.fish" \
    test -s "$chroot_dir/usr/share/fish/vendor_completions.d/sluice.fish"
check "the example configuration is there" test -s "$chroot_dir/usr/share/doc/sluice/examples/sw0.toml"
check "dpkg --verify sluice (every file as the package shipped it)" in_chroot dpkg --verify sluice
files="$(in_chroot dpkg -L sluice | while read -r f; do [ -f "$chroot_dir$f" ] && echo "$f"; done)"
step "apt-get purge sluice"
in_chroot apt-get purge -y sluice >/dev/null 2>&1
left="$(for f in $files; do [ -e "$chroot_dir$f" ] && echo "$f"; done || true)"
check "a purge leaves none of its $(echo "$files" | wc -l) files" test -z "$left"
[ -z "$left" ] || echo "$left" | sed 's/^/  left: /'

if command -v lintian >/dev/null; then
    step "lintian $name (every tag, informational and pedantic too)"
    lintian -I --pedantic "$deb" 2>&1 | grep -v 'running with root privileges' | sed 's/^/  /' || true
    echo "  (end of lintian's tags)"
else
    step "lintian is not installed (apt-get install lintian): the package was not linted"
fi
echo "== done in $((SECONDS - start)) s: $([ $failed = 0 ] && echo "every check passed" || echo "some check FAILED")"
exit $failed
