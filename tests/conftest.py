"""Shared fixtures: the embedded target, its plain greedy references and transformers' GGUF-loaded copy of it (once
per session); the workbench app (once per module).

Tests that use either (or the mesh worker) are marked `slow` here; those that load the embedded model in a CLI
subprocess carry the mark themselves; `pytest -m "not slow"` is the fast tier. Under CI (CI=true) a run with any
dependency the tests need missing fails at once instead of skipping what needs it."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# One persistent XLA compilation cache for the run, its workers and the processes they start (the app, CLIs): a
# program compiled once (same HLO, same options) is read back instead of compiled again. engine.jit_stats counts a
# read as an executable built, so "no recompilation after warm-up" means the same with or without it.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(REPO / ".pytest_cache" / "xla"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
CHROMIUM = "/usr/bin/chromium"
REQUIRED_MODULES = ("torch", "transformers", "accelerate", "playwright", "kaleido")  # reference tests, browser, PNG
# each loads the embedded model (mesh_run: in a subprocess)
SLOW_FIXTURES = {"target", "greedy", "hf_smollm2", "app_server", "mesh_run"}


def missing_dependencies() -> list[str]:
    """What the full suite needs and this machine lacks (each would skip tests)."""
    missing = [m for m in REQUIRED_MODULES if importlib.util.find_spec(m) is None]
    return missing + ([CHROMIUM] if not shutil.which(CHROMIUM) else [])


def pytest_sessionstart(session):
    missing = missing_dependencies()
    if missing and os.environ.get("CI") == "true":
        pytest.exit(f"CI needs {', '.join(missing)}: install them (scripts/test.sh does) instead of skipping their "
                    "tests", returncode=3)


def pytest_collection_modifyitems(items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def memory_maps() -> tuple[int, int]:
    """This process's memory maps and the kernel's per-process limit; (0, 0) where /proc does not tell."""
    try:
        with open("/proc/self/maps", "rb") as maps, open("/proc/sys/vm/max_map_count") as limit:
            return sum(1 for _ in maps), int(limit.read())
    except OSError:
        return 0, 0


def pytest_runtest_teardown(item, nextitem):
    """XLA's CPU backend maps each compiled executable's code into pages of its own (about 3 memory maps each) and jit
    caches keep every executable alive, so a whole suite in one process passes vm.max_map_count (65530) and the
    next compile segfaults. Between tests, drop the compiled code once half the limit is in use."""
    used, limit = memory_maps()
    if used > limit // 2 and "jax" in sys.modules:
        sys.modules["jax"].clear_caches()


def pytest_terminal_summary(terminalreporter):
    missing = missing_dependencies()
    if missing:
        terminalreporter.write_line(f"draftscope: {', '.join(missing)} missing here: the tests that need them were "
                                    "skipped (CI refuses to run without them)")


@pytest.fixture(scope="session")
def target():
    """The embedded SmolLM2-135M-Instruct target in float32."""
    from engine import load_target

    return load_target()


@pytest.fixture(scope="session")
def greedy(target):
    """greedy(prompt, max_new_tokens) -> the embedded target's plain greedy GenerationResult, each computed once."""
    from engine import generate

    return functools.cache(lambda prompt, max_new_tokens: generate(target, prompt, max_new_tokens=max_new_tokens))


@pytest.fixture(scope="session")
def hf_smollm2(target):
    """transformers' own model of the embedded GGUF (float32, eval mode): the reference our loader must match."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(str(target.path.parent), gguf_file=target.path.name,
                                                             dtype=torch.float32).eval()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_app(tmp: Path, *args: str):
    """(url, db path) of `python app.py` on a fresh history in `tmp` (extra CLI args), stopped on exit."""
    db, log = tmp / "history.duckdb", tmp / "app.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(REPO / "app.py"), "--port", str(port), "--db", str(db), *args],
                                cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 600  # a deadline, not a wait: a loaded machine starts it slowly
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"app.py exited with {proc.returncode}:\n{log.read_text()}")
            try:
                with urllib.request.urlopen(url, timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"app.py did not serve {url} in 600 s:\n{log.read_text()}")
                time.sleep(0.5)
        yield url, db
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def app_server(tmp_path_factory):
    """(url, db path) of `python app.py` on the embedded model, serving a fresh history; stopped after the module."""
    with serve_app(tmp_path_factory.mktemp("app")) as server:
        yield server
