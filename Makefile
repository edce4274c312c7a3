# meshscope — `make demo` and `make test` work on a fresh clone; both run `make setup` first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.setup-stamp
# The CPU build of torch 2.13.0 (it lies on this machine's disk); on a machine with CUDA the
# pinned version comes from the package index as usual.
TORCH  ?= torch==2.13.0

.PHONY: setup bytecode demo test test-fast mutate samples schema clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# Install torch first and explicitly, so the project's `torch>=2.13` requirement is already
	# met and pip never resolves it to a multi-GB CUDA wheel on a CPU-only machine.
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e '.[test]'
	# The former TensorBoard profiler plugin, a test oracle only (its parser's step times and
	# categories; tests/test_gpu_traces.py): without its TensorBoard dependency, which the
	# parser does not import.
	$(PY) -m pip install --quiet --no-deps torch-tb-profiler==0.4.3
	touch $(STAMP)

# The project's modules compiled once, as pip does for an installed package: where
# PYTHONDONTWRITEBYTECODE is set (this machine, many CI images) Python never writes them, and
# every process — each rank of a run, each `meshscope` command, each test's subprocess —
# would compile them from source again (about 0.25 s for the analysis). Only changed files
# are compiled again; a stale file is still read from its source.
bytecode: setup
	$(PY) -m compileall -q -j 0 meshscope analysis collectors dashboard parallel

demo: bytecode
	$(VENV)/bin/meshscope demo

# Two pytest runs. First the tests that run in one process (-m "not slow and not browser") on
# TEST_WORKERS cores at once (pytest-xdist, --dist loadfile: each file on one worker, so its
# module fixtures are made once); then the multi-process (slow) and browser tests one at a
# time: their jobs' ranks and the browser use the cores themselves, and a job's premises (fixed
# waits timed against each other) hold only when it does not share the machine with another.
# Both always run; the target fails if either did. --durations: the slowest tests named at the
# end of each, to keep the suite's time in view.
TEST_WORKERS ?= 2
test: bytecode
	$(PY) -m pytest -q -rs --durations=15 -n $(TEST_WORKERS) --dist loadfile \
		-m "not slow and not browser"; one=$$?; \
	$(PY) -m pytest -q -rs --durations=25 -m "slow or browser"; many=$$?; \
	test $$one -eq 0 && test $$many -eq 0

# The loop while developing: the suite without its multi-process (slow) and browser tests.
test-fast: bytecode
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -rs -n $(TEST_WORKERS) --dist loadfile \
		-m "not slow and not browser"

# Mutation testing (docs/testing.md; not in CI: it takes an hour and more). mutmut works on a copy
# of the working tree in MUTATE_DIR (results kept there between runs: a second run only tests
# what changed), never in this checkout; `make mutate MUTANTS='meshscope.analysis.compare.gate*'`
# runs one module's mutants. Then: cd $(MUTATE_DIR) && mutmut results / mutmut show ID.
MUTATE_DIR ?= /tmp/meshscope-mutate
MUTANTS ?=
mutate: setup
	$(PY) -m pip install --quiet 'mutmut>=3.8,<4'
	mkdir -p $(MUTATE_DIR)
	git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xf - -C $(MUTATE_DIR)
	cd $(MUTATE_DIR) && MESHSCOPE_SHARED_TRACES=/nonexistent OMP_NUM_THREADS=1 \
		nice -n 19 $(CURDIR)/$(VENV)/bin/mutmut run --max-children 1 $(MUTANTS)
	cd $(MUTATE_DIR) && $(CURDIR)/$(VENV)/bin/mutmut results

# Regenerate the bundled sample run directories (see samples/README.md).
samples: setup
	bash samples/regenerate.sh

# The JSON Schema of summary.json, generated from the report's record (analysis/report/model.py),
# into the package and docs/ (tests/test_summary_schema.py holds both to the record).
schema: setup
	$(VENV)/bin/meshscope schema summary > analysis/report/schemas/summary.schema.json
	cp analysis/report/schemas/summary.schema.json docs/summary.schema.json

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
