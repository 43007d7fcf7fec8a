# `make run` installs into .venv and starts one node; `make test` installs everything and runs the suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFORMANCE := tests/conformance

.PHONY: run test install tools bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,pipeline]'
	touch $@

$(CONFORMANCE)/node_modules/.installed: $(CONFORMANCE)/package.json $(CONFORMANCE)/package-lock.json
	cd $(CONFORMANCE) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

install: $(BIN)/.installed

run: install
	$(BIN)/rill serve

# wrk (Debian's package) drives `rill bench append --generator wrk` and its test; Debian's
# chromium runs the console's browser tests (tests/console/, through Playwright).
tools:
	@command -v wrk >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		(apt-get install -y -qq wrk >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq wrk >/dev/null)); } || \
		echo "wrk is not installed: its benchmark test will be skipped"
	@[ -x /usr/bin/chromium ] || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		(apt-get install -y -qq chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)); } || \
		echo "chromium is not installed: the console's browser tests will be skipped"

test: install tools $(CONFORMANCE)/node_modules/.installed
	$(BIN)/python -m pytest

bench: install
	$(BIN)/rill bench compare append --pin-server 0 --pin-client 1 --baseline

clean:
	rm -rf $(VENV) $(CONFORMANCE)/node_modules
