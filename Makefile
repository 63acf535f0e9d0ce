# Two commands on a fresh machine:
#   make demo   set up, then run the main job: the paper's state-tracking claim (parity), demo profile
#   make test   set up, then run the test suite (its default tier; make test-slow: the rest)
# Both install into ./.venv (it sees packages already installed system-wide, so an existing
# torch is reused). torch is pinned to the CPU wheel first, so pip never pulls a CUDA build.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0

.PHONY: demo test test-slow imports clean

$(VENV)/.runtime: pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[plot]'
	touch $@

$(VENV)/.test: $(VENV)/.runtime
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

demo: $(VENV)/.runtime
	$(VENV)/bin/xlstm-zoo grid state_tracking --profile demo --jobs 2

# The default tier (under 15 minutes on 2 cores); `make test-slow` runs the tests marked slow (compiler
# builds, torchrun and Ray process groups, long ONNX validations, the MLflow server), which CI runs too.
test: $(VENV)/.test
	$(PY) -m pytest -m "not slow"

test-slow: $(VENV)/.test
	$(PY) -m pytest -m slow

# The import contract in pyproject.toml (layers import only downward), over the whole package.
imports: $(VENV)/.test
	$(PY) tools/lint_imports.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
