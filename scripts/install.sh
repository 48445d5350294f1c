#!/usr/bin/env bash
# `make install`: put a `memprof` on root's PATH (default /usr/local/bin, which sudo's
# secure_path includes) that runs this checkout's memprof in its venv (.venv).
#
# memprof runs as root through sudo (docs/SECURITY.md), so the wrapper must not let anyone
# else put code into root's process:
# - Python runs isolated (-I): PYTHONPATH, PYTHONHOME, PYTHONSTARTUP, the user's
#   site-packages and the current folder are ignored, whatever the caller's environment;
# - every path is absolute (this checkout, resolved), none is looked up on PATH;
# - the wrapper is root's, mode 0755, replaced atomically;
# - it is installed only when nothing it runs can be changed by anyone but root: every folder
#   from / to the checkout, and the checkout's memprof/, cli/, bpf/ and .venv/, are root's
#   and writable by no one else (a sticky folder such as /tmp excepted: others cannot
#   replace what root made there).
#
# Usage: scripts/install.sh [BINDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd -P)
bindir=${1:-/usr/local/bin}

fail() { printf 'install: %s\n' "$*" >&2; exit "${2:-1}"; }

[ "$(id -u)" = 0 ] || fail "must run as root (it writes $bindir/memprof for root); try: sudo make install" 3
[ -x .venv/bin/python ] || fail "no .venv here: run \`make setup\` (or \`make demo\`) first"
case "$repo" in *"'"*|*$'\n'*) fail "this checkout's path ($repo) holds a quote or a newline: move it";; esac

# Folders from / down to the checkout: root's, and writable by no one else unless sticky.
dir=$repo
while :; do
  read -r owner mode < <(stat -c '%u %a' "$dir")
  if [ "$owner" != 0 ] || { (( 8#$mode & 8#022 )) && ! (( 8#$mode & 8#1000 )); }; then
    fail "$dir is owned by uid $owner with mode $mode: whoever can write it could change what root runs; make it root's and not writable by others"
  fi
  [ "$dir" = / ] && break
  dir=$(dirname "$dir")
done

# What the wrapper runs: root's files, writable by no one else (symlinks are checked where they lead, by stat above or as system files).
bad=$(find memprof cli bpf .venv -xdev ! -type l \( ! -uid 0 -o -perm /022 \) -print -quit)
[ -z "$bad" ] || fail "$repo/$bad is not root's alone (owner or group/other write): root would run code others can change; fix its owner and mode (chown -R root: and chmod -R go-w)"

mkdir -p "$bindir"
tmp=$(mktemp "$bindir/.memprof.XXXXXX")
trap 'rm -f "$tmp"' EXIT
cat > "$tmp" <<WRAPPER
#!/bin/sh
# memprof, installed by \`make install\` from $repo: runs that checkout's memprof in its venv.
# -I (isolated): Python ignores PYTHONPATH, PYTHONHOME, the user's site-packages and the
# current folder, so nobody's environment or files put code into root's process under sudo.
exec '$repo/.venv/bin/python' -I -m memprof "\$@"
WRAPPER
chown 0:0 "$tmp"
chmod 0755 "$tmp"
mv -f "$tmp" "$bindir/memprof"
trap - EXIT
printf 'install: %s/memprof runs %s/.venv (try: memprof doctor, or sudo memprof record -- CMD)\n' "$bindir" "$repo"
