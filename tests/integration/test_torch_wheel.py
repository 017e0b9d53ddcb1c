"""Issue 51 item 13: on a host without a GPU, `make`'s torch download asks PyTorch's CPU wheel index first and
falls back to pip's own configuration within seconds when that index does not answer; it says which build it
chose. Driven through the Makefile's own download step (`make torch-wheel`) with local indexes: a CPU index that
serves ``torch-2.13.0+cpu`` and pip's own index (its whole configuration replaced) that serves the plain
``torch-2.13.0`` (on Linux, the CUDA build). The wheels are small fakes with real metadata."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the checkout, whose Makefile is driven
VERSION = "2.13.0"


def fake_wheel(folder: Path, version: str) -> str:
    """A wheel named like torch's that pip accepts (METADATA, WHEEL, RECORD), a few hundred bytes."""
    name = f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(folder / name, "w") as z:
        z.writestr("torch/__init__.py", f"__version__ = {version!r}\n")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return name


def simple_index(root: Path, version: str) -> str:
    """A PEP 503 index at ``root`` serving one torch wheel; its file:// URL."""
    project = root / "torch"
    project.mkdir(parents=True)
    name = fake_wheel(project, version)
    (project / "index.html").write_text(f'<html><body><a href="{name}">{name}</a></body></html>\n')
    (root / "index.html").write_text('<html><body><a href="torch/">torch</a></body></html>\n')
    return root.as_uri() + "/"


@pytest.fixture
def indexes(tmp_path: Path) -> dict[str, str]:
    return {"cpu": simple_index(tmp_path / "cpu" / "simple", f"{VERSION}+cpu"),
            "own": simple_index(tmp_path / "own" / "simple", VERSION)}


@pytest.fixture
def silent_index() -> Iterator[str]:
    """An index that accepts connections and never answers (a firewall that drops, a proxy that hangs)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/simple/"
    stop.set()
    t.join()
    for c in held:
        c.close()
    server.close()


def make_torch_wheel(dest: Path, own_index: str, *variables: str) -> subprocess.CompletedProcess[str]:
    """`make torch-wheel` with pip's whole configuration replaced by ``own_index`` (no config file, no
    find-links, no constraints: this machine's own local wheels must not answer)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=own_index, PIP_DISABLE_PIP_VERSION_CHECK="1")
    return subprocess.run(["make", "-s", "-C", str(ROOT), "torch-wheel", f"PY={sys.executable}",
                           f"WHEEL_DIR={dest}", *variables], capture_output=True, text=True, env=env, timeout=120)


needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this host")


@needs_make
def test_a_cpu_host_gets_the_cpu_build_from_the_cpu_index(indexes: dict[str, str], tmp_path: Path) -> None:
    r = make_torch_wheel(tmp_path / "wheels", indexes["own"], f"TORCH_CPU_INDEX={indexes['cpu']}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert Path(r.stdout.strip()).name == f"torch-{VERSION}+cpu-py3-none-any.whl", r.stdout + r.stderr
    assert Path(r.stdout.strip()).is_file()
    assert f"torch-{VERSION}+cpu-py3-none-any.whl: the CPU build" in r.stderr


@needs_make
def test_without_a_cpu_index_pips_own_configuration_decides(indexes: dict[str, str], tmp_path: Path) -> None:
    """A GPU host (the Makefile leaves TORCH_CPU_INDEX empty there), or `make TORCH_CPU_INDEX=`."""
    r = make_torch_wheel(tmp_path / "wheels", indexes["own"], "TORCH_CPU_INDEX=")
    assert r.returncode == 0, r.stdout + r.stderr
    assert Path(r.stdout.strip()).name == f"torch-{VERSION}-py3-none-any.whl", r.stdout + r.stderr
    assert "pip's default build" in r.stderr


@needs_make
def test_a_cpu_index_that_never_answers_falls_back_within_seconds(indexes: dict[str, str], silent_index: str,
                                                                  tmp_path: Path) -> None:
    t0 = time.monotonic()
    r = make_torch_wheel(tmp_path / "wheels", indexes["own"], f"TORCH_CPU_INDEX={silent_index}")
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    assert Path(r.stdout.strip()).name == f"torch-{VERSION}-py3-none-any.whl", r.stdout + r.stderr
    assert "falling back to pip's own configuration" in r.stderr, r.stderr
    assert took < 30, f"{took:.0f} s: the CPU index's timeout (5 s, no retries) is not applied"


@needs_make
def test_an_unreachable_cpu_index_falls_back_at_once(indexes: dict[str, str], tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on: the connection is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    r = make_torch_wheel(tmp_path / "wheels", indexes["own"], f"TORCH_CPU_INDEX=http://127.0.0.1:{port}/simple/")
    assert r.returncode == 0 and Path(r.stdout.strip()).name == f"torch-{VERSION}-py3-none-any.whl", r.stderr
    assert time.monotonic() - t0 < 30


def test_the_makefile_asks_the_cpu_index_only_on_a_host_without_a_gpu() -> None:
    text = (ROOT / "Makefile").read_text()
    assert "TORCH_CPU_INDEX     ?= $(if $(GPUS),,https://download.pytorch.org/whl/cpu)" in text
    assert "whl=$$($(TORCH_WHEEL))" in text and "$(PIP) download" not in text  # the one download: the script's
