# memprof: `make demo` and `make test` set everything up first (idempotent), as root.
PY := .venv/bin/python
BINDIR := /usr/local/bin

.PHONY: setup install uninstall demo test unit bench clean

setup:
	@bash scripts/setup.sh

## `memprof` on root's PATH (and sudo's): a wrapper in $(BINDIR) that runs .venv's memprof,
## isolated from the caller's PYTHONPATH and folder (scripts/install.sh says how it is safe as root).
install: setup
	@bash scripts/install.sh $(BINDIR)

uninstall:
	rm -f $(BINDIR)/memprof

## Record a known kernel leak (257 pipes held open amid churn) and print the leak report.
demo: setup
	$(PY) -m memprof record -q --force -o demo.memprof -- examples/bin/kernel_leak
	$(PY) -m memprof report leaks demo.memprof --layer kernel_slab --top 3
	@echo "memprof is .venv/bin/memprof here (.venv/bin/memprof report demo.memprof); \
	\`make install\` puts it on root's PATH and sudo's, as the README's examples use it"

## The whole test suite: unit tests, then real eBPF integration tests (root, bcc).
test: setup
	$(PY) -m pytest -q -rs tests

unit:
	$(PY) -m pytest -q tests/unit

# One bench per goal of issue 24, each printing memprof beside its anchor, measured in the
# same run (bcc's memleak-bpfcc, memray: installed on first use); results in bench/RESULTS.md.
bench: setup
	$(PY) bench/startup_latency.py                                  # start-up, peak RSS: memleak
	$(PY) bench/verifier_load.py                                    # start-up: the verifier's work per program
	$(PY) bench/churn_overhead.py                                   # kernel churn: memleak, and the floors under it
	$(PY) bench/train_overhead.py --runs baseline,control,memprof,memray  # whole process and loop: memray
	$(PY) bench/native_cost.py                                      # +native, whole commands: memray --native
	$(PY) bench/kernel_stack_sampling.py                            # sampled kernel stacks vs unsampled
	$(PY) bench/ring_size.py --workers 2                            # ring buffer size vs lost events

clean:
	rm -rf demo.memprof build dist *.egg-info
	$(MAKE) -C examples clean
