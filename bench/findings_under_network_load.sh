#!/bin/sh
# False findings from interrupts: GPT-2's generation (examples/generate_kv.py, random weights)
# recorded while a loop downloads wheels from PyPI, so that the network card's interrupts,
# and the softirqs on their way out, keep landing on the recorded process's CPUs. Each round
# prints `report leaks`' number of findings (the control answer is 0: the generation holds
# nothing past its exit) and how many kernel allocations memprof counted in an interrupt and
# did not charge to the process (meta.json, interrupt_allocations).
# Needs the package registry (pip download). MEMPROF_TREE: another checkout to run, as
# PYTHONPATH (a copy with bpf/ and cli/ linked into its package, as bpf_before_after.sh
# makes), to compare with the one this script runs from.
#   usage (as root, from the repository root): [MEMPROF_TREE=DIR] sh bench/findings_under_network_load.sh [ROUNDS]
set -eu
rounds=${1:-2}
repo=$PWD
tree=${MEMPROF_TREE:-$repo}
py=$repo/.venv/bin/python
work=$(mktemp -d /tmp/memprof-netload.XXXXXX)
(
    while true; do
        rm -rf "$work/dl"
        "$repo/.venv/bin/pip" download -q --no-deps --no-cache-dir -d "$work/dl" scipy pyarrow torchvision > /dev/null 2>&1 || sleep 1
    done
) &
loader=$!
trap 'kill $loader 2> /dev/null; pkill -f "pip download -q --no-deps --no-cache-dir -d $work" || true; rm -rf "$work"' EXIT
sleep 3
for round in $(seq "$rounds"); do
    out=$work/g$round.memprof
    (cd "$tree" && PYTHONPATH=$tree "$py" -m memprof record -q --force -o "$out" -- \
        "$py" "$repo/examples/generate_kv.py" --tokens 60 > /dev/null 2> "$work/err")
    findings=$("$py" -m memprof report leaks "$out" --format json 2> /dev/null |
        "$py" -c "import json, sys; print(len(json.load(sys.stdin)['findings']))")
    counted=$("$py" -c "import json; print(json.load(open('$out/meta.json'))['sources']['ebpf']['detail'].get('interrupt_allocations'))")
    echo "round $round: $findings findings; interrupt allocations counted, not charged: $counted; $(tail -1 "$work/err")"
done
