# The two commands of the quickstart: `make run` and `make test`.
# Both create .venv on first use and install the project into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck pytest pytest-parallel pytest-serial bench clean check-java proto compile tools rewrite-tests

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required (found " + sys.version.split()[0] + ")"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

check-java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "Java 17+ is required for the Spark part (PySpark 4)."; \
	  echo "On Debian: sudo apt-get install -y openjdk-17-jre-headless"; exit 1; }

# Byte-compile the project's own modules (skips those compiled already): an editable
# install leaves them as source, and where PYTHONDONTWRITEBYTECODE is set (as on this
# project's CI machine) every node, CLI and Spark worker process would compile its
# ~300 modules again at start (0.3 s of CPU each; a test run starts ~500 processes).
PACKAGES := analytics bench chaos dispatch dledger_commitlog h2grpc netkit proto raft raftio store tests
compile: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 $(PACKAGES)

# What tests use beyond Python: Prometheus and promtool (tests/test_prometheus.py):
# the system's, else Debian's package unpacked under .venv/tools (no root needed, no
# service started); Chromium for the console's browser tests
# (tests/test_console_pages.py) and iptables for the network-namespace chaos tests
# (tests/test_chaos_netns.py, which run as root): the system's, else Debian's package
# installed with apt-get when running as root (Playwright, of the dev extra, never
# downloads a browser). Where neither works, those tests skip and say why.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1
TOOLS := $(VENV)/tools
APT_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends
define apt_tool # $(1): the command, $(2): its Debian package, $(3): what skips without it
	@PATH="$$PATH:/usr/sbin:/sbin" command -v $(1) >/dev/null 2>&1 || { test "$$(id -u)" = 0 \
	  && { $(APT_INSTALL) $(2) >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && $(APT_INSTALL) $(2) >/dev/null 2>&1; }; } \
	  && echo "$(1): Debian's package installed with apt-get"; } \
	  || echo "$(1): not found and not installable with apt-get (needs root): $(3) will skip"
endef
tools: $(STAMP)
	$(call apt_tool,chromium,chromium,the browser tests)
	$(call apt_tool,iptables,iptables,the network-namespace chaos tests)
	@command -v promtool >/dev/null 2>&1 || test -x $(TOOLS)/usr/bin/promtool || { \
	  mkdir -p $(TOOLS)/deb && cd $(TOOLS)/deb && apt-get download prometheus >/dev/null 2>&1 \
	  && dpkg-deb -x prometheus_*.deb .. && rm -f prometheus_*.deb \
	  && echo "prometheus: Debian's package unpacked under $(TOOLS)"; } \
	  || echo "prometheus: not found and 'apt-get download prometheus' failed: its tests will skip"

run: $(STAMP) check-java compile
	$(BIN)/python -m analytics.demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# Independent tests run on PYTEST_WORKERS processes (pytest-xdist; tests that share a
# module's cluster or the Spark session stay on one worker); the few that measure
# the event loop's timing run alone afterwards, on a quiet machine. Four workers on
# this 2-core machine: most tests wait on node processes, and a fourth worker fills
# that wait (make test 476 -> 415 s here, one fresh clone each, quiet).
PYTEST_WORKERS ?= 4
pytest: pytest-parallel pytest-serial

# pytest rewrites the asserts of every test module as it collects them, in each worker;
# where PYTHONDONTWRITEBYTECODE is set it cannot keep what it rewrote, and the workers
# did it again each (5 s of CPU apiece, beside mypy, before the first test ran). One
# collection with bytecode writing on leaves the rewritten modules, which pytest reads
# whatever that setting (the rewrite is redone whenever a test file changes).
rewrite-tests: $(STAMP) compile
	@env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest --collect-only -q \
	  -p no:cacheprovider > $(VENV)/collected.txt 2>&1 || { cat $(VENV)/collected.txt; exit 1; }

pytest-parallel: $(STAMP) compile tools rewrite-tests
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup -m "not serial"

pytest-serial: $(STAMP) compile rewrite-tests
	$(BIN)/python -m pytest -m serial $$(grep -l "mark.serial" tests/test_*.py)

# lint and typecheck run beside the parallel tests, which leave part of a core idle
# (they wait on node processes); the timing tests run after all three, alone.
test:
	$(MAKE) --no-print-directory -j3 lint typecheck pytest-parallel
	$(MAKE) --no-print-directory pytest-serial

bench: $(STAMP)
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

# Regenerate the committed gRPC stubs after editing proto/dledger.proto (grpcio's
# dledger_pb2_grpc.py serves grpc.aio and the clients; h2grpc needs no stubs).
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. \
	  --grpc_python_out=. --pyi_out=. proto/dledger.proto

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
