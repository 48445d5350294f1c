#!/bin/sh
# The whole `record -- python -c "import torch"` as a sudo user feels it (SUDO_UID, SUDO_GID,
# SUDO_USER naming a real unprivileged user USER, whose folder OUT takes the recording):
# the memprof package at BEFORE (a checkout or `git worktree` of an older commit) against
# this checkout's, alternating, RUNS times each; prints each side's wall times in ms.
# memprof runs in OUT, the user's folder, as root: -P keeps that folder off its sys.path (plain
# `python -m` would import a module the user left there).
#   usage (as root, from the repository root): sh bench/sudo_startup_ab.sh BEFORE USER OUT [RUNS]
set -eu
before=$1 user=$2 out=$3 runs=${4:-6}
U=$(id -u "$user"); G=$(id -g "$user"); here=$PWD
.venv/bin/python -m compileall -q "$before/memprof" memprof > /dev/null
i=0
while [ "$i" -lt "$runs" ]; do
  i=$((i + 1))
  for side in "$before" "$here"; do
    s=$(date +%s%N)
    (cd "$out" && SUDO_UID=$U SUDO_GID=$G SUDO_USER=$user PYTHONPATH=$side "$here/.venv/bin/python" -P -m memprof record -q \
        -o "$out/ab.memprof" --force -- "$here/.venv/bin/python" -c "import torch" > /dev/null 2>&1) || echo "$side FAILED"
    e=$(date +%s%N)
    echo "$side $(( (e - s) / 1000000 ))"
  done
done | sort | awk '{t[$1] = t[$1] " " $2} END {for (side in t) print side ":" t[side]}'
