"""The package as a new user gets it: a built wheel installed into a fresh venv outside the checkout, used from an
empty directory that holds a stray ``tasks.py`` and ``runner.py``: the smoke task, a task of the user's own
(the examples/ classifier) with a checkpoint and a resume, the GPT task on text tokenized with ddp-tokenize, and a
user project with its own ``tasks``, ``runner`` and ``conf`` packages (the wheel installs only ``ddp_runner``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.shared_runs import shared_run

ROOT = Path(__file__).resolve().parents[2]


def _run(cmd: list[str], cwd: Path, timeout: float = 600, check: bool = True,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # A clean environment: nothing from the checkout may leak in through PYTHONPATH.
    full = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**full, **(env or {})})
    if check:
        assert r.returncode == 0, f"{cmd} -> {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="session")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the project's wheel installed, over the torch (and the rest of what the wheel requires)
    this suite runs on: built once per session, by the first xdist worker that needs it (the others wait for it
    and use the same)."""
    return shared_run(tmp_path_factory, "install-venv", _make_venv)


def _requirements(wheel: Path) -> list[str]:
    """The wheel's own ``Requires-Dist`` lines, as pip reads them from its METADATA."""
    import email
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        [meta] = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(z.read(meta)).get_all("Requires-Dist") or []


def _closure(requirements: list[str]) -> list:
    """The distributions of this suite's environment that ``requirements`` resolve to on this platform, and those
    they require (recursively, with the extras asked for): what pip would install for them. Each must meet the
    version its requirer asks for (as pip's resolver would insist)."""
    import importlib.metadata as md

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found, seen, todo = {}, set(), [Requirement(r) for r in requirements]
    todo = [r for r in todo if r.marker is None or r.marker.evaluate({"extra": ""})]  # not the wheel's extras
    while todo:
        req = todo.pop()
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError as exc:
            raise AssertionError(f"{req} (required by the wheel's closure) is not in this suite's environment") from exc
        assert req.specifier.contains(dist.version, prereleases=True), f"{req}: this suite has {dist.version}"
        name = canonicalize_name(dist.metadata["Name"])
        if (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        found[name] = dist
        for line in dist.requires or []:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in ("", *req.extras)):
                todo.append(sub)
    return list(found.values())


def _share_requirements(env: Path, base: Path, wheel: Path) -> None:
    """Make what the wheel requires importable in ``env`` from this suite's environment, as `make setup` does for
    torch on a GPU host whose python3 has it (a path line in a .pth file): a folder of links to the files of exactly
    the distributions the wheel's own requirements resolve to (:func:`_closure`), so that a module the package
    imports but does not declare is still missing there. (pip resolving them against the index and unpacking
    tensorboard, matplotlib, tokenizers, … into the venv cost ~11 CPU-seconds; torch's ~750 MB far more.)"""
    import importlib.metadata as md

    from packaging.utils import canonicalize_name

    purelib = Path(_run([str(env / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        cwd=base).stdout.strip())
    own = {canonicalize_name(p.name.split("-")[0]) for p in purelib.glob("*.dist-info")}
    closure = [d for d in _closure(_requirements(wheel)) if canonicalize_name(d.metadata["Name"]) not in own]
    names = {canonicalize_name(d.metadata["Name"]) for d in closure}

    def entries(dist, depth: int, strict: bool = True) -> set[str]:
        if dist.files is None:  # no RECORD (a distribution's package, .egg-info): its top_level.txt and metadata
            meta = getattr(dist, "_path", None)
            assert meta is not None or not strict, f"{dist.metadata['Name']}: neither its files nor its metadata"
            return {*(dist.read_text("top_level.txt") or "").split(), *([meta.name] if meta else [])}
        return {"/".join(Path(str(f)).parts[:depth]) for f in dist.files
                if not str(f).startswith("..") and len(Path(str(f)).parts) > depth - 1}

    # A top-level folder that distributions outside the closure also install into (a namespace package: google/)
    # is made here, holding links to the closure's own entries only.
    outside = set().union(*(entries(d, 1, strict=False) for d in md.distributions()
                            if canonicalize_name(d.metadata["Name"]) not in names))
    shared = base / "suite-site"
    shared.mkdir()
    for dist in closure:
        for top in entries(dist, 1) - {"__pycache__"}:
            if top.endswith(".pth"):
                continue
            if top in outside and Path(dist.locate_file(top)).is_dir():
                (shared / top).mkdir(exist_ok=True)
                links = {e for e in entries(dist, 2) if e.startswith(top + "/")} - {top + "/__pycache__"}
            else:
                links = {top}
            for rel in links:  # a folder two distributions of the closure install into: linked once
                if not (shared / rel).is_symlink():
                    (shared / rel).symlink_to(Path(dist.locate_file(rel)))
    (purelib / "_suite_site.pth").write_text(f"{shared}\n")


def _make_venv(base: Path) -> Path:
    base.mkdir(parents=True, exist_ok=True)
    dist = base / "dist"
    # From a copy of the sources: a checkout's own build/ may hold an older layout's modules, which setuptools
    # would put in the wheel beside the new ones.
    src = base / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "outputs", "site", ".whl", ".before", "*.egg-info", "__pycache__", ".*_cache",
        ".hypothesis"))
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
          str(src)], cwd=base)
    wheels = list(dist.glob("ddp_runner-*.whl"))
    assert len(wheels) == 1, wheels
    env = base / "venv"
    # Without a pip of its own: ensurepip would install (and byte-compile) one for ~5 CPU-seconds; this suite's pip
    # installs into it instead (--python), as the venv's own would.
    _run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(env)], cwd=base)
    # What the wheel requires, from this suite's environment (the CPU torch here, so nothing pulls a CUDA build):
    # the venv's interpreter must find torch's package and its metadata (importing it is proven by every run
    # below), and every version the wheel's requirements ask for must be met (_closure, as pip's resolver would
    # insist). --no-deps: they are there; --no-compile: pip would byte-compile every module it installs.
    _share_requirements(env, base, wheels[0])
    _run([str(env / "bin/python"), "-c", "import importlib.metadata as m, importlib.util as u; "
          "assert u.find_spec('torch'), 'torch not found'; print(m.version('torch'))"], cwd=base)
    _run([sys.executable, "-m", "pip", "--python", str(env / "bin/python"), "install", "-q", "--no-compile",
          "--no-deps", str(wheels[0])], cwd=base)
    return env


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """An empty directory with files that would shadow the package if the workers imported from here."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "tasks.py").write_text("raise SystemExit('the stray tasks.py was imported')\n")
    (work / "runner.py").write_text("raise SystemExit('the stray runner.py was imported')\n")
    return work


def test_version_and_help_from_anywhere(venv: Path, workdir: Path) -> None:
    r = _run([str(venv / "bin/ddp-run"), "--version"], cwd=workdir)
    assert r.stdout.strip() == "ddp-run 0.1.0"
    for tool in ("ddp-tokenize", "ddp-compare", "ddp-doctor", "ddp-runs", "ddp-export"):
        assert _run([str(venv / "bin" / tool), "--help"], cwd=workdir).stdout.startswith("usage:"), tool
    r = _run([str(venv / "bin/ddp-run"), "--help"], cwd=workdir)
    for group in ("task:", "data:", "launcher:", "smoke", "gpt2_small"):
        assert group in r.stdout


def test_smoke_run_from_a_directory_with_stray_modules(venv: Path, workdir: Path) -> None:
    r = _run([str(venv / "bin/ddp-run"), "task=smoke", "device=cpu", "world_size=2", "output.root=out"], cwd=workdir)
    assert "completed: 8 steps, 2 ranks on distinct devices" in r.stdout
    run = Path(r.stdout.strip().splitlines()[-1])
    manifest = json.loads((workdir / run / "run.json").read_text())
    assert manifest["status"] == "completed"
    assert manifest["versions"]["ddp_runner"] == "0.1.0"
    assert manifest["git"] is None  # installed, not a checkout
    assert manifest["doctor"]["status"] == "ok"  # the preflight checks that cost nothing, every run
    assert manifest["invocation"]["task_preset"] == "smoke"
    assert manifest["invocation"]["overrides"] == ["task=smoke", "device=cpu", "world_size=2", "output.root=out"]
    assert str(venv) in manifest["command"][0]  # the venv's own python runs torchrun and the workers


def test_own_task_from_outside_the_checkout_with_checkpoint_and_resume(venv: Path, workdir: Path) -> None:
    shutil.copytree(ROOT / "examples" / "image_classifier", workdir, dirs_exist_ok=True)
    ddp_run = str(venv / "bin/ddp-run")
    args = ["--config-dir", "conf", "task=tiny_cnn", "device=cpu", "world_size=2", "output.root=out"]
    # Killed after step 10 (a checkpoint exists at step 8), then continued in place.
    first = _run([ddp_run, *args, "fault.kind=sigkill", "fault.rank=1", "fault.step=10"], cwd=workdir, check=False)
    assert first.returncode != 0
    run = workdir / "out" / sorted(p.relative_to(workdir / "out") for p in (workdir / "out").glob("*/*"))[0]
    assert (run / "checkpoints" / "step_8" / "meta.json").exists()
    again = _run([ddp_run, f"resume={run}"], cwd=workdir)
    assert "resumed from" in (run / "logs" / "rank0.log").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 32, again.stdout[-2000:]
    assert summary["final"]["train/loss"] < 1.0  # it learned the quadrants (chance: ln 4 = 1.39)
    assert summary["metrics"]["val/accuracy"] > 0.9  # the task's extra metric (chance: 0.25)
    # (The module named on the shell alone, from the wheel: test_a_user_project_with_its_own_tasks_runner_and_conf_…)


def test_gpt_on_text_tokenized_with_ddp_tokenize(venv: Path, workdir: Path) -> None:
    text = workdir / "corpus"
    text.mkdir()
    for i, src in enumerate(sorted((Path(os.__file__).parent / "json").glob("*.py"))):
        shutil.copy(src, text / f"doc{i}.txt")
    _run([str(venv / "bin/ddp-tokenize"), str(text), "--out", "tok", "--vocab-size", "512"], cwd=workdir)
    meta = json.loads((workdir / "tok" / "meta.json").read_text())
    assert meta["vocab_size"] <= 512
    # One rank: nothing here depends on two (they are: test_smoke_run_from_a_directory_with_stray_modules, the
    # own task's kill and resume, the user project's packages on every rank).
    # Saved in the step (not in the background): the SIGKILL two steps later must find step_6 committed, also on a
    # loaded machine (CI once killed it mid-write: no complete checkpoint, the resume refused).
    common = ["task=gpt", "device=cpu", "world_size=1", "data.path=tok/train.bin", "data.val_path=tok/val.bin",
              "train.max_steps=12", "checkpoint.every_steps=6", "checkpoint.async_save=false"]
    small = _run([str(venv / "bin/ddp-run"), *common, "task.model.vocab=256", "output.root=out"], cwd=workdir,
                 check=False)
    assert small.returncode == 2 and "task.model.vocab" in small.stderr
    assert not (workdir / "out").exists()
    first = _run([str(venv / "bin/ddp-run"), *common, "task.model.vocab=512", "output.root=out", "fault.kind=sigkill",
                  "fault.rank=0", "fault.step=8"], cwd=workdir, check=False)
    assert first.returncode != 0
    run = next((workdir / "out").glob("*/*"))
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["data"]["path"].endswith("tok/train.bin")
    _run([str(venv / "bin/ddp-run"), f"resume={run}"], cwd=workdir)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 12
    assert summary["resumed_from"].endswith("step_6")


# A user project whose own packages carry the names of the checkout's folders: tasks/ and conf/ in the working
# directory, runner/ on PYTHONPATH. Its task imports all three (and would fail on the product's packages).
_USER_PROJECT = {
    "tasks/__init__.py": '# The user\'s own tasks package (common in ML repositories).\nOWNER = "user"\n',
    "tasks/mydata.py": (
        "import torch\n"
        "from torch.utils.data import TensorDataset\n\n\n"
        "def make(n: int, seed: int) -> TensorDataset:\n"
        "    g = torch.Generator().manual_seed(seed)\n"
        "    x = torch.randn(n, 4, generator=g)\n"
        "    return TensorDataset(x, x.sum(dim=1, keepdim=True))\n"),
    "conf/__init__.py": 'OWNER = "user"\n',
    "conf/settings.py": "WIDTH = 4\n",
    "lib/runner/__init__.py": 'OWNER = "user"\n',
    "lib/runner/hooks.py": "def describe() -> str:\n    return 'the user runner'\n",
    "mytask.py": (
        "import torch\n"
        "from conf.settings import WIDTH\n"
        "from ddp_runner.tasks.api import TaskParts\n"
        "from runner.hooks import describe\n"
        "from tasks.mydata import make\n\n\n"
        "class Regression(torch.nn.Module):\n"
        "    def __init__(self) -> None:\n"
        "        super().__init__()\n"
        "        self.lin = torch.nn.Linear(WIDTH, 1)\n\n"
        "    def forward(self, x, y):\n"
        "        return torch.nn.functional.mse_loss(self.lin(x), y)\n\n\n"
        "def build(cfg, device):\n"
        "    import conf, runner, tasks, tasks.mydata\n"
        "    where = [m.__file__ for m in (tasks, tasks.mydata, runner, conf)]\n"
        "    print('user packages:', describe(), *where, flush=True)\n"
        "    return TaskParts(model=Regression(), train_set=make(64, 1), val_set=make(16, 2))\n"),
}


def test_a_user_project_with_its_own_tasks_runner_and_conf_packages(venv: Path, tmp_path: Path) -> None:
    """The wheel installs one top-level package: a user's own ``tasks`` (the working directory), ``conf`` (there
    too) and ``runner`` (on PYTHONPATH) import as theirs in the driver's checks and on every rank."""
    work = tmp_path / "project"
    for rel, text in _USER_PROJECT.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    [record] = (venv / "lib").glob("python*/site-packages/ddp_runner-*.dist-info/RECORD")
    top = {line.split("/")[0] for line in record.read_text().splitlines() if line and not line.startswith("..")}
    # One top-level import package of its own; besides it only Hydra's plugin namespace (``hydra_plugins``, a
    # namespace package every Hydra plugin shares: no __init__.py of ours at its top), holding our search sweeper.
    assert {t for t in top if not t.endswith(".dist-info")} == {"ddp_runner", "hydra_plugins"}
    plugins = {line.split(",")[0] for line in record.read_text().splitlines() if line.startswith("hydra_plugins/")}
    assert "hydra_plugins/__init__.py" not in plugins
    assert {p.split("/")[1] for p in plugins} == {"ddp_runner_search"}, plugins
    r = _run([str(venv / "bin/ddp-run"), "task.module=mytask", "device=cpu", "world_size=2", "train.max_steps=4",
              "output.root=out"], cwd=work, env={"PYTHONPATH": str(work / "lib")})
    assert "completed" in r.stdout, r.stdout[-2000:]
    run = work / r.stdout.strip().splitlines()[-1]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 4
    for rank in (0, 1):
        [line] = [x for x in (run / "logs" / f"rank{rank}.log").read_text().splitlines() if "user packages:" in x]
        assert line.split("user packages: ", 1)[1].split() == [
            "the", "user", "runner", str(work / "tasks/__init__.py"), str(work / "tasks/mydata.py"),
            str(work / "lib/runner/__init__.py"), str(work / "conf/__init__.py")]
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["command"][-3:-1] == ["-m", "ddp_runner.tasks"], manifest["command"]
    # The module named on the shell alone: a task of its own name (the neutral preset, none of smoke's keys).
    assert run.name.endswith("_mytask_w2") and manifest["task"] == "mytask", (run.name, manifest["task"])
