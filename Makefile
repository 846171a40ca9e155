# The two commands a new engineer needs: `make run` and `make test`. Both set everything up on a
# fresh machine with only Python >= 3.11 and make: a .venv from requirements.txt, a project-local
# Postgres and Redis under .run/ (scripts/devservices.py), and the database schema.
#
# Overrides: PYTHON (interpreter for the venv), PORT (API/admin, default 8000), EMULATOR_PORT
# (provider emulator, default 8900), DATABASE_URL / REDIS_URL (use your own servers instead).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum < requirements.txt | cut -d' ' -f1)
PORT ?= 8000
export PORT
# Where providers (and the emulator) send delivery receipts: our webhooks.
PUBLIC_BASE_URL ?= http://127.0.0.1:$(PORT)
export PUBLIC_BASE_URL

.PHONY: run test test-fast test-chaos stop setup services migrate static lint clean

$(STAMP): requirements.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is needed (set PYTHON=python3.11)")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	@rm -f $(VENV)/.installed-*
	@touch $@

setup: $(STAMP)

services: setup
	@$(PY) scripts/devservices.py up

migrate: services
	@$(PY) manage.py migrate --noinput -v 0

## static: collect the admin's and the API docs' (Swagger UI) static files into .run/static, which
## gunicorn serves through WhiteNoise (hashed names, compressed copies); needed by everything that
## starts the web process
static: services
	@$(PY) manage.py collectstatic --noinput -v 0

## run: set up, then start the API/admin, emulator, workers and beat in the foreground (Ctrl-C stops all)
run: migrate static
	@$(PY) manage.py check
	@echo "API and admin: http://127.0.0.1:$(PORT)/  (docs: /api/docs/, admin: /admin/)"
	@echo "Provider emulator: http://127.0.0.1:$${EMULATOR_PORT:-8900}/_emulator/messages"
	@test "$$(id -u)" != 0 || echo "Running as root: fine in a local sandbox; in production run the workers as an unprivileged user."
	@rm -f .run/prometheus/*.db  # multiprocess metric files of the previous run
	@NOTIFY_ROOT_NOTED=1 $(VENV)/bin/honcho start -f Procfile -p $(PORT) || test $$? -eq 130  # Ctrl-C is a normal stop

## TEST_WORKERS: pytest-xdist processes for `make test` and `make test-fast` (each its own test
## database and Redis database; the end-to-end stack's tests share one, tests/conftest.py). Tests
## marked `serial` need the machine to themselves: `make test` runs them alone, after the others.
## TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadgroup

## test: set up, then lint (ruff; lint-imports: the floors of docs/ARCHITECTURE.md; mypy on core,
## providers and notifications), then run the whole test suite (unit + end-to-end with real processes)
test: migrate static browser-deps alert-rules
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	@status=0; $(PY) -m pytest $(XDIST) -m "not serial" || status=$$?; \
	  $(PY) -m pytest -m serial || status=$$?; exit $$status

## browser-deps: Debian's Chromium for the real-browser admin tests (tests/browser), installed when
## /usr/bin/chromium is missing; needs root (otherwise those tests are skipped, with the reason)
.PHONY: browser-deps
browser-deps:
	@test -x /usr/bin/chromium || \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "browser-deps: /usr/bin/chromium is missing and this is not root: not installing it;" \
	         "the browser tests will be skipped (as root: apt-get install -y chromium)"; \
	  elif ! command -v apt-get >/dev/null 2>&1; then \
	    echo "browser-deps: /usr/bin/chromium is missing and there is no apt-get (not Debian):" \
	         "the browser tests will be skipped"; \
	  else \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; \
	  fi

## alert-rules: check the Prometheus alert rules (deploy/prometheus/alerts.yml) and run their unit tests
## (alerts_test.yml) with promtool. When it is missing, promtool alone is taken out of Debian's
## `prometheus` package into .venv/bin (apt-get download + dpkg-deb -x: the package's server is never
## installed or started); needs root for apt-get update (otherwise skipped, with the reason).
PROMTOOL = $(shell command -v promtool 2>/dev/null || echo $(VENV)/bin/promtool)
.PHONY: alert-rules
alert-rules:
	@test -x "$(PROMTOOL)" || \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "alert-rules: promtool is missing and this is not root: the alert rules are not checked" \
	         "(as root, make alert-rules takes promtool out of Debian's prometheus package)"; \
	  elif ! command -v apt-get >/dev/null 2>&1; then \
	    echo "alert-rules: promtool is missing and there is no apt-get (not Debian): the alert rules are not checked"; \
	  else \
	    dir=$$(mktemp -d) && apt-get update -qq && (cd $$dir && apt-get download -qq prometheus) && \
	    dpkg-deb -x $$dir/prometheus_*.deb $$dir/root && cp $$dir/root/usr/bin/promtool $(VENV)/bin/promtool && \
	    rm -rf $$dir; \
	  fi
	@if [ -x "$(PROMTOOL)" ] || [ -x $(VENV)/bin/promtool ]; then \
	  tool=$$(command -v promtool || echo $(VENV)/bin/promtool); \
	  $$tool --version | head -1 && \
	  $$tool check rules deploy/prometheus/alerts.yml && \
	  $$tool test rules deploy/prometheus/alerts_test.yml; \
	fi

## test-fast: only the tests that need no worker processes
test-fast: migrate static
	$(PY) -m pytest $(XDIST) -m "not e2e"

## test-chaos: every fault scenario at full size (20,000 recipients) against the whole stack, on a
## second, dedicated Postgres and Redis (it flushes and restarts them); writes docs/RELIABILITY.md
test-chaos: migrate static
	@rm -rf test-artifacts/chaos
	@DEVSERVICES_DIR=.run/chaos $(PY) scripts/devservices.py up
	@set -a; . .run/chaos/env; set +a; export DEVSERVICES_DIR=.run/chaos CHAOS_FULL=1 CHAOS_DEDICATED_SERVICES=1; \
	  $(PY) -m pytest tests/chaos -p no:cacheprovider -v; status=$$?; \
	  $(PY) scripts/devservices.py down; $(PY) scripts/chaos_report.py; exit $$status

## bench: the whole platform under a 1M-recipient campaign blast plus OTPs, beside the reference points
## of the same run (SDK/raw and durable ceilings, the naive baseline at its best; the harness is the
## bench/ package); writes bench/results/<UTC timestamp>.json and .png (docs/PERFORMANCE.md).
## BENCH_ARGS adds options, e.g. BENCH_ARGS="--channel push" for the 1M push run.
.PHONY: bench bench-smoke bench-events
bench: migrate static
	$(PY) manage.py bench $(BENCH_ARGS)

## bench-smoke: the same with 50,000 recipients (a few minutes); exits non-zero if anything was lost
## or an OTP was not delivered
bench-smoke: migrate static
	$(PY) manage.py bench --recipients 50000 $(BENCH_ARGS)

## bench-events: the event blast at smoke size: 2,000 events of a push + email type through
## POST /v1/events beside the OTP stream (~3 minutes: too long to add to bench-smoke); exits non-zero
## if an event was refused, a notification lost or an OTP not delivered. The full run is
## BENCH_ARGS="--events 100000 --send-seconds 420 --drain-timeout 1200" (docs/PERFORMANCE.md, "Event blast").
bench-events: migrate static
	$(PY) manage.py bench --scenario events --events 2000 $(BENCH_ARGS)

## stop: stop the project-local Postgres and Redis
stop:
	@test -x $(PY) && $(PY) scripts/devservices.py down || true

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

clean: stop
	rm -rf .run
