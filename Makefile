# agentmemory — two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
# torch comes first, pinned to the CPU build that lies on the machine's disk, so that
# sentence-transformers does not pull GBs of CUDA packages.
TORCH_VERSION ?= 2.13.0
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
TEST_STAMP := $(VENV)/.installed-test-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

.PHONY: run test test-citus install install-test lint format bench peers-venv clean-venv

$(PY):
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "Python 3.11 is needed ($(PYTHON) not found)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet -e .
	@touch $@

$(TEST_STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(PY) -m pip install --quiet -e ".[test,embeddings,dev,langchain]"
	@touch $@ $(STAMP)

install: $(STAMP)

install-test: $(TEST_STAMP)

run: install
	$(PY) manage.py serve

test: install-test
	$(BIN)/python -m pytest

# The API, MCP, OTLP, worker and curation suites on a Citus coordinator plus two workers, when
# a Citus build exists (scripts/build_citus.sh SOURCE_DIR makes one; docs/scale-out.md).
CITUS_TREE ?= var/citus-pg
test-citus: install-test
	@if [ -f $(CITUS_TREE)/lib/postgresql/citus.so ]; then scripts/test_citus.sh $(CITUS_TREE); \
	else echo "no Citus build in $(CITUS_TREE): the Citus suite is skipped (docs/scale-out.md)"; fi

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install-test
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install
	$(PY) manage.py benchmark

# `manage.py benchmark --only peers_http` serves the peers from a venv of their own:
# langchain-postgres pins the pgvector package below the one the product needs. The peers'
# handlers run on the same server as ours (gunicorn, uvicorn worker, orjson, psycopg).
PEERS_VENV ?= var/peers-venv
PEERS_STAMP := $(PEERS_VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

$(PEERS_STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "Python 3.11 is needed ($(PYTHON) not found)"; exit 1; }
	rm -rf $(PEERS_VENV)
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install --quiet $$($(PYTHON) scripts/peers_requirements.py)
	@touch $@

peers-venv: $(PEERS_STAMP)

clean-venv:
	rm -rf $(VENV)
