#!/usr/bin/env bash
# Build an aarch64 (arm64) Debian sysroot for cross-building fastattn and running its
# tests under qemu-user, without touching the host (no dpkg --add-architecture, no
# docker, no binfmt).  The recipe of docs/install.rst ("aarch64 under emulation"):
#
#   root/   Debian bookworm arm64 packages extracted with dpkg -x: python3.11 and its
#           headers, libgomp1, python3-pytest, python3-hypothesis (whatever apt's
#           resolver pulls in), the stdlib byte-compiled (imports are ~3x slower
#           under qemu without .pyc files)
#   site/   numpy 2 and ml_dtypes from their manylinux aarch64 wheels (Debian's numpy
#           is 1.24; fastattn needs numpy 2)
#   READY   written last: a second run with READY present does nothing
#
# Usage: tools/aarch64_sysroot.sh [DIR]        (default: ./.a64, gitignored)
# Host packages (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user-static) are
# apt-get installed only when their commands are missing (sudo only if not root).
# Needs network access to the Debian mirror of /etc/apt and to PyPI; ~250 MB.
set -euo pipefail

A="$(mkdir -p "${1:-.a64}" && cd "${1:-.a64}" && pwd)"
T0=$SECONDS
if [[ -f "$A/READY" ]]; then
    echo "aarch64 sysroot: $A (ready)"
    exit 0
fi
step() { printf '==> [%4ss] %s\n' "$((SECONDS - T0))" "$*"; }

# ---------------------------------------------------------------- host packages
need=()
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
command -v qemu-aarch64-static >/dev/null || command -v qemu-aarch64 >/dev/null || need+=(qemu-user-static)
command -v dpkg >/dev/null && command -v apt-get >/dev/null \
    || { echo "aarch64_sysroot.sh: needs a Debian/Ubuntu host (apt-get, dpkg)" >&2; exit 1; }
if (( ${#need[@]} )); then
    SUDO=(); [[ $(id -u) == 0 ]] || SUDO=(sudo)
    step "host packages: ${need[*]}"
    "${SUDO[@]}" apt-get update -qq
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

# ---------------------------------------------------------------- arm64 .debs
# a private apt state (lists, cache, an empty dpkg status) so that apt resolves the
# complete arm64 dependency closure without the host's dpkg database
step "private arm64 apt configuration in $A"
mkdir -p "$A/state/lists/partial" "$A/cache/archives/partial" "$A/debs" "$A/root" "$A/site" "$A/whl"
touch "$A/state/status"
printf 'Dir::State "%s/state"; Dir::State::status "%s/state/status"; Dir::Cache "%s/cache";\nAPT::Architecture "arm64"; APT::Architectures { "arm64"; };\n' \
    "$A" "$A" "$A" > "$A/apt.conf"
export APT_CONFIG="$A/apt.conf"
step "apt-get update (arm64 lists)"
apt-get update -qq
step "resolving python3.11, libpython3.11-dev, libgomp1, python3-pytest, python3-hypothesis"
# dpkg/tar/debconf/tzdata: Essential or maintainer-script-only, useless in a sysroot
mapfile -t PKGS < <(apt-get install -s --no-install-recommends \
        python3.11 libpython3.11-dev libgomp1 libstdc++6 python3-pytest python3-hypothesis \
    | awk '/^Inst/{print $2":arm64"}' | grep -vE '^(dpkg|tar|debconf|tzdata):')
echo "  ${#PKGS[@]} packages"
step "apt-get download"
(cd "$A/debs" && apt-get download -qq "${PKGS[@]}")
step "extracting $(ls "$A"/debs/*.deb | wc -l) .debs into root/"
for f in "$A"/debs/*.deb; do dpkg -x "$f" "$A/root"; done
unset APT_CONFIG

# ---------------------------------------------------------------- numpy 2, ml_dtypes
step "numpy 2 + ml_dtypes aarch64 wheels"
python3 -m pip download -q --only-binary=:all: --platform manylinux_2_28_aarch64 \
    --python-version 3.11 --implementation cp --no-deps -d "$A/whl" 'numpy>=2' ml_dtypes
for w in "$A"/whl/*.whl; do python3 -m zipfile -e "$w" "$A/site"; done

# .pyc files: imports are ~3x slower under qemu without them.  A host Python 3.11 writes
# the same files as the emulated one (same magic number), natively fast.
step "byte-compiling the stdlib, dist-packages and site/"
QEMU="$(command -v qemu-aarch64-static || command -v qemu-aarch64)"
COMPILE=(python3 -m compileall -j 0)
python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
    || COMPILE=("$QEMU" -L "$A/root" "$A/root/usr/bin/python3.11" -m compileall)   # no -j: no binfmt
"${COMPILE[@]}" -q "$A/root/usr/lib/python3.11" "$A/root/usr/lib/python3/dist-packages" \
    "$A/site" >/dev/null || true

# ---------------------------------------------------------------- smoke test
step "smoke test under qemu"
PYTHONPATH="$A/site" "$QEMU" -L "$A/root" -cpu cortex-a72 "$A/root/usr/bin/python3.11" -c '
import platform, numpy, ml_dtypes, pytest, hypothesis
assert platform.machine() == "aarch64", platform.machine()
assert int(numpy.__version__.split(".")[0]) >= 2, numpy.__version__
print("  python", platform.python_version(), platform.machine(), "numpy", numpy.__version__,
      "ml_dtypes", ml_dtypes.__version__, "pytest", pytest.__version__, "hypothesis", hypothesis.__version__)'
date -u +%FT%TZ > "$A/READY"
step "aarch64 sysroot ready: $A ($(du -sh "$A" | cut -f1))"
