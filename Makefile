# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MODEL ?=
OUT ?= out
TARGET ?= cortex-m4
DEMO := build/demo_int8.tflite

.PHONY: demo test lint bench fuzz gen check plan mcu clean

# pyproject.toml states the ranges; constraints.txt pins the versions tested
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

$(DEMO): $(STAMP) $(wildcard toolchain/*.py toolchain/*/*.py toolchain/*/*/*.py)
	@mkdir -p build
	$(BIN)/python -m toolchain.front.examples residual_cnn_int8 $(DEMO)

demo: $(DEMO)
	$(BIN)/arenac inspect $(DEMO)
	$(BIN)/arenac plan $(DEMO) --svg build/demo_plan.svg
	@echo "memory map written to build/demo_plan.svg"
	$(BIN)/arenac gen $(DEMO) -o build/demo_c --name demo
	$(BIN)/arenac check $(DEMO) --inputs 3

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# The suite starts the CLI in a few hundred fresh processes: each imports arenac's modules from
# the bytecode the first one caches instead of compiling them again (about 0.2 s a process),
# also where the environment turns that cache off.
test: lint
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest

plan: $(STAMP)
	$(BIN)/arenac plan $(MODEL)

gen: $(STAMP)
	$(BIN)/arenac gen $(MODEL) -o $(OUT)

check: $(STAMP)
	$(BIN)/arenac check $(MODEL)

# The generated C for TARGET (default cortex-m4: QEMU mps2-an386) against runtime_py under QEMU,
# its footprint, and its instructions per inference.
mcu: $(STAMP)
	$(BIN)/arenac check $(MODEL) --target $(TARGET) --backends runtime_py,qemu --inputs 1
	$(BIN)/python -m toolchain.lab.footprint $(MODEL) --kernels --target $(TARGET)
	$(BIN)/arenac bench $(MODEL) --target $(TARGET)

bench: $(STAMP)
	$(BIN)/python -m tests.bench

# A long fuzzing campaign over mutated models: every finding becomes a reproducer in build/fuzz/.
N ?= 1000
FILES ?= 200
fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz --examples $(N) --files $(FILES) --out build/fuzz

clean:
	rm -rf build out .pytest_cache .ruff_cache
