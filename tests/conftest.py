"""Shared fixtures: the embedded target (once per session); the workbench app (once per module)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def target():
    """The embedded SmolLM2-135M-Instruct target in float32."""
    from engine import load_target

    return load_target()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app_server(tmp_path_factory):
    """(url, db path) of `python app.py` serving a fresh history; stopped after the module."""
    tmp = tmp_path_factory.mktemp("app")
    db, log = tmp / "history.duckdb", tmp / "app.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(REPO / "app.py"), "--port", str(port), "--db", str(db)], cwd=REPO,
                                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 180
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"app.py exited with {proc.returncode}:\n{log.read_text()}")
            try:
                with urllib.request.urlopen(url, timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"app.py did not serve {url} in 180 s:\n{log.read_text()}")
                time.sleep(0.5)
        yield url, db
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
