# Two commands on a fresh machine:  make demo   and   make test
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build on this disk; anything unpinned pulls a multi-GB CUDA build. Override for a GPU box:
#   make TORCH=torch==2.13.0 PIP_EXTRA_INDEX_URL=<your CUDA wheel index> ...
TORCH  ?= torch==2.13.0
export HF_HUB_OFFLINE ?= 1

.PHONY: demo test bench clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[test]"
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/hybridret demo

test: $(VENV)/.installed
	$(PY) -m pytest -q

bench: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[bench]"
	OMP_WAIT_POLICY=PASSIVE $(PY) benchmarks/core.py --build-sample 2000
	OMP_WAIT_POLICY=PASSIVE $(PY) benchmarks/sparse_exact.py
	OMP_WAIT_POLICY=PASSIVE $(PY) benchmarks/fusion.py
	OMP_WAIT_POLICY=PASSIVE $(PY) benchmarks/gqr_sensitivity.py
	OMP_WAIT_POLICY=PASSIVE $(PY) benchmarks/train_eval.py
	$(PY) benchmarks/report.py

clean:
	rm -rf $(VENV) indexes/sample
