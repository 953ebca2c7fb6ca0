# The two commands of the README.  Each builds its own virtual environment on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU torch for tests (the H200 machine brings its own CUDA torch); triton pinned to the GPU's.
TORCH ?= torch==2.13.0
DEPS := $(TORCH) triton==3.6.0 numpy ml_dtypes hypothesis pytest pytest-xdist safetensors matplotlib
JOBS ?= auto
VERIFY_JOBS ?= $(shell nproc)

.PHONY: verify thorough test spec clean

$(BIN)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools
	$(BIN)/pip install --quiet $(DEPS)
	$(BIN)/pip install --quiet --no-build-isolation --no-deps -e .
	touch $@

verify: $(BIN)/.installed
	$(BIN)/dsv4spec verify

# The long run: thousands of examples per check, rules spread over one worker per core (or GPU).
thorough: $(BIN)/.installed
	$(BIN)/dsv4spec verify --profile thorough --jobs $(VERIFY_JOBS) --json thorough.json --markdown thorough.md
	$(BIN)/dsv4spec coverage --profile thorough
	TRITON_INTERPRET=1 $(BIN)/dsv4spec mutate --jobs $(VERIFY_JOBS) --json mutate.json --markdown mutate.md

test: $(BIN)/.installed
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -n $(JOBS) -q tests

spec: $(BIN)/.installed
	$(BIN)/dsv4spec spec --write SPEC.md

clean:
	rm -rf $(VENV) *.egg-info
