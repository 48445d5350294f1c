#!/bin/sh
# Kernel churn overhead of the bpf/ programs at REV against the working tree's, in one run:
# ROUNDS rounds, each bench/churn_overhead.py with REV's bpf/ and then with the tree's
# (alternating, as this host is noisy). With WHAT=bpf (the default) only bpf/ differs between
# the two sides and the Python side is the working tree's for both, so REV's programs must
# fit it; with WHAT=tree the "before" side is REV's whole tree (for a change to both).
# BENCH names another bench that takes --repeats (default: bench/churn_overhead.py
# --no-memleak), e.g. BENCH=bench/startup_latency.py, or one with its command after " -- ", e.g.
# BENCH="bench/record_phases.py -- $PWD/.venv/bin/python examples/generate_kv.py" (run in each
# side's copy, which has examples/).
#   usage (as root, from the repository root): [BENCH=…] [BENCH_FROM_TREE=1] sh bench/bpf_before_after.sh REV [ROUNDS] [REPEATS] [bpf|tree]
set -eu
rev=$1 rounds=${2:-2} repeats=${3:-3} what=${4:-bpf} bench=${BENCH:-bench/churn_overhead.py --no-memleak}
work=$(mktemp -d /tmp/memprof-before-after.XXXXXX)
trap 'rm -rf "$work"' EXIT
for side in before after; do
    mkdir "$work/$side"
    git ls-files -z --cached --others --exclude-standard | xargs -0 tar cf - | tar xf - -C "$work/$side"
    cp -r examples/bin "$work/$side/examples/"
    # The editable install maps memprof.bpf and memprof.cli to this checkout's bpf/ and cli/
    # (its finder comes after the path one): links inside each copy's package win, so each
    # side compiles its own bpf/. Without them both sides ran the working tree's programs.
    ln -s ../bpf "$work/$side/memprof/bpf"
    ln -s ../cli "$work/$side/memprof/cli"
done
case $what in
    bpf) git archive "$rev" bpf | tar xf - -C "$work/before" ;;
    tree) git archive "$rev" | tar xf - -C "$work/before" ;;
    *) echo "WHAT must be bpf or tree, not $what" >&2; exit 2 ;;
esac
# BENCH_FROM_TREE=1: both sides run the working tree's bench/ (one instrument for both, when
# the bench itself changed since REV and still runs against REV's memprof).
if [ "${BENCH_FROM_TREE:-0}" = 1 ]; then
    rm -rf "$work/before/bench" && cp -r "$work/after/bench" "$work/before/bench"
fi
# Both sides' modules compiled to bytecode first, as an installed memprof's are: this
# environment sets PYTHONDONTWRITEBYTECODE, so each run of a fresh copy compiled every module
# it imported from source (~40 ms for the start-up imports alone, measured 2026-12-03).
for side in before after; do
    "$PWD/.venv/bin/python" -m compileall -q "$work/$side/memprof" "$work/$side/cli" "$work/$side/bench" > /dev/null
done
# A BENCH with its own command after " -- " (bench/record_phases.py's) gets --repeats before it.
case $bench in
    *" -- "*) bench_options=${bench%% -- *} bench_command="-- ${bench#* -- }" ;;
    *) bench_options=$bench bench_command="" ;;
esac
round=1
while [ "$round" -le "$rounds" ]; do
    for side in before after; do
        echo "== round $round, $what of $([ $side = before ] && echo "$rev" || echo 'the working tree')"
        (cd "$work/$side" && PYTHONPATH="$work/$side" "$OLDPWD/.venv/bin/python" -c \
            "from importlib import resources; print('bpf/ compiled from', resources.files('memprof.bpf'))" &&
         PYTHONPATH="$work/$side" "$OLDPWD/.venv/bin/python" $bench_options --repeats "$repeats" $bench_command)
    done
    round=$((round + 1))
done
