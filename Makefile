# The README's commands. Each one sets up everything it needs on a fresh machine.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
# torch is pinned (pyproject.toml accepts any torch>=2.1): an open range would pull a
# multi-GB CUDA build here, and the suite and the benchmarks are measured on 2.13.0.
TORCH   ?= torch==2.13.0
STAMP   := $(VENV)/.installed
# numba-cuda (the version the lent GPU machines run) and NVIDIA's NVVM and NVRTC, apart from
# the venv, whose numba keeps its built-in CUDA target and simulator: the tests compile every
# kernel the simulator ran for a real GPU with them, without one (tests/support/ptx_check.py)
CUDA_COMPILER := numba-cuda==0.30.4 cuda-bindings==13.5.0 cuda-core==1.2.2 cuda-pathfinder==1.9.1 \
                 nvidia-nvvm==13.5.37 nvidia-cuda-nvrtc==13.5.37
COMPILER_STAMP := $(VENV)/cuda-compiler/.installed

.PHONY: setup demo test bench clean images gpu-check

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

# the tests' CUDA compiler, only for them (make demo does not download it)
$(COMPILER_STAMP): $(STAMP) Makefile
	$(BIN)/python -m pip install -q --upgrade --no-deps --target $(VENV)/cuda-compiler $(CUDA_COMPILER)
	touch $(COMPILER_STAMP)

demo: setup
	$(BIN)/gradpress-launch --local --workers 2 --servers 1 -- $(BIN)/python examples/train_digits.py

# Two test processes (pytest-xdist): most tests wait on real jobs of several processes, so
# two of them share the 2 cores well. The kernels every node loads at start are compiled once
# first: in a fresh clone the first jobs' nodes would each compile them (12 s of a core
# apiece) at the same time. From a fresh clone, set-up included: 8:29 to 9:31 in four runs
# (2026-11-27, 1,849 to 1,853 tests); 10:38 to 11:32 in a later session (1,859 and 1,860
# tests) on a host that ran the same benchmark 1.4-2x slower than before; 11:57 and 13:08
# with 1,865 (the simulator tests had just been cut by 71 s of test time: the host's own
# spread is larger than that; the same tree's pytest alone took 9:49 between the two).
test: setup $(COMPILER_STAMP)
	$(BIN)/python -m ruff check .
	$(BIN)/python -c "from gradpress.compressors.warmup import warm_up; warm_up('server'); warm_up('worker')"
	$(BIN)/python -m pytest -q -n 2

bench: setup
	$(BIN)/python benchmarks/pushpull.py
	$(BIN)/python benchmarks/kernels.py --quick

# On a machine with a CUDA GPU (../shared/gpu/README.md: no setup there, the caller's
# PYTHONPATH carries the wheels it lacks): the GPU tests, then the GPU benchmark's quick run.
# Where torch sees no GPU, both say so and measure nothing.
# Each part has a deadline of its own (that machine's image may lack pytest-timeout, so the
# tests' own marks do nothing there), and the benchmark runs even where a test failed: the
# machine is lent for minutes. The exit status is the tests', else the benchmark's. The tests print
# each verdict as it comes (-v): cut at their deadline, they still say which passed.
gpu-check:
	timeout -k 10 270 $(PY) -m pytest -v -p no:cacheprovider -m gpu tests/gpu; tests=$$?; \
	timeout -k 10 300 $(PY) benchmarks/gpu.py --quick && exit $$tests

# The CPU image (deploy/docker/Dockerfile.cpu) with podman or buildah; BASE=IMAGE picks the
# base, else one is made with mmdebstrap. Prints the image's name and size (docs/deploy.md).
images:
	deploy/docker/build.sh $(if $(BASE),--base $(BASE))

clean:
	rm -rf $(VENV) build *.egg-info
