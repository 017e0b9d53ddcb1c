# Two commands on a fresh machine: `make run` (set up + smoke run), `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# On a GPU host: one rank per visible GPU with NCCL; elsewhere 2 CPU ranks with gloo.
RUN_ARGS ?= $(if $(shell nvidia-smi -L 2>/dev/null),world_size=auto,device=cpu world_size=2)
ARGS   ?=

.PHONY: setup run test lint bench clean

setup: $(VENV)/.installed

# Where python3 already has torch (a GPU host), .venv sees its packages so that CUDA build is used as is;
# elsewhere .venv is isolated and gets the CPU wheel (`torch==2.13.0`), installed first so nothing pulls a
# multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $$(python3 -c "import torch" 2>/dev/null && echo --system-site-packages) $(VENV)
	@# A GPU image's python3 is often itself a venv, which --system-site-packages does not see through:
	@# when that python3 has torch, its packages are added to .venv's path as they are.
	if python3 -c "import torch" 2>/dev/null; then python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
		> "$$($(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_host_site.pth"; fi
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install -q -e '.[test]'
	touch $@

run: setup
	$(VENV)/bin/ddp-run task=smoke $(RUN_ARGS) $(ARGS)

# Every tier (tests/unit, tests/integration, tests/e2e) at once on TEST_WORKERS xdist workers: the end-to-end
# tests mostly wait on their subprocesses (torchrun, watchdogs, Slurm), so more workers than cores pays off.
# --dist loadgroup keeps each xdist_group (the one local Slurm) on one worker. `make test TEST_WORKERS=0` runs
# serially; `make test ARGS='-m "not e2e"'` skips the end-to-end tier.
TEST_WORKERS ?= 4

test: $(VENV)/.installed-test
	$(PY) -m ruff check runner tasks tests bench examples
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25 $(ARGS)

bench: setup
	$(PY) bench/overhead.py
	$(PY) bench/gpt_bench.py

clean:
	rm -rf $(VENV) outputs/2*
