#!/usr/bin/env bash
# Fill .debs/ (gitignored) with the three dependencies that scripts/build-cuda.sh unpacks on a machine without network
# that lacks them (the Ubuntu 24.04 GPU machine: carry ".debs" there). Run where apt reaches a Debian 12 mirror.
#   libpcre2-dev_*.deb            Debian 12's PCRE2 10.42, the upstream version of Ubuntu 24.04; build-cuda.sh links
#                                 its static libpcre2-8.a, so nothing from the prefix is needed at run time.
#   libxxhash-dev_*.deb           xxhash.h, used header-only (nothing linked).
#   dsv4-httplib-header_*_all.deb cpp-httplib header-only (usr/include/httplib.h + cpp-httplib.pc), repacked here from
#                                 Debian's source package with Debian's patches applied. Debian's binary
#                                 libcpp-httplib-dev is a split build: its httplib.h holds declarations only, the code
#                                 is in libcpp-httplib.so, and both need OpenSSL, zlib and Brotli headers and libraries.
# Usage: scripts/fetch-debs.sh   (needs apt-get, dpkg-source and dpkg-deb: packages apt and dpkg-dev)
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "fetch-debs: error: $*" >&2; exit 1; }
trap 'echo "fetch-debs: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
command -v dpkg-source >/dev/null || die "dpkg-source is missing (apt-get install dpkg-dev)"
mkdir -p .debs
D=$PWD/.debs T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

Q=(-q); [ "$(id -u)" != 0 ] || Q+=(-o APT::Sandbox::User=root)   # root: no "unsandboxed download" warnings

# PCRE2: the binary package as it is.
rm -f "$D"/libpcre2-dev_*.deb "$D"/libxxhash-dev_*.deb
(cd "$D" && apt-get "${Q[@]}" download libpcre2-dev libxxhash-dev)

# cpp-httplib: source package through a private apt state with the system's deb lines turned into deb-src lines.
mkdir -p "$T/parts" "$T/lists/partial" "$T/src"
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] || continue; sed 's/^Types:.*/Types: deb-src/' "$f" > "$T/parts/$(basename "$f")"
done
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  [ -f "$f" ] || continue; sed -n 's/^deb /deb-src /p' "$f" > "$T/parts/$(basename "$f").list"
done
APT=("${Q[@]}" -o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$T/parts" -o Dir::State::Lists="$T/lists")
apt-get "${APT[@]}" update >/dev/null
(cd "$T/src" && apt-get "${APT[@]}" source cpp-httplib >/dev/null)   # downloads and unpacks, patches applied
H=$(ls "$T"/src/cpp-httplib-*/httplib.h) || die "no httplib.h in the cpp-httplib source package"
V=$(basename "$(ls "$T"/src/cpp-httplib_*.dsc)" .dsc); V=${V#cpp-httplib_}
UV=$(sed -n 's/^#define CPPHTTPLIB_VERSION "\(.*\)"/\1/p' "$H")
P=$T/pkg
mkdir -p "$P/DEBIAN" "$P/usr/include" "$P/usr/share/pkgconfig" "$P/usr/share/doc/dsv4-httplib-header"
cp "$H" "$P/usr/include/httplib.h"
cp "$(dirname "$H")/LICENSE" "$P/usr/share/doc/dsv4-httplib-header/copyright"
cat > "$P/usr/share/pkgconfig/cpp-httplib.pc" <<EOF
prefix=/usr
includedir=\${prefix}/include

Name: cpp-httplib
Description: cpp-httplib, header-only, from Debian source package cpp-httplib $V (dsv4 scripts/fetch-debs.sh)
Version: $UV
Libs: -pthread
Cflags: -I\${includedir}
EOF
cat > "$P/DEBIAN/control" <<EOF
Package: dsv4-httplib-header
Version: $V
Architecture: all
Maintainer: dsv4 scripts/fetch-debs.sh <noreply@invalid>
Description: cpp-httplib $UV header-only, for dsv4's scripts/build-cuda.sh (unpacked with dpkg -x, not installed)
EOF
rm -f "$D"/dsv4-httplib-header_*.deb
dpkg-deb --root-owner-group -Zxz --build "$P" "$D/dsv4-httplib-header_${V}_all.deb" >/dev/null
echo "fetch-debs: .debs/ holds $(basename -a "$D"/*.deb | tr '\n' ' ')" >&2
