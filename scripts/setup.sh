#!/usr/bin/env bash
# Idempotent set-up for memprof on Debian 12 (run as root): system packages for eBPF,
# kernel headers for bcc, tracefs, and the project's venv at .venv.
# Every step checks before it acts, so a second run costs seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'setup: %s\n' "$*"; }
warn() { printf 'setup: WARNING: %s\n' "$*" >&2; }

need_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "setup: must run as root (it installs Debian packages and mounts tracefs); try: sudo make ${1:-demo}" >&2
    exit 3
  fi
}

apt_updated=0
apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ $apt_updated = 0 ]; then apt-get update -qq; apt_updated=1; fi
  say "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# bcc looks for /lib/modules/$(uname -r)/build; Debian may not ship headers for this kernel.
# Tracepoint programs only need generic kernel types, so the nearest headers package works.
kernel_headers() {
  local kr build
  kr=$(uname -r)
  build=/lib/modules/$kr/build
  if [ -e "$build/include" ] && [ -e "/lib/modules/$kr/source/include/linux/kconfig.h" ]; then return 0; fi
  if apt-cache show "linux-headers-$kr" >/dev/null 2>&1; then
    apt_install "linux-headers-$kr"
    [ -e "$build/include" ] && return 0
  fi
  if [ $apt_updated = 0 ]; then apt-get update -qq; apt_updated=1; fi
  local want nearest
  want=$(echo "$kr" | grep -oE '^[0-9]+\.[0-9]+')
  # Nearest by version: the highest flavour-amd64 headers not above the running kernel's
  # major.minor, else the lowest above it.
  nearest=$(apt-cache search --names-only '^linux-headers-[0-9].*-amd64$' | awk '{print $1}' \
    | grep -vE -- '-(rt|cloud)-amd64$' | sort -V \
    | awk -F'[-.]' '{print $3"."$4" "$0}' \
    | python3 -c '
import sys
want = tuple(int(x) for x in sys.argv[1].split("."))
rows = [(tuple(int(x) for x in l.split()[0].split(".")), l.split()[1]) for l in sys.stdin if l.strip()]
below = [r for r in rows if r[0] <= want]
print((below[-1] if below else rows[0])[1] if rows else "")' "$want")
  if [ -z "$nearest" ]; then
    warn "no linux-headers package found; bcc cannot compile BPF programs"; return 0
  fi
  apt_install "$nearest"
  # Debian splits headers: the flavour package (generated headers, config) is "build",
  # the -common package (the source tree's include/) is "source"; bcc reads both.
  local flavour=/usr/src/$nearest common
  common=$(ls -d "/usr/src/${nearest%-amd64}-common" 2>/dev/null || echo "$flavour")
  mkdir -p "/lib/modules/$kr"
  ln -sfn "$flavour" "$build"
  ln -sfn "$common" "/lib/modules/$kr/source"
  warn "no headers for kernel $kr; using $nearest at $build (fine for tracepoint programs)"
}

mount_tracefs() {
  if [ ! -d /sys/kernel/tracing/events ]; then
    mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || warn "could not mount tracefs"
  fi
  if [ ! -d /sys/kernel/debug/tracing ] && ! mountpoint -q /sys/kernel/debug; then
    mount -t debugfs nodev /sys/kernel/debug 2>/dev/null || true
  fi
}

make_venv() {
  if [ ! -x .venv/bin/python ]; then
    say "creating .venv from /usr/bin/python3 (--system-site-packages, so bcc imports)"
    /usr/bin/python3 -m venv --system-site-packages .venv
  fi
  local stamp=.venv/.memprof-installed
  if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ] ||
     [ constraints.txt -nt "$stamp" ]; then
    say "installing memprof and its dev extras into .venv (the versions in constraints.txt)"
    .venv/bin/pip install -q --upgrade pip >/dev/null
    .venv/bin/pip install -q -c constraints.txt -e '.[dev]'
    touch "$stamp"
  fi
  isolate_launcher
}

# .venv/bin/memprof, which pip writes, starts Python with the per-user site folder on: under
# sudo, where HOME stays the user's (env_keep), a .pth file in ~/.local/lib/python3.X/
# site-packages would run as root. `-I` on its #! line (one argument, as Linux allows)
# keeps out that folder, PYTHONPATH and the current folder, as `make install`'s wrapper does.
isolate_launcher() {
  local launcher=.venv/bin/memprof
  [ -f "$launcher" ] || return 0
  if head -n 1 "$launcher" | grep -q '^#!.*/python[0-9.]*$'; then
    sed -i '1s/$/ -I/' "$launcher"
  fi
}

build_examples() {
  make -s -C examples
}

# memprof's LD_PRELOAD interposer for `record --sources +native` (memprof/preload).
build_preload() {
  make -s -C memprof/preload
}

# bcc compiles memprof's probes on a record's first start, then memprof keeps the compiled
# program in root's /var/cache/memprof/bpf (sources/ebpf/compiled_cache.py). Recording
# `true` once here does that first compile, so a user's first `record` with the default
# options starts without one. Nothing is kept of the recording itself.
warm_compiled_program() {
  local tmp
  tmp=$(mktemp -d /tmp/memprof-setup.XXXXXX)
  if .venv/bin/python -m memprof record -q -o "$tmp/warm.memprof" -- true >/dev/null 2>"$tmp/err"; then
    say "compiled the probes once (kept in /var/cache/memprof/bpf: records start without a compile)"
  else
    say "could not compile the probes ahead (records will, once): $(tail -n 1 "$tmp/err")"
  fi
  rm -rf "$tmp"
}

need_root "${1:-}"
apt_install bpfcc-tools python3-bpfcc python3-venv gcc make libc6-dev
# The HTML report's browser test: headless Chromium and its WebDriver (selenium drives it).
apt_install chromium chromium-driver
kernel_headers
mount_tracefs
make_venv
build_examples
build_preload
warm_compiled_program
say "ready"
