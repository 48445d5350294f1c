#!/usr/bin/env bash
# The GPU check (DESIGN.md §6): ONE prepared script for a machine with an NVIDIA GPU, run as
# root from the repository root (or a copy of it):
#
#     bash scripts/gpu_check.sh
#
# It prints the environment, tries to make eBPF possible, prepares a Python with memprof and
# a CUDA build of torch, then runs scripts/gpu_check.py: examples/cuda_leak.py directly and
# under `memprof record --sources kmem,torch,cuda`, with one line per check:
#
#     CHECK <name>: PASS|FAIL|SKIP <numbers>
#
# It always exits 0: a person reads the output. Everything (this log as gpu_check.log,
# summary.txt, the recording, the reports) goes under $OUT when set (the device tool collects
# $OUT), else under /tmp/memprof-gpu-check-<time>. It finishes within BUDGET_S (default 330 s,
# under the 6 minutes a device session allows): every step runs under `timeout`, and set-up
# steps are cut short to leave HELPER_MIN_S for the checks.
#
# GPU_CHECK_BAR_S=N (default 0: not run) adds, after the checks, about N more seconds for the
# CPU training loop's overhead bar (issue 3 §5) on this machine's CPUs:
# bench/train_overhead.py --runs baseline,control,empty-probes,memprof, one round per 20 s of
# N (at least 4; a round is four runs of train.py, ~18 s on a 2-vCPU VM), stopped at N + 60 s.
# Its output is bar.txt, its rounds bar.json. A host with many
# cores and cheap exceptions says what the traps cost where the bar was meant to be met.
#
# Assumptions about the machine (none is required; what is missing is printed and skipped):
# - root; Debian/Ubuntu-like with apt-get, or no package manager at all;
# - maybe no network: installs are tried with short timeouts and no retries, and their
#   failure is reported, not fatal. Offline, pip can use a wheelhouse carried along:
#   PIP_NO_INDEX=1 PIP_FIND_LINKS=/path/to/wheels bash scripts/gpu_check.sh;
# - the NVIDIA driver is installed (nvidia-smi, libcuda.so.1, libnvidia-ml.so.1);
# - a python3 >= 3.10. torch with CUDA may be in a system Python already (it is preferred
#   as the venv's base, with --system-site-packages); otherwise `pip install torch` is tried:
#   PyPI's default Linux x86_64 wheel is a CUDA build that bundles the CUDA runtime and needs
#   only the driver (a recent one for recent wheels);
# - bcc comes from Debian's python3-bpfcc: pure Python over libbcc.so, so a Python other than
#   the system's can import it when given that one package (done below if needed); bcc
#   compiles against kernel headers (/lib/modules/$(uname -r)/build), or
#   /sys/kernel/kheaders.tar.xz from the kheaders module.
set -u
cd "$(dirname "$0")/.." || exit 0
ROOT=$(pwd)

BUDGET_S=${GPU_CHECK_BUDGET_S:-330}
HELPER_MIN_S=150 # the checks: two runs of the workload (torch CUDA start-up, 4 s hold), reports
T0=$SECONDS
DEST=${OUT:-/tmp/memprof-gpu-check-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$DEST"

left() { echo $((BUDGET_S - (SECONDS - T0))); }
# Seconds for a set-up step: at most $1, leaving HELPER_MIN_S for the checks (0: no time).
setup_s() {
  local room=$(($(left) - HELPER_MIN_S))
  if [ "$room" -lt "$1" ]; then echo $((room > 0 ? room : 0)); else echo "$1"; fi
}
# step SECONDS CMD…: run CMD under timeout; SECONDS 0 skips it (status 124).
step() {
  local s=$1
  shift
  if [ "$s" -le 0 ]; then
    echo "skipped, no time left: $*"
    return 124
  fi
  timeout -k 5 "$s" "$@"
}
section() { printf '\n== %s (t=%ss) ==\n' "$*" $((SECONDS - T0)); }
have() { command -v "$1" >/dev/null 2>&1; }

# One line about a Python: version, torch (and CUDA), bcc, pynvml; the last word is a score
# for choosing the venv's base: 2 for torch with CUDA, +1 for bcc.
PROBE='
import importlib.util, sys
score, parts = 0, [sys.executable, sys.version.split()[0]]
try:
    import torch
    ok = torch.cuda.is_available()
    parts.append(f"torch={torch.__version__} cuda_build={torch.version.cuda} cuda_available={ok}"
                 + (f" devices={torch.cuda.device_count()}" if ok else ""))
    score += 2 if ok else 0
except Exception as e:
    parts.append(f"torch: {type(e).__name__}: {e}")
try:
    import bcc
    parts.append("bcc=ok"); score += 1
except Exception as e:
    parts.append(f"bcc: {type(e).__name__}: {e}")
parts.append("pynvml=" + ("ok" if importlib.util.find_spec("pynvml") else "missing"))
print(" ".join(parts), score)
'
declare -A PROBED # python → its probe line, so each Python's torch is imported once
probe() { timeout 45 "$1" -c "$PROBE" 2>/dev/null || echo "$1 failed to run (or timed out) 0"; }
probe_once() {
  [ -n "${PROBED[$1]:-}" ] || PROBED[$1]=$(probe "$1")
  echo "${PROBED[$1]}"
}

candidates() {
  local seen="" p
  for p in /usr/bin/python3 "$(command -v python3 2>/dev/null)"; do
    [ -n "$p" ] && [ -x "$p" ] || continue
    p=$(readlink -f "$p")
    case " $seen " in *" $p "*) continue ;; esac
    seen="$seen $p"
    echo "$p"
  done
}

environment() {
  section environment
  date -u
  echo "kernel: $(uname -r) $(uname -m)"
  grep -h PRETTY_NAME /etc/os-release 2>/dev/null
  echo "uid: $(id -u)  container: $([ -f /.dockerenv ] && echo docker || (systemd-detect-virt -c 2>/dev/null || echo unknown))"
  if have nvidia-smi; then
    timeout 20 nvidia-smi -L
    timeout 20 nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used,persistence_mode --format=csv
    timeout 20 nvidia-smi | head -4 | tail -2
  else
    echo "nvidia-smi: not found"
  fi
  ls -l /dev/nvidia* 2>/dev/null | head -5
  local p
  for p in $(candidates); do
    probe_once "$p" >/dev/null # in this shell, so that the answer is kept
    echo "python: ${PROBED[$p]}"
  done
  [ -x .venv/bin/python ] && echo "existing .venv: $(probe .venv/bin/python)"
  echo "tracefs: $([ -d /sys/kernel/tracing/events ] && echo mounted || echo 'not mounted')"
  echo "kernel headers: $([ -e "/lib/modules/$(uname -r)/build/include" ] && readlink -f "/lib/modules/$(uname -r)/build" || echo missing)"
  echo "kheaders: $([ -e /sys/kernel/kheaders.tar.xz ] && echo present || echo absent)"
  echo "BTF: $([ -e /sys/kernel/btf/vmlinux ] && echo present || echo absent)"
  echo "uprobes: $([ -e /sys/bus/event_source/devices/uprobe ] && echo present || echo absent)"
  echo "bcc tools: $(ls /usr/sbin/*-bpfcc 2>/dev/null | wc -l) (memleak-bpfcc: $(have memleak-bpfcc && echo yes || echo no))"
}

# GPU_CHECK_NO_INSTALL=1: install nothing (apt, pip): a dry run on a machine whose Python
# must not change.
NO_INSTALL=${GPU_CHECK_NO_INSTALL:-0}
APT_OPTS=(-o Acquire::Retries=0 -o Acquire::http::Timeout=10 -o Acquire::https::Timeout=10 -o Dpkg::Use-Pty=0)
apt_updated=0
apt_install() {
  [ "$NO_INSTALL" = 1 ] && { echo "GPU_CHECK_NO_INSTALL=1: not installing ${*:2}"; return 1; }
  have apt-get || { echo "no apt-get: cannot install ${*:2}"; return 1; }
  if [ $apt_updated = 0 ]; then
    step "$(setup_s 60)" apt-get update -qq "${APT_OPTS[@]}" || echo "apt-get update failed (no network?)"
    apt_updated=1
  fi
  step "$(setup_s "$1")" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${APT_OPTS[@]}" "${@:2}"
}

ebpf_setup() {
  section "eBPF set-up"
  local kr
  kr=$(uname -r)
  if /usr/bin/python3 -c 'import bcc' 2>/dev/null; then
    echo "bcc imports in /usr/bin/python3"
  else
    apt_install 150 bpfcc-tools python3-bpfcc && echo "installed bpfcc-tools python3-bpfcc" ||
      echo "could not install bcc"
  fi
  if [ ! -e "/lib/modules/$kr/build/include" ]; then
    apt_install 90 "linux-headers-$kr" && echo "installed linux-headers-$kr" ||
      echo "no linux-headers-$kr package"
  fi
  if [ ! -e "/lib/modules/$kr/build/include" ] && [ ! -e /sys/kernel/kheaders.tar.xz ]; then
    modprobe kheaders 2>/dev/null && echo "loaded kheaders (bcc falls back to /sys/kernel/kheaders.tar.xz)" ||
      echo "no kernel headers and no kheaders module: bcc cannot compile"
  fi
  if [ ! -d /sys/kernel/tracing/events ]; then
    mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null && echo "mounted tracefs" || echo "could not mount tracefs"
  fi
  if [ ! -d /sys/kernel/debug/tracing ] && ! mountpoint -q /sys/kernel/debug 2>/dev/null; then
    mount -t debugfs nodev /sys/kernel/debug 2>/dev/null || true
  fi
}

PY=""
EBPF_WHY=""
python_setup() {
  section "Python environment"
  local best="" best_score=-1 p line score
  if [ -x .venv/bin/python ]; then
    PY=$ROOT/.venv/bin/python
    echo "using the existing .venv"
  else
    for p in $(candidates); do
      probe_once "$p" >/dev/null
      line=${PROBED[$p]}
      score=${line##* }
      echo "candidate: $line"
      if [ "$score" -gt "$best_score" ]; then best=$p best_score=$score; fi
    done
    if [ -z "$best" ]; then
      EBPF_WHY="no python3 found"
      return
    fi
    echo "creating .venv from $best (--system-site-packages: it sees that Python's torch, bcc, pynvml)"
    step "$(setup_s 60)" "$best" -m venv --system-site-packages .venv || echo "python -m venv failed (python3-venv missing?)"
    if [ -x .venv/bin/python ]; then PY=$ROOT/.venv/bin/python; else PY=$best; fi
  fi
  local pip=("$PY" -m pip install -q --disable-pip-version-check --retries 0 --timeout 15)
  if [ "$NO_INSTALL" = 1 ]; then
    pip=(echo "GPU_CHECK_NO_INSTALL=1: not running pip install")
  fi
  local gpu=0
  timeout 20 nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && gpu=1
  if ! "$PY" -c 'import memprof.cli.main' 2>/dev/null; then
    step "$(setup_s 120)" "${pip[@]}" -e . ||
      step "$(setup_s 60)" "${pip[@]}" --no-build-isolation --no-deps -e . ||
      echo "pip could not install memprof"
  fi
  if ! "$PY" -c 'import memprof.cli.main' 2>/dev/null; then
    # Not installable (no network for build dependencies): import it from the source tree
    # through a package folder of links; its own dependencies must then be present.
    local shadow=/tmp/memprof-gpu-check-src
    rm -rf "$shadow" && mkdir -p "$shadow/memprof"
    ln -s "$ROOT"/memprof/* "$shadow/memprof/"
    ln -s "$ROOT/cli" "$shadow/memprof/cli"
    ln -s "$ROOT/bpf" "$shadow/memprof/bpf"
    export PYTHONPATH="$shadow${PYTHONPATH:+:$PYTHONPATH}"
    # -m and -c put the current directory (this repository, whose memprof/ lacks cli and bpf)
    # first on sys.path; PYTHONSAFEPATH (Python 3.11+) leaves it off.
    export PYTHONSAFEPATH=1
    echo "memprof from the source tree through $shadow"
  fi
  if [ $gpu = 0 ]; then
    echo "no GPU listed by nvidia-smi: not installing torch or nvidia-ml-py"
  elif ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "no torch with CUDA in $PY: pip install torch (PyPI's Linux wheel is a CUDA build)"
    step "$(setup_s 200)" "${pip[@]}" torch || echo "could not install torch"
  fi
  if [ $gpu = 1 ] && ! "$PY" -c 'import pynvml' 2>/dev/null; then
    step "$(setup_s 40)" "${pip[@]}" nvidia-ml-py || echo "could not install nvidia-ml-py (gpu_used_bytes samples need it)"
  fi
  if [ $gpu = 1 ] && ! "$PY" -c 'import transformers' 2>/dev/null; then
    step "$(setup_s 40)" "${pip[@]}" 'transformers>=5.0' || echo "could not install transformers (the kv_cache_cuda check needs it)"
  fi
  if ! "$PY" -c 'import bcc' 2>/dev/null && [ -d /usr/lib/python3/dist-packages/bcc ]; then
    # bcc is pure Python over libbcc.so: give this Python that one package, nothing else of Debian's.
    mkdir -p /tmp/memprof-gpu-check-bcc
    ln -sfn /usr/lib/python3/dist-packages/bcc /tmp/memprof-gpu-check-bcc/bcc
    export PYTHONPATH="/tmp/memprof-gpu-check-bcc${PYTHONPATH:+:$PYTHONPATH}"
    echo "bcc from /usr/lib/python3/dist-packages through /tmp/memprof-gpu-check-bcc"
  fi
  echo "python for the checks: $(probe "$PY")"
  local import_error
  if ! import_error=$("$PY" -c 'import memprof.cli.main' 2>&1); then
    EBPF_WHY="memprof cannot be imported: $(echo "$import_error" | tail -1)"
  elif ! import_error=$("$PY" -c 'import bcc' 2>&1); then
    EBPF_WHY="bcc cannot be imported (python3-bpfcc): $(echo "$import_error" | tail -1)"
  else
    COLUMNS=120 timeout 60 "$PY" -m memprof doctor || echo "(memprof doctor: recording may not work; trying anyway)"
  fi
}

checks() {
  section checks
  if [ -z "$PY" ]; then
    echo "eBPF unavailable: $EBPF_WHY"
    echo "CHECK helper: FAIL no Python to run scripts/gpu_check.py"
    return
  fi
  local budget=$(($(left) - 10))
  [ "$budget" -lt 60 ] && budget=60
  timeout -k 5 "$budget" "$PY" scripts/gpu_check.py --out "$DEST" --budget-s "$((budget - 5))" \
    ${EBPF_WHY:+--no-ebpf "$EBPF_WHY"} ||
    echo "CHECK helper: FAIL scripts/gpu_check.py exit $? (124: out of time)"
}

# The CPU loop's overhead bar, in about the seconds GPU_CHECK_BAR_S gives.
bar() {
  local bar_s=${GPU_CHECK_BAR_S:-0}
  [ "$bar_s" -le 0 ] && return
  section "overhead bar (examples/train.py on the CPU, ${bar_s}s)"
  if [ -z "$PY" ] || [ -n "$EBPF_WHY" ]; then
    echo "CHECK bar: SKIP ${EBPF_WHY:-no Python}"
    return
  fi
  local rounds=$((bar_s / 20))
  [ "$rounds" -lt 4 ] && rounds=4
  CUDA_VISIBLE_DEVICES= timeout -k 5 "$((bar_s + 60))" "$PY" bench/train_overhead.py --repeats "$rounds" \
    --runs baseline,control,empty-probes,memprof --json "$DEST/bar.json" >"$DEST/bar.txt" 2>&1
  local rc=$?
  cat "$DEST/bar.txt"
  echo "CHECK bar: $([ $rc = 0 ] && echo INFO || echo "FAIL exit $rc (124: out of time)") $(grep -h '^memprof per-round' "$DEST/bar.txt" | head -1)" |
    tee -a "$DEST/summary.txt"
}

main() {
  echo "memprof GPU check: $ROOT -> $DEST (budget ${BUDGET_S}s, bar ${GPU_CHECK_BAR_S:-0}s)"
  environment
  ebpf_setup
  python_setup
  checks
  bar
  section summary
  grep -h '^CHECK' "$DEST/summary.txt" 2>/dev/null || echo "no summary.txt"
  echo "outputs: $DEST ($(du -sh "$DEST" 2>/dev/null | cut -f1)); took $((SECONDS - T0))s"
}

main 2>&1 | tee "$DEST/gpu_check.log"
exit 0
