"""The test run's guards (tests/conftest.py): under CI=true a missing test dependency fails the run before any test;
elsewhere the run goes on and its summary names what was missing. Compiled code is dropped before the process runs
out of memory maps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import memory_maps

REPO = Path(__file__).resolve().parent.parent

# imported at interpreter start (sitecustomize on PYTHONPATH): kaleido cannot be found, as on a machine without it
HIDE_KALEIDO = "import sys\nsys.modules['kaleido'] = None\n"


def run_without_kaleido(tmp_path: Path, ci: str) -> subprocess.CompletedProcess:
    (tmp_path / "sitecustomize.py").write_text(HIDE_KALEIDO)
    env = {**os.environ, "CI": ci, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_docs.py::test_readme_fits_its_budget"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_ci_fails_at_once_when_a_test_dependency_is_missing(tmp_path):
    proc = run_without_kaleido(tmp_path, "true")
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "CI needs kaleido" in proc.stdout + proc.stderr
    assert "passed" not in proc.stdout  # no test ran


def test_a_local_run_goes_on_and_names_what_was_missing(tmp_path):
    proc = run_without_kaleido(tmp_path, "")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
    summary = next(line for line in proc.stdout.splitlines() if line.startswith("draftscope: "))
    assert "kaleido" in summary.split(" missing here")[0]
    assert summary.endswith("the tests that need them were skipped (CI refuses to run without them)")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memory maps are read from /proc")
def test_clearing_jax_caches_frees_the_memory_maps_of_compiled_code():
    """What the teardown hook relies on: compiled executables hold memory maps (about 3 each: 2.9-3.1 measured;
    adjacent maps may merge, so at least 2 is asserted) until jax.clear_caches(), which returns the process to where
    it was before them."""
    import jax
    import jax.numpy as jnp

    def compile_40():
        for n in range(40):
            jax.jit(lambda x, n=n: (jnp.sin(x) * n).sum())(jnp.ones(n + 1)).block_until_ready()

    compile_40()  # the backend's one-time allocations
    jax.clear_caches()
    before, limit = memory_maps()
    assert 0 < before < limit
    compile_40()
    assert memory_maps()[0] >= before + 2 * 40
    jax.clear_caches()
    assert memory_maps()[0] <= before + 20  # not a map of the 40 executables left (others' threads may add a few)
