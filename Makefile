# Everyday commands; CI runs `make test` through .ci/run and nothing else.
PYTHON ?= python3
VENV ?= .venv
# An unpinned torch pulls GBs of CUDA wheels on these machines: pin it, install it first.
TORCH_SPEC ?= torch==2.13.0
# bge-m3's reference (tests/fidelity/bge_m3_layouts.py), without the dependencies it needs only to train or evaluate.
FLAGEMBEDDING_SPEC ?= FlagEmbedding==1.4.2
HOST ?= 127.0.0.1
PORT ?= 8000
API_SERVERS ?= 2
PYTEST_ARGS ?=
# The suite over three workers (pytest-xdist) on the 2-core hosts it runs on: each module whole on one of them, in file
# order with its module fixtures started once, tests/e2e whole on one and the longest dealt first (tests/scheduling.py),
# and a test marked `alone` with no other beside it (tests/alone.py); the third fills what the end-to-end tests' waits
# leave idle (docs/architecture.md). PYTEST_WORKERS=0 runs it all in one process.
PYTEST_WORKERS ?= 3
# `make bench` (docs/benchmarks.md): which loads, which server shapes, how long. With these
# defaults it takes about 25 minutes on 2 cores; MAX_MINUTES skips (and lists) whatever is left.
WORKLOADS ?= a,b,c,d
API_SERVER_COUNTS ?= 1,2
PREPROCESS ?= 0,1
CONCURRENCY ?= 1,8,32,64
DURATION ?= 10
WARMUP ?= 2
PEERS ?= infinity
MAX_MINUTES ?= 40
BENCH_ARGS ?=

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.bench-installed
PEERS_VENV ?= bench/.peers-venv
PEERS_STAMP := $(PEERS_VENV)/.installed
INFINITY_SPEC ?= infinity-emb[server,torch]==0.0.78
ONNX_EXPORT_VENV ?= bench/.onnx-export-venv
ONNX_PEER_VENV ?= bench/.onnx-peer-venv
# Infinity's ONNX Runtime engine and what it needs beside it (bench/onnx_peer.py says why each pin).
ONNX_PEER_SPECS ?= "infinity-emb[server]==0.0.78" "optimum[onnxruntime]==1.24.0" "transformers<4.49" "numpy<2" \
	"sentence-transformers==3.4.1" "pyarrow<21"
PYLATE_VENV ?= tests/.pylate-venv
PYLATE_STAMP := $(PYLATE_VENV)/.installed

export HF_HUB_OFFLINE ?= 1
export HF_HUB_DISABLE_TELEMETRY ?= 1

.PHONY: install test-tools serve test bench-onnx-peer test-pylate lint format typecheck bench bench-peers clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	$(BIN)/python -m pip install --quiet --no-deps "$(FLAGEMBEDDING_SPEC)"
	touch $(STAMP)

# Programs some end-to-end tests drive (nginx in front; promtool and prometheus reading /metrics; ip for the
# host-loss test's namespaces), from Debian's packages where missing; without root or apt-get, those tests skip
# and say why.
TEST_PACKAGES ?= nginx prometheus iproute2
test-tools:
	@if command -v promtool >/dev/null && command -v prometheus >/dev/null && command -v ip >/dev/null \
	    && { command -v nginx >/dev/null || test -x /usr/sbin/nginx; }; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing $(TEST_PACKAGES) for the end-to-end tests"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q --no-install-recommends $(TEST_PACKAGES) >/dev/null 2>&1 \
	    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends $(TEST_PACKAGES) >/dev/null 2>&1; } \
	    || echo "$(TEST_PACKAGES) could not be installed: the tests that drive them skip"; \
	else echo "$(TEST_PACKAGES) missing and apt-get needs root: the tests that drive them skip"; fi

serve: $(STAMP)
	$(BIN)/launch --api-server-count $(API_SERVERS) --host $(HOST) --port $(PORT)

test: lint typecheck test-tools
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadscope $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: $(STAMP)
	$(BIN)/mypy

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[dev,bench]"
	touch $(BENCH_STAMP)

# Never part of `make test`: results go to bench/results/ (JSON, PNG, markdown table).
bench: $(BENCH_STAMP) $(if $(filter infinity,$(PEERS)),$(PEERS_STAMP))
	$(BIN)/python -m bench.sweep --workloads $(WORKLOADS) --api-servers $(API_SERVER_COUNTS) \
		--preprocess-workers $(PREPROCESS) --concurrency $(CONCURRENCY) --duration $(DURATION) \
		--warmup $(WARMUP) --peers $(or $(PEERS),none) --max-minutes $(MAX_MINUTES) $(BENCH_ARGS)

# Peers live in their own virtualenv: infinity-emb pins numpy<2, sentence-transformers<4 and
# transformers<5, which poolserve's environment cannot hold. torch is pinned in the same command
# so pip cannot swap in a CUDA build.
$(PEERS_STAMP):
	test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install --quiet "$(TORCH_SPEC)"
	$(PEERS_VENV)/bin/python -m pip install --quiet "$(TORCH_SPEC)" "$(INFINITY_SPEC)"
	touch $(PEERS_STAMP)

bench-peers: $(PEERS_STAMP)

# Infinity's ONNX Runtime engine (issue 33): the exporter's venv (optimum-onnx) and the peer's, apart.
bench-onnx-peer: $(ONNX_EXPORT_VENV)/.installed $(ONNX_PEER_VENV)/.installed

$(ONNX_EXPORT_VENV)/.installed:
	test -x $(ONNX_EXPORT_VENV)/bin/python || $(PYTHON) -m venv $(ONNX_EXPORT_VENV)
	$(ONNX_EXPORT_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(ONNX_EXPORT_VENV)/bin/python -m pip install --quiet "$(TORCH_SPEC)"
	$(ONNX_EXPORT_VENV)/bin/python -m pip install --quiet "$(TORCH_SPEC)" "optimum-onnx[onnxruntime]"
	touch $@

$(ONNX_PEER_VENV)/.installed:
	test -x $(ONNX_PEER_VENV)/bin/python || $(PYTHON) -m venv $(ONNX_PEER_VENV)
	$(ONNX_PEER_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(ONNX_PEER_VENV)/bin/python -m pip install --quiet "$(TORCH_SPEC)"
	$(ONNX_PEER_VENV)/bin/python -m pip install --quiet "$(TORCH_SPEC)" $(ONNX_PEER_SPECS)
	touch $@

# PyLate, the reference of its ColBERT layout, pins sentence-transformers 5.3 and transformers <= 5.3: its own
# virtualenv (torch pinned as above), its index dependencies (fast-plaid, fastkmeans) left out with --no-deps,
# since encoding needs none of them. Not in `make test`: the install takes minutes.
$(PYLATE_STAMP):
	test -x $(PYLATE_VENV)/bin/python || $(PYTHON) -m venv $(PYLATE_VENV)
	$(PYLATE_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PYLATE_VENV)/bin/python -m pip install --quiet "$(TORCH_SPEC)" "sentence-transformers==5.3.0" \
		"transformers==5.3.0" datasets accelerate pandas ujson
	$(PYLATE_VENV)/bin/python -m pip install --quiet --no-deps "pylate==1.6.0"
	touch $(PYLATE_STAMP)

# A ColBERT saved by PyLate, served, against PyLate's own encode and scores (tests/fidelity/test_pylate.py).
test-pylate: $(STAMP) $(PYLATE_STAMP)
	POOLSERVE_PYLATE_PYTHON=$(PYLATE_VENV)/bin/python $(BIN)/python -m pytest tests/fidelity/test_pylate.py $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
