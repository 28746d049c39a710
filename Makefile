# The commands: `make demo` (the main job end to end on Azurite), `make test` (lint, then the suite), `make lint`.
# Everything they need is installed here: a virtualenv from requirements*.txt, Azurite from npm,
# and, for `make test`, GDAL's gdalwarp program from apt when the machine lacks it.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
CHECKOV_VENV := .venv-checkov
STAC_VENV := .venv-stac
PYTEST_ARGS ?=
# The main suite runs in this many pytest-xdist workers, whole files per worker (--dist loadfile:
# a module's fixtures, its Azurite included, stay in one process). Each worker starts its own
# Azurite. Three on a two-core machine: many tests wait (outages, retry sleeps, leases, other
# processes), and a third worker fills those waits: measured on a quiet 2-core machine, the main
# suite took 10:49 with two and 8:58 with three (962 tests, the fault tests beside it); 9:14 with
# three for 1,028 tests in a fresh-clone CI run at 31e6f46. Every test runs beside others, as on a
# shared machine; 0 runs it in one process.
PYTEST_WORKERS ?= 3
# Python 3.13, for the second runtime (Flex Consumption): the local host then calls every function
# through the language worker's own package, azure-functions-runtime (docs/local-host.md). The
# interpreter is PYTHON313 when given, else the first of python3.13 on the PATH and pyenv's 3.13
# builds that runs as 3.13 (pyenv's shim on the PATH does not unless 3.13 is selected); with none,
# `make setup` (so `make demo` and `make test`) stops and says so.
PYTHON313 ?= $(shell for p in "$$(command -v python3.13)" $(sort $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3.13)); do \
  [ -n "$$p" ] && "$$p" -c 'import sys; assert sys.version_info[:2] == (3, 13)' 2>/dev/null && { echo "$$p"; break; }; done)
VENV313 := .venv313
WORKER_TESTS := tests/test_end_to_end.py tests/test_worker_runtime.py

.PHONY: setup gdalwarp chromium postgres titiler-venv demo test bench bench-quick lint clean

setup: $(VENV)/.installed $(VENV313)/.installed $(CHECKOV_VENV)/.installed $(STAC_VENV)/.installed node_modules/.installed postgres web/dist/index.html

$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt -r requirements-dev.txt
	touch $@

# The app's requirements on Python 3.13 (their markers pick azure-functions 2.x and
# azure-functions-runtime), the worker's protocol compiled, and what the worker tests need.
$(VENV313)/.installed: requirements.txt requirements-worker.txt $(wildcard devhost/worker/protos/*.proto devhost/worker/protos/*/*.proto)
	@[ -n "$(PYTHON313)" ] || { echo "Python 3.13 is missing: install it (python3.13 on the PATH, or pyenv), or give its path as PYTHON313=..." >&2; exit 1; }
	$(PYTHON313) -m venv $(VENV313)
	$(VENV313)/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(VENV313)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.txt -r requirements-worker.txt
	$(VENV313)/bin/python -m devhost.worker.messages
	touch $@

# checkov pins versions that clash with the test tools, so it lives in a venv of its own.
$(CHECKOV_VENV)/.installed: requirements-checkov.txt
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(CHECKOV_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-checkov.txt
	touch $@

# titiler, the tile bench's reference (python -m bench.tiles), in a venv of its own: the app never
# imports it, and `make setup` does not install it.
TITILER_VENV := .venv-titiler
titiler-venv: $(TITILER_VENV)/.installed

$(TITILER_VENV)/.installed: requirements-titiler.txt
	$(PYTHON) -m venv $(TITILER_VENV)
	$(TITILER_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-titiler.txt
	touch $@

# stac-fastapi-pgstac pins its own web stack, so the STAC API runs from a venv of its own too.
$(STAC_VENV)/.installed: requirements-stac.txt
	$(PYTHON) -m venv $(STAC_VENV)
	$(STAC_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(STAC_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-stac.txt
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

# The web page (docs/dashboard.md): web/src bundled with OpenLayers by esbuild, both pinned in
# package.json, into web/dist, which the app serves and deploys; never committed.
web/dist/index.html: node_modules/.installed web/build.mjs $(wildcard web/src/*)
	node_modules/.bin/node web/build.mjs

# The gdalwarp program (Debian's gdal-bin) is the reference the web-optimized tests compare the
# mosaics with: a warp of the whole source by GDAL's own tool in one process, not by this
# project's code (rasterio bundles GDAL's library but none of its programs). Installed only when
# missing, so a machine that has it, or a second run, costs a `command -v`; the package lists are
# fetched only when the install cannot find the package without them (a fresh image has none).
# Only `make test` needs it (`make demo` does not). apt-get needs root, or sudo. Without apt-get
# (not Debian or Ubuntu) it only warns; the tests that need gdalwarp then fail, saying so.
gdalwarp:
	@command -v gdalwarp >/dev/null || { \
	  if ! command -v apt-get >/dev/null; then \
	    echo "warning: gdalwarp is missing and there is no apt-get: install GDAL's programs for the tests" >&2; exit 0; \
	  fi; \
	  sudo=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
	  install="$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gdal-bin"; \
	  echo "gdalwarp is missing: installing gdal-bin"; log=$$(mktemp); \
	  $$install >"$$log" 2>&1 || { $$sudo apt-get update -qq && $$install; } >"$$log" 2>&1; \
	  command -v gdalwarp >/dev/null || { cat "$$log" >&2; rm -f "$$log"; echo "gdal-bin did not install gdalwarp" >&2; exit 1; }; \
	  rm -f "$$log"; \
	}

# Debian's Chromium, which the browser tests (tests/test_browser.py) drive through Playwright's
# Python package; Playwright's own browser download is never used. Installed as gdalwarp is.
chromium:
	@command -v chromium >/dev/null || { \
	  if ! command -v apt-get >/dev/null; then \
	    echo "warning: chromium is missing and there is no apt-get: install Chromium for the browser tests" >&2; exit 0; \
	  fi; \
	  sudo=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
	  install="$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium"; \
	  echo "chromium is missing: installing it"; log=$$(mktemp); \
	  $$install >"$$log" 2>&1 || { $$sudo apt-get update -qq && $$install; } >"$$log" 2>&1; \
	  command -v chromium >/dev/null || { cat "$$log" >&2; rm -f "$$log"; echo "the chromium package did not install chromium" >&2; exit 1; }; \
	  rm -f "$$log"; \
	}

# PostgreSQL and PostGIS (Debian's postgresql and postgresql-15-postgis-3, bookworm's) for the
# catalog: the tests and the demo start a cluster of their own on 127.0.0.1 (testkit/postgres.py)
# and install pgstac in it with pypgstac's migration. Installed only when missing, as gdalwarp is.
POSTGRES_PACKAGES := postgresql postgresql-15-postgis-3
postgres:
	@{ ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 && ls /usr/share/postgresql/*/extension/postgis.control >/dev/null 2>&1; } || { \
	  if ! command -v apt-get >/dev/null; then \
	    echo "warning: PostgreSQL with PostGIS is missing and there is no apt-get: install them for the catalog's tests" >&2; exit 0; \
	  fi; \
	  sudo=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
	  install="$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(POSTGRES_PACKAGES)"; \
	  echo "PostgreSQL or PostGIS is missing: installing $(POSTGRES_PACKAGES)"; log=$$(mktemp); \
	  $$install >"$$log" 2>&1 || { $$sudo apt-get update -qq && $$install; } >"$$log" 2>&1; \
	  ls /usr/share/postgresql/*/extension/postgis.control >/dev/null 2>&1 || { cat "$$log" >&2; rm -f "$$log"; echo "$(POSTGRES_PACKAGES) did not install PostGIS" >&2; exit 1; }; \
	  rm -f "$$log"; \
	}

demo: setup postgres
	$(PY) -m devhost demo

# Lint first, so CI (.ci/run calls `make test`) fails on a finding before the slow tests start.
# mypy checks the app's layers and the local host (pyproject.toml [tool.mypy]), clean.
lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# The storage-fault tests (a proxy refusing or dropping every request for 45 s) run in a pytest
# process of their own, beside the main suite rather than after it: they spend most of their
# 3 minutes waiting out outages and retry sleeps, so on two cores they cost the suite little CPU
# and no longer add their time to its wall. Their output is printed when both are done. Exit 5 is
# "no test selected" (e.g. PYTEST_ARGS='-m "not slow"'), not a failure.
FAULT_TESTS := tests/test_storage_faults.py

# --durations: the slowest tests, in every run's log, so the suite's time is watched where it is spent.
test: lint gdalwarp postgres chromium
	@faults_log=$$(mktemp); \
	$(PY) -m pytest $(PYTEST_ARGS) $(FAULT_TESTS) >"$$faults_log" 2>&1 & faults=$$!; \
	trap 'kill $$faults 2>/dev/null; rm -f "$$faults_log"' EXIT; \
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS) --durations=30 --ignore=$(FAULT_TESTS); main=$$?; \
	wait $$faults; fault_status=$$?; \
	echo "== $(FAULT_TESTS), run beside the suite above =="; cat "$$faults_log"; \
	[ $$main -eq 0 ] || exit $$main; \
	[ $$fault_status -eq 0 ] || [ $$fault_status -eq 5 ] || exit $$fault_status; \
	echo "== $(WORKER_TESTS) on Python 3.13, every function through azure-functions-runtime =="; \
	TILECOMMIT_DEVHOST_WORKER=runtime $(VENV313)/bin/python -m pytest $(PYTEST_ARGS) $(WORKER_TESTS); worker=$$?; \
	[ $$worker -eq 0 ] || [ $$worker -eq 5 ]

bench: setup
	$(PY) -m bench

bench-quick: setup
	$(PY) -m bench --quick

clean:
	rm -rf $(VENV) $(VENV313) devhost/worker/_generated $(CHECKOV_VENV) $(STAC_VENV) node_modules .pytest_cache .hypothesis
