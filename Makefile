# The two commands of the README. Each creates .venv when missing and installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo
OPENCL := $(VENV)/.opencl
NAT := $(VENV)/.nat
# The suite runs on TEST_WORKERS processes (pytest-xdist), a test file to a worker (module
# fixtures start their servers once). Most tests wait on servers, subprocesses and links
# rather than compute: on this project's 2-core CI machine tests/remote took 349 s on one
# worker, 232 s on 2 and 205 s on 3. `make test TEST_WORKERS=0` runs it in one process.
TEST_WORKERS ?= 3
PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

.PHONY: demo test compose-test lint format bench clean gpu-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# cuda-check (CuPy + NVRTC + CUDA headers) installs on any machine: without a GPU the
# offline CUDA checks compile every generated kernel with NVRTC, and the CUDA tests skip.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,bench,cuda-check]'
	touch $(STAMP)

# PoCL + PyOpenCL so the OpenCL backend runs its tests on the CPU (CI runs as root on Debian).
$(OPENCL): $(STAMP) .ci/opencl.sh
	sh .ci/opencl.sh $(BIN)/python && touch $(OPENCL) || echo "opencl: not set up (reason above); OpenCL tests will skip"

# nft (else iptables) for the NAT namespace test; installed from Debian when missing (root).
$(NAT): .ci/nat.sh | $(BIN)/python
	sh .ci/nat.sh && touch $(NAT) || echo "nat: not set up (reason above); the NAT test will skip"

# The demo needs only the core and the `demo` extra (no PyTorch, no CuPy): a fresh .venv
# made by `make demo` stays small (364 MB measured; --no-compile: Python compiles only the
# modules the demo imports, not all of SciPy's); `make test` later adds the test stack to it.
$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --no-compile -e '.[demo]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python examples/demo.py

test: $(STAMP) $(OPENCL) $(NAT)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python .ci/typecheck.py
	$(BIN)/python -m pytest -q $(PARALLEL)
	# Once more on stock aioquic (its performance overrides off, protocol/transport/_quic_fast.py):
	# the transport and security suites, less their qh3 cases (stock mode changes only aioquic).
	BURN_REMOTE_AIOQUIC_STOCK=1 $(BIN)/python -m pytest -q -p no:cacheprovider $(PARALLEL) \
		-k "not qh3" tests/transport tests/security

# The multi-node suite in docker-compose, with faults made from the host; needs root, no
# registry (see deploy/compose/run.py). Installs Docker and debootstrap from Debian if missing.
compose-test: $(BIN)/python
	$(BIN)/python deploy/compose/run.py

lint: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: $(STAMP)
	$(BIN)/python bench/ops.py

# On a machine with an NVIDIA GPU: the offline checks, then the CUDA suite on cuda:0 (ops,
# gradients, training, serve + client, a LoRA job, linalg/signal), then bench/gpu.py's table.
# Without a GPU it runs the offline checks, says that it needs one and exits non-zero.
gpu-check: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[cuda,onnx]'
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_cuda_offline.py tests/test_cuda_sim.py \
		tests/test_cuda_sim_suites.py
	@$(BIN)/python bench/gpu.py --need-gpu || { \
		echo "make gpu-check: the offline CUDA checks passed; the rest needs a CUDA GPU."; exit 2; }
	BURN_REMOTE_REQUIRE_CUDA=1 timeout 240 $(BIN)/python -m pytest -q -p no:cacheprovider \
		-o addopts="" --timeout 120 -k "cuda or gpu" -m "not netns" \
		tests/test_cuda_gpu.py tests/test_memory_cupy.py tests/test_gpu_backends.py \
		tests/test_ops_forward.py tests/test_ops_forward_nn.py tests/test_ops_forward_shape.py \
		tests/test_ops_grad.py tests/test_dtypes.py tests/test_indexing.py tests/collective/test_nccl.py
	timeout 170 $(BIN)/python bench/gpu.py --steps 20 --budget 150

clean:
	rm -rf $(VENV) build *.egg-info
