# meshscope — `make demo` and `make test` work on a fresh clone; both run `make setup` first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.setup-stamp
# The CPU build of torch 2.13.0 (it lies on this machine's disk); on a machine with CUDA the
# pinned version comes from the package index as usual.
TORCH  ?= torch==2.13.0

.PHONY: setup demo test samples clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# Install torch first and explicitly, so the project's `torch>=2.13` requirement is already
	# met and pip never resolves it to a multi-GB CUDA wheel on a CPU-only machine.
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: setup
	$(VENV)/bin/meshscope demo

test: setup
	$(PY) -m pytest -q -rs

# Regenerate the bundled sample run directories (see samples/README.md).
samples: setup
	bash samples/regenerate.sh

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
