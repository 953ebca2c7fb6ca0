# The two commands of the README.  Each builds its own virtual environment on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch: where no NVIDIA GPU is present, the CPU build from TORCH_INDEX (PyTorch's CPU index), so
# that pip does not fetch the multi-GB CUDA build; a GPU machine gets pip's default (CUDA) build.
# A machine with a local wheel directory (PIP_FIND_LINKS, as an offline mirror sets) keeps pip's own
# configuration.  Override either: make test TORCH_INDEX=https://download.pytorch.org/whl/cu130
TORCH ?= torch==2.13.0
HAVE_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
TORCH_INDEX ?= $(if $(HAVE_GPU)$(PIP_FIND_LINKS),,https://download.pytorch.org/whl/cpu)
# Triton is the kernels' extra (pinned to the GPU's); every other rule runs without it.
TRITON ?= triton==3.6.0
DEPS := $(TRITON) numpy ml_dtypes "hypothesis>=6.170,<7" pytest pytest-xdist safetensors matplotlib jsonschema
# The exact versions CI ran with (empty: the newest that pyproject.toml and DEPS admit)
CONSTRAINTS ?= constraints.txt
PIN := $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
JOBS ?= auto
VERIFY_JOBS ?= $(shell nproc)

.PHONY: verify thorough test spec clean

$(BIN)/.installed: pyproject.toml Makefile $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools
	$(BIN)/pip install --quiet $(PIN) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) $(TORCH)
	$(BIN)/pip install --quiet $(PIN) $(DEPS)
	$(BIN)/pip install --quiet --no-build-isolation --no-deps -e .
	touch $@

verify: $(BIN)/.installed
	$(BIN)/dsv4spec verify

# The long run: thousands of examples per check, rules spread over one worker per core (or GPU).
thorough: $(BIN)/.installed
	$(BIN)/dsv4spec verify --profile thorough --jobs $(VERIFY_JOBS) --json thorough.json --markdown thorough.md
	$(BIN)/dsv4spec coverage --profile thorough
	TRITON_INTERPRET=1 $(BIN)/dsv4spec mutate --jobs $(VERIFY_JOBS) --json mutate.json --markdown mutate.md
	OMP_NUM_THREADS=1 TRITON_INTERPRET=1 $(BIN)/python -m pytest -n $(JOBS) --dist worksteal -q -m thorough tests

# One torch thread a worker: pytest-xdist already runs a worker per core, and torch's own threads on
# top of them cost a third more CPU time on small tensors (no result depends on the thread count).
test: $(BIN)/.installed
	OMP_NUM_THREADS=1 TRITON_INTERPRET=1 $(BIN)/python -m pytest -n $(JOBS) --dist worksteal -q tests

spec: $(BIN)/.installed
	$(BIN)/dsv4spec spec --write SPEC.md

clean:
	rm -rf $(VENV) *.egg-info
