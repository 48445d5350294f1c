# memprof: `make demo` and `make test` set everything up first (idempotent), as root.
PY := .venv/bin/python

.PHONY: setup demo test unit bench clean

setup:
	@bash scripts/setup.sh

## Record a known kernel leak (257 pipes held open amid churn) and print the leak report.
demo: setup
	$(PY) -m memprof record -q --force -o demo.memprof -- examples/bin/kernel_leak
	$(PY) -m memprof report leaks demo.memprof --layer kernel_slab --top 3

## The whole test suite: unit tests, then real eBPF integration tests (root, bcc).
test: setup
	$(PY) -m pytest -q -rs tests

unit:
	$(PY) -m pytest -q tests/unit

bench: setup
	$(PY) bench/churn_overhead.py
	$(PY) bench/startup_latency.py

clean:
	rm -rf demo.memprof build dist *.egg-info
	$(MAKE) -C examples clean
