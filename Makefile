# tiermem: every entry point. `make help` lists the targets.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.deps-stamp
TORCH_STAMP := $(VENV)/.torch-stamp
TORCH_VERSION := 2.14.1
FBGEMM_VERSION := 1.9.0

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "maturin>=1.7,<2" "numpy>=1.26" "rich>=13" "pytest>=8" "pytest-timeout>=2.3" "pytest-xdist==3.8.*" "hypothesis>=6.100" "matplotlib>=3.8" \
		"ruff==0.17.*" "mypy==2.4.*" "import-linter==2.16.*" "highspy==1.15.1" "pdoc==16.0.*"
	# KaHyPar: the reference partitioner `bench ssd` compares SHP's layouts with, when it installs.
	$(PIP) install -q "kahypar==1.3.7" || echo "kahypar did not install: bench ssd reports no reference partition"
	touch $@

# torch and its CUDA libraries take about 6 GiB in the venv, the Rust build 2 more: check
# the room first, so a full disk is said in plain words rather than as pip's OSError.
MIN_FREE_GIB := 9

$(TORCH_STAMP): $(STAMP)
	@avail=$$(df -Pk $(VENV) | awk 'NR == 2 {print $$4}'); \
	if [ "$$avail" -lt $$(( $(MIN_FREE_GIB) * 1024 * 1024 )) ]; then \
		echo "make: $(VENV) is on a disk with $$(( avail / 1024 / 1024 )) GiB free; installing torch and building need about $(MIN_FREE_GIB) GiB: free some space and run make again" >&2; \
		exit 1; \
	fi
	# The PyPI wheel runs on the CPU; its CUDA libraries must be present for it to import.
	# fbgemm-gpu-cpu pairs with this torch: the peer `bench embedding` compares against.
	$(PIP) install -q "torch==$(TORCH_VERSION)" "fbgemm-gpu-cpu==$(FBGEMM_VERSION)"
	# TorchRec (KeyedJaggedTensor inputs to the sharded tables): its wheel asks for the CUDA
	# fbgemm-gpu, whose module fbgemm-gpu-cpu provides, so it and its pure-Python needs go
	# in without dependencies, pinned.
	$(PIP) install -q --no-deps "torchrec==1.9.2" "tensordict==0.15.3" "torchmetrics==1.0.3" "pyre-extensions==0.0.32" \
		"typing-inspect==0.9.0" "lightning-utilities==0.15.3" "pyvers==0.2.3" "orjson==3.13.0" "cloudpickle==3.1.2" \
		"importlib_metadata==10.2.0" "zipp" "tqdm" \
		|| echo "torchrec did not install: the sharded tables take plain values/offsets only"
	# Real model definitions the tiered-tensor tests build from small configs (no weights
	# are downloaded): torchvision pairs with this torch (no dependencies, so torch stays).
	$(PIP) install -q --no-deps "torchvision==0.29.1"
	$(PIP) install -q "transformers==5.23.0" "expecttest==0.3.0"
	touch $@

.PHONY: venv
venv: $(STAMP) ## create .venv with the build and test dependencies

.PHONY: build
build: $(STAMP) ## build the extension in release mode into .venv
	$(VENV)/bin/maturin develop --release -q

.PHONY: build-dev
build-dev: $(STAMP) ## build the extension in debug mode into .venv
	$(VENV)/bin/maturin develop -q

.PHONY: docs
docs: build $(TORCH_STAMP) ## the API reference from the docstrings into docs/api/ (pdoc; any warning or broken reference fails it)
	$(PY) scripts/docs.py

.PHONY: test-rs
test-rs: ## Rust tests of the core, the embedding, the HPC and the C API crates (unit, property, stress, bad input, kernels against references on every ISA, doc)
	cargo test --profile rtest -p tiermem-core -p tiermem-embed -p tiermem-hpc -p tiermem-capi

.PHONY: capi
capi: ## the C library: target/release/libtiermem.so and libtiermem.a (header: crates/tiermem-capi/include/tiermem.h)
	cargo build --release -p tiermem-capi

.PHONY: capi-header
capi-header: ## regenerate crates/tiermem-capi/include/tiermem.h from the C API's declarations
	cargo build --release -p tiermem-capi
	cp "$$(ls -t target/release/build/tiermem-capi-*/out/tiermem.h | head -1)" crates/tiermem-capi/include/tiermem.h

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
.PHONY: sysdeps
sysdeps: ## system packages the C and Fortran tests need (gfortran, pkg-config, cmake, valgrind), installed with apt when missing
	@command -v gfortran >/dev/null && command -v pkg-config >/dev/null && command -v cmake >/dev/null \
		&& command -v valgrind >/dev/null || \
		{ $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q gfortran pkg-config cmake valgrind; }

PREFIX ?= /usr/local
.PHONY: install
install: capi ## install the C library, tiermem.h, h2m.h, tiermem.f90, tiermem.pc and the CMake package under PREFIX (default /usr/local)
	install -d $(PREFIX)/lib $(PREFIX)/include $(PREFIX)/lib/pkgconfig
	install -m 644 target/release/libtiermem.a $(PREFIX)/lib/
	install -m 755 target/release/libtiermem.so $(PREFIX)/lib/
	install -m 644 crates/tiermem-capi/include/tiermem.h crates/tiermem-capi/include/h2m.h crates/tiermem-capi/fortran/tiermem.f90 crates/tiermem-capi/fortran/h2m.f90 $(PREFIX)/include/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|'"$$(grep -m1 '^version' Cargo.toml | cut -d'"' -f2)"'|' \
		crates/tiermem-capi/tiermem.pc.in > $(PREFIX)/lib/pkgconfig/tiermem.pc
	install -d $(PREFIX)/lib/cmake/tiermem
	install -m 644 crates/tiermem-capi/cmake/tiermemConfig.cmake $(PREFIX)/lib/cmake/tiermem/
	sed -e 's|@VERSION@|'"$$(grep -m1 '^version' Cargo.toml | cut -d'"' -f2)"'|' \
		crates/tiermem-capi/cmake/tiermemConfigVersion.cmake.in > $(PREFIX)/lib/cmake/tiermem/tiermemConfigVersion.cmake

.PHONY: test-py
# Python tests in worker processes, one per core up to four (pytest-xdist; idle workers take
# queued tests from busy ones), and names the 15 slowest. PYTEST_WORKERS=0 runs them in this process.
PYTEST_WORKERS ?= auto
test-py: build capi sysdeps $(TORCH_STAMP) ## Python tests (the C and Fortran examples too), in a worker process per core (at most four)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --maxprocesses 4 --dist worksteal --durations=15

.PHONY: stress
stress: build $(TORCH_STAMP) ## tiermem stress for STRESS_SECONDS (default 600) on 4 threads
	mkdir -p results
	$(VENV)/bin/tiermem stress --seconds $${STRESS_SECONDS:-600} --threads 4 --json results/stress.json

.PHONY: stress-ci
stress-ci: build $(TORCH_STAMP) ## tiermem stress for 60 s on 4 threads (part of make test)
	$(VENV)/bin/tiermem stress --seconds 60 --threads 4

.PHONY: wheel-check
# After `build`: two maturin runs at once share target/maturin and break each other.
wheel-check: build $(TORCH_STAMP) ## build the abi3 wheel, install it in a fresh venv without Rust on PATH, run the README examples from it
	scripts/check_wheel.sh $(VENV)

.PHONY: test
# The Rust tests' build (the cores) runs beside the Python environment's install (mostly the
# disk), and the Python lints, the wheel's check and the minute of stress run together: none
# needs another's output (the stress runs with the cores busy, as it should pass).
test: ## everything CI runs: lint, Rust tests, the wheel, a minute of stress, the API reference, Python tests (pytest closes the run)
	$(MAKE) lint-rs
	$(MAKE) -j2 --output-sync=target test-rs $(TORCH_STAMP)
	$(MAKE) -j3 --output-sync=target lint-py wheel-check stress-ci
	$(MAKE) docs
	$(MAKE) test-py

.PHONY: demo
demo: build $(TORCH_STAMP) ## show the devices, `tiermem demo` (DLRM in every mode, tables 4x the fast budget), a small ResNet trained with tiered tensors at 8:1 (results/demo/)
	mkdir -p results
	$(VENV)/bin/tiermem info
	$(VENV)/bin/tiermem demo --out results/demo --json results/demo.json
	$(VENV)/bin/tiermem bench tensors --quick --model resnet --ratio 8:1 --iters 3 --rounds 2 --stat median --out results/demo/train --json results/demo/train.json

.PHONY: bench-quick
bench-quick: build $(TORCH_STAMP) ## quick copy, embedding, tiered-tensor, dispatch, staging, traits and criteo benchmarks with JSON and plots into results/
	mkdir -p results
	$(VENV)/bin/tiermem bench copy --quick --json results/bench-copy.json --plot results/bench-copy.png
	$(VENV)/bin/tiermem bench embedding --quick --json results/bench-embedding.json --plot results/bench-embedding.png
	$(VENV)/bin/tiermem bench tensors --quick --json results/bench-train.json --out results/bench-train
	$(VENV)/bin/tiermem bench dispatch --quick --json results/bench-dispatch.json
	$(VENV)/bin/tiermem bench staging --quick --json results/bench-staging.json --plot results/bench-staging.png
	$(VENV)/bin/tiermem bench traits --quick --json results/bench-traits.json --plot results/bench-traits.png
	$(VENV)/bin/tiermem bench criteo --quick --json results/bench-criteo.json

.PHONY: bench-tools
bench-tools: ## install fio from Debian: `bench ssd` then reports its random-read rate on the same file beside its own
	command -v fio >/dev/null || { command -v apt-get >/dev/null && $$(command -v sudo || true) apt-get install -y --no-install-recommends fio; } \
		|| { echo "fio is not installed and apt-get could not install it: the benches report no fio figure"; exit 1; }

.PHONY: fuzz
fuzz: build $(TORCH_STAMP) ## run each fuzz target for FUZZ_SECONDS (default 600): the Rust ones (cargo-fuzz, installed; stable toolchain, RUSTC_BOOTSTRAP) and the checkpoint files' (atheris)
	command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
	cd fuzz && for t in heap_ops manager_ops bags criteo_lines table_file; do \
		RUSTC_BOOTSTRAP=1 cargo fuzz run -O $$t -- -max_total_time=$${FUZZ_SECONDS:-600} || exit 1; done; rm -rf target/scratch-*
	$(PIP) install -q "atheris==3.0.0"
	mkdir -p fuzz/corpus/checkpoint_manifests fuzz/artifacts
	$(PY) fuzz/python/checkpoint_manifests.py fuzz/corpus/checkpoint_manifests -max_total_time=$${FUZZ_SECONDS:-600} -artifact_prefix=fuzz/artifacts/

.PHONY: lint
lint: lint-rs lint-py ## every static check: Rust and Python

.PHONY: lint-rs
lint-rs: ## rustfmt, clippy (warnings are errors), the core's floors and the crates' boundaries
	cargo fmt --all -- --check
	cargo clippy --workspace --release --all-targets -- -D warnings
	python3 scripts/check_layers.py

.PHONY: lint-py
lint-py: build $(TORCH_STAMP) ## ruff (lint and format), mypy, import-linter's contracts, stubtest of the built module
	$(VENV)/bin/ruff check python tests examples
	$(VENV)/bin/ruff format --check python tests examples
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) -m mypy.stubtest --ignore-disjoint-bases tiermem._tiermem

.PHONY: clean
clean: ## remove build outputs and the virtual environment
	cargo clean
	rm -rf $(VENV) .pytest_cache results
