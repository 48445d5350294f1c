#!/bin/sh
# Kernel churn overhead of the bpf/ programs at REV against the working tree's, in one run:
# ROUNDS rounds, each bench/churn_overhead.py with REV's bpf/ and then with the tree's
# (alternating, as this host is noisy). Only bpf/ differs between the two sides; the Python
# side is the working tree's for both, so REV's programs must fit it.
#   usage (as root, from the repository root): sh bench/bpf_before_after.sh REV [ROUNDS] [REPEATS]
set -eu
rev=$1 rounds=${2:-2} repeats=${3:-3}
work=$(mktemp -d /tmp/memprof-before-after.XXXXXX)
trap 'rm -rf "$work"' EXIT
for side in before after; do
    mkdir "$work/$side"
    git ls-files -z --cached --others --exclude-standard | xargs -0 tar cf - | tar xf - -C "$work/$side"
    cp -r examples/bin "$work/$side/examples/"
done
git archive "$rev" bpf | tar xf - -C "$work/before"
round=1
while [ "$round" -le "$rounds" ]; do
    for side in before after; do
        echo "== round $round, bpf/ of $([ $side = before ] && echo "$rev" || echo 'the working tree')"
        (cd "$work/$side" && PYTHONPATH="$work/$side" "$OLDPWD/.venv/bin/python" bench/churn_overhead.py --repeats "$repeats" --no-memleak)
    done
    round=$((round + 1))
done
