"""The test run's dependency guard (tests/conftest.py): under CI=true a missing test dependency fails the run before
any test; elsewhere the run goes on and its summary names what was missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    assert "draftscope: kaleido missing here" in proc.stdout
