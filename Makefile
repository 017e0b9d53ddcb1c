# Two commands on a fresh machine: `make run` (set up + smoke run), `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# On a GPU host: one rank per visible GPU with NCCL; elsewhere 2 CPU ranks with gloo.
RUN_ARGS ?= $(if $(shell nvidia-smi -L 2>/dev/null),world_size=auto,device=cpu world_size=2)
ARGS   ?=

.PHONY: setup run test lint bench clean

setup: $(VENV)/.installed

# uv downloads, installs and byte-compiles in parallel: about a minute for what pip took three minutes for. It
# installs the torch wheel that pip itself picks (pip's index, find-links and constraints), downloaded by pip. Where
# python3 already has torch (a GPU host), .venv sees its packages so that CUDA build is used as is, and pip installs
# the rest: uv would not look through that path and could fetch another torch. Without uv (its install failed),
# pip does everything.
HOST_TORCH := $(shell python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" 2>/dev/null && echo yes)
UV      := $(VENV)/bin/uv
INSTALL := sh -c 'if [ -x "$(UV)" ]; then exec "$(UV)" pip install -q --python "$(PY)" "$$@"; \
	else exec "$(PY)" -m pip install -q "$$@"; fi' install
# uv byte-compiles what `make run` imports at install; the test extras are compiled as the suite imports them
# (`make test` writes bytecode), most of their modules (transformers' models...) never are.
COMPILED := UV_COMPILE_BYTECODE=1

$(VENV)/.installed: pyproject.toml
ifeq ($(HOST_TORCH),yes)
	test -x $(PY) || python3 -m venv --system-site-packages $(VENV)
	@# A GPU image's python3 is often itself a venv, which --system-site-packages does not see through: its
	@# packages are added to .venv's path as they are.
	python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
		> "$$($(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_host_site.pth"
	$(PIP) install -q -e .
else
	test -x $(PY) || python3 -m venv $(VENV)
	test -x $(UV) || $(PIP) install -q uv || echo "uv did not install: pip installs everything (slower)"
	$(PY) -c "import torch" 2>/dev/null || { rm -rf $(VENV)/wheels && $(PIP) download -q --no-deps -d $(VENV)/wheels \
		torch==2.13.0 && $(COMPILED) $(INSTALL) $(VENV)/wheels/torch-*.whl && rm -rf $(VENV)/wheels; }
	$(COMPILED) $(INSTALL) -e .
endif
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(if $(HOST_TORCH),$(PIP) install -q,$(INSTALL)) -e '.[test]'
	touch $@

run: setup
	$(VENV)/bin/ddp-run task=smoke $(RUN_ARGS) $(ARGS)

# Every tier (tests/unit, tests/integration, tests/e2e) at once on TEST_WORKERS xdist workers: the end-to-end
# tests mostly wait on their subprocesses (torchrun, watchdogs, Slurm), so more workers than cores pays off (on 2
# cores, 4: 5 ran slower).
# --dist loadgroup keeps each xdist_group (the one local Slurm) on one worker. `make test TEST_WORKERS=0` runs
# serially; `make test ARGS='-m "not e2e"'` skips the end-to-end tier.
TEST_WORKERS ?= 4

# Bytecode is cached for the suite's hundreds of interpreters (the package, the tests' rewritten modules), even
# where the environment sets PYTHONDONTWRITEBYTECODE.
test: $(VENV)/.installed-test
	$(PY) -m ruff check runner tasks tests bench examples
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25 $(ARGS)

bench: setup
	$(PY) bench/overhead.py
	$(PY) bench/gpt_bench.py

clean:
	rm -rf $(VENV) outputs/2*
