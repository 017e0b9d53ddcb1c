# Two commands on a fresh machine: `make run` (set up + smoke run), `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
GPUS   := $(shell nvidia-smi -L 2>/dev/null)
# On a GPU host: one rank per visible GPU with NCCL; elsewhere 2 CPU ranks with gloo.
RUN_ARGS ?= $(if $(GPUS),world_size=auto,device=cpu world_size=2)
ARGS   ?=

.PHONY: setup run test test-repeat lint bench clean torch-wheel

setup: $(VENV)/.installed

# uv downloads, installs and byte-compiles in parallel: about a minute for what pip took three minutes for. It
# installs the torch wheel that pip itself picks (pip's index, find-links and constraints), downloaded by pip. Where
# python3 already has torch (a GPU host), .venv sees its packages so that CUDA build is used as is, and pip installs
# the rest: uv would not look through that path and could fetch another torch. Without uv (its install failed),
# pip does everything.
HOST_TORCH := $(shell python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" 2>/dev/null && echo yes)
# The interpreter .venv is made from on a CPU host: python3, or the distribution's faster build of its version where
# python3 is an unoptimised build (tools/venv_python.py says when). `make PYTHON=...` chooses.
PYTHON  ?= $(shell python3 tools/venv_python.py 2>/dev/null || echo python3)
UV      := $(VENV)/bin/uv
INSTALL := sh -c 'if [ -x "$(UV)" ]; then exec "$(UV)" pip install -q --python "$(PY)" "$$@"; \
	else exec "$(PY)" -m pip install -q "$$@"; fi' install
# uv byte-compiles what `make run` imports at install; the test extras are compiled as the suite imports them
# (`make test` writes bytecode), most of their modules (transformers' models...) never are.
COMPILED := UV_COMPILE_BYTECODE=1
TORCH    := 2.13.0
# The torch wheel pip downloads is kept in one folder per user and Python: found again at the same path, uv's cache
# knows it, and a new clone links its files instead of unpacking ~1 GB again (a folder that cannot be made: .venv's).
WHEELS   := $${XDG_CACHE_HOME:-$$HOME/.cache}/ddp-runner/wheels
# pip's own index serves the CUDA build of torch (2 GB+ of CUDA libraries): on a host without a GPU, PyTorch's CPU
# wheel index is asked first, for TORCH_INDEX_TIMEOUT seconds and no retries, then pip's own configuration
# (tools/torch_wheel.py; `make TORCH_CPU_INDEX= ...`: pip's configuration only). It prints the build it chose.
TORCH_CPU_INDEX     ?= $(if $(GPUS),,https://download.pytorch.org/whl/cpu)
TORCH_INDEX_TIMEOUT ?= 5
TORCH_WHEEL = $(PY) tools/torch_wheel.py $(TORCH) "$$w" --cpu-index "$(TORCH_CPU_INDEX)" --timeout $(TORCH_INDEX_TIMEOUT)

$(VENV)/.installed: pyproject.toml
ifeq ($(HOST_TORCH),yes)
	test -x $(PY) || python3 -m venv --system-site-packages $(VENV)
	@# A GPU image's python3 is often itself a venv, which --system-site-packages does not see through: its
	@# packages are added to .venv's path as they are.
	python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
		> "$$($(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_host_site.pth"
	$(PIP) install -q -e .
else
	test -x $(PY) || { p="$(PYTHON)"; echo "make: .venv from $$p"; "$$p" -m venv $(VENV); }
	test -x $(UV) || $(PIP) install -q uv || echo "uv did not install: pip installs everything (slower)"
	$(PY) -c "import torch" 2>/dev/null || { w="$(WHEELS)/$$($(PY) -c 'import sys; print(sys.implementation.cache_tag)')"; \
		mkdir -p "$$w" 2>/dev/null || w=$(VENV)/wheels; whl=$$($(TORCH_WHEEL)) && \
		$(COMPILED) $(INSTALL) "$$whl" && echo "make: installed $$(basename "$$whl")" && rm -rf $(VENV)/wheels; }
	$(COMPILED) $(INSTALL) -e .
endif
	touch $@

# Triton goes into a folder of its own, which only the test of the fused loss's kernel puts on its path
# (tests/integration/test_fused_ce_triton.py): in site-packages, every process that imports torch._dynamo (each
# launch's torchrun agent, each test worker) would import it too, for nothing on a CPU. Where python3 has it (a
# GPU host's torch), that one is used.
TRITON_DIR := $(VENV)/triton

$(VENV)/.installed-test: $(VENV)/.installed
	$(if $(HOST_TORCH),$(PIP) install -q,$(INSTALL)) -e '.[test]'
	$(PY) -c "import importlib.util as u, sys; sys.exit(u.find_spec('triton') is None)" || \
		$(INSTALL) --target $(TRITON_DIR) 'triton>=3.2'
	touch $@

# The download step alone, into WHEEL_DIR (tests/unit/test_torch_wheel.py drives it with local indexes).
torch-wheel:
	@w="$(WHEEL_DIR)"; $(TORCH_WHEEL)

run: setup
	$(VENV)/bin/ddp-run task=smoke $(RUN_ARGS) $(ARGS)

# Every tier (tests/unit, tests/integration, tests/e2e) at once on TEST_WORKERS xdist workers: the end-to-end
# tests mostly wait on their subprocesses (torchrun, watchdogs, Slurm), so more workers than cores pays off (on 2
# cores, 6: BENCHMARKS.md, "The test suite").
# --dist loadgroup keeps each xdist_group (the one local Slurm) on one worker. `make test TEST_WORKERS=0` runs
# serially; `make test ARGS='-m "not e2e"'` skips the end-to-end tier.
TEST_WORKERS ?= 6

# Bytecode is cached for the suite's hundreds of interpreters (the package, the tests' rewritten modules), even
# where the environment sets PYTHONDONTWRITEBYTECODE.
PYTEST := PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25

test: $(VENV)/.installed-test
	$(PY) -m ruff check runner tasks tests bench examples tools
	$(PYTEST) $(ARGS)

# A flaky test passes once and fails the next time, mostly under load: FILES (a tier's folder or test files) N
# times back to back, with `make test`'s options (the same workers, so the same contention), a line per round. It
# stops at the first failing round, whose output is the last on the screen. `make test-repeat
# FILES=tests/integration/test_termination.py N=10 TEST_WORKERS=0`: one file, serially.
FILES ?= tests/e2e
N     ?= 3

test-repeat: $(VENV)/.installed-test
	@i=1; while [ $$i -le $(N) ]; do \
		t0=$$(date +%s); \
		$(PYTEST) $(ARGS) $(FILES); rc=$$?; \
		took=$$(( $$(date +%s) - t0 )); \
		if [ $$rc -ne 0 ]; then \
			echo "test-repeat: round $$i of $(N) FAILED (pytest exit $$rc) after $$took s: $(FILES)"; exit $$rc; \
		fi; \
		echo "test-repeat: round $$i of $(N) passed in $$took s: $(FILES)"; \
		i=$$((i + 1)); \
	done; echo "test-repeat: all $(N) rounds passed: $(FILES)"

bench: setup
	$(PY) bench/overhead.py
	$(PY) bench/gpt_bench.py

clean:
	rm -rf $(VENV) outputs/2*
