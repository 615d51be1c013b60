"""Sharded decoding: 1 device vs meshes of 8 simulated CPU devices, and a two-process run on loopback.

JAX fixes the device count when it starts, so the mesh runs happen in child processes
(tests/mesh_worker.py, and `python -m engine.generate --distributed` twice) and report JSON checked here.
Tolerances: target logits within 5e-4 (absolute, logits of magnitude ~10-30: only the order of
float32 reductions differs), per-token probabilities p and q within 1e-4; tokens identical.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.decode import generate
from engine.drafters import load_drafter
from engine.sharding import MeshError, make_mesh, parse_mesh
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[1]
LOGITS_TOL, PROB_TOL = 5e-4, 1e-4


def child_env(devices: int | None) -> dict:
    """The environment of a subprocess with `devices` simulated CPU devices.

    XLA runs a collective's participants on its intra-op thread pool, sized to the cores (2 here) unless NPROC says
    otherwise: with fewer threads than devices, the devices that reach an all-reduce first can hold every thread while
    the rest still need one, and the process waits until the collective timeout ends it. NPROC gives the pool a
    thread per device and two more; the timeout (XLA's default 40 s) is raised to 10 minutes for loaded cores."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("XLA_FLAGS", None)
    if devices:
        env["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count={devices} "
                            "--xla_cpu_collective_call_terminate_timeout_seconds=600")
        env["NPROC"] = str(max(devices + 2, os.cpu_count() or 1))
    return env


@pytest.fixture(scope="module")
def mesh_run() -> dict:
    proc = subprocess.run([sys.executable, "tests/mesh_worker.py"], cwd=ROOT, env=child_env(8), capture_output=True,
                          text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return last_json(proc.stdout)


def last_json(stdout: str) -> dict:
    """A worker's report: its last stdout line (libraries such as Gloo may print lines before it)."""
    lines = stdout.strip().splitlines()
    assert lines, "the worker printed nothing"
    return json.loads(lines[-1])


def test_parse_mesh_and_clear_errors():
    assert parse_mesh("2x4") == (2, 4) and parse_mesh(" 1 X 8 ") == (1, 8)
    for bad in ("8", "0x2", "axb", "2x"):
        with pytest.raises(MeshError, match="DxM"):
            parse_mesh(bad)
    with pytest.raises(MeshError, match="needs 64 devices"):
        make_mesh("8x8")


def test_mesh_layouts_split_what_divides(mesh_run):
    assert mesh_run["devices"] == 8
    layout_8, layout_3 = mesh_run["meshes"]["1x8"]["layout"], mesh_run["meshes"]["1x3"]["layout"]
    # SmolLM2: 9 query / 3 KV heads do not divide by 8, so attention stays replicated there; MLP and vocab split
    assert "w_gate" in layout_8 and "embed" in layout_8 and "attention replicated" in layout_8
    assert "wq" in layout_3 and "attention split" in layout_3


@pytest.mark.parametrize("spec", ["1x8", "1x3"])
def test_sharded_generation_matches_one_device(mesh_run, spec):
    got = mesh_run["meshes"][spec]
    assert got["logits_diff"] < LOGITS_TOL
    for name, run in got["runs"].items():
        assert run["same_tokens"] and run["n_tokens"] == 24, (spec, name)
        assert run["p_diff"] < PROB_TOL and run["q_diff"] < PROB_TOL, (spec, name, run)
        assert run["compiles"] == 0, (spec, name, "recompiled on a new prompt after warm-up")


def test_batched_drafting_on_mesh_is_lossless_per_sequence(mesh_run):
    """A batch of 8 on a 2x4 mesh (target and drafter caches split over "data"): each sequence's tokens equal
    plain greedy decoding of its prompt alone on one device."""
    assert set(mesh_run["batch"]) == {"ngram", "dflash", "eagle3"}
    for name, run in mesh_run["batch"].items():
        assert run["same_tokens"] == [True] * 8 and run["accepted"] > 0, (name, run)
    for name in ("dflash", "eagle3"):  # drafter caches [B, Nkv, S, D]: batch over "data", like the target's
        assert mesh_run["batch"][name]["cache_batch_axis"] == ["data", "data"], name


def test_two_process_run_agrees_with_single_process(target, tmp_path):
    """`engine.generate --distributed` in two processes on loopback, 4 CPU devices each, one 2x4 mesh over all 8:
    a batch of two (one sequence per process's devices on the data axis) agrees with one process, one device."""
    port = free_port()
    prompts = ["What is 12 plus 7? Explain step by step.", "Write a Python function that reverses a string."]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    args = ["engine.generate", "--prompt-file", str(tmp_path / "p.jsonl"), "--batch", "2", "--drafter", "ngram",
            "--k", "4", "--max-new-tokens", "24", "--mesh", "2x4", "--json"]
    procs = [subprocess.Popen([sys.executable, "-m", *args, "--distributed", f"127.0.0.1:{port},2,{i}"], cwd=ROOT,
                              env=child_env(4), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=900)
        assert p.returncode == 0, stderr[-4000:]
        outs.append([json.loads(line) for line in stdout.strip().splitlines()[-2:]])
    want = [generate(target, p, load_drafter("ngram", target, k=4), max_new_tokens=24).token_ids for p in prompts]
    for i, out in enumerate(outs):
        assert [(o["process"], o["processes"], o["mesh"]) for o in out] == [(i, 2, "2x4")] * 2
        assert [o["token_ids"] for o in out] == want


def run_cli(args: list[str], devices: int | None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=child_env(devices), capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_generate_cli_on_a_mesh_is_lossless():
    proc = run_cli(["engine.generate", "--prompt", "Name three primary colors.", "--drafter", "ngram", "--k", "4",
                    "--max-new-tokens", "16", "--mesh", "2x2", "--check-lossless", "--json"], devices=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert last_json(proc.stdout)["lossless"] is True


@pytest.mark.parametrize("mesh,match", [("1x8", "needs 8 devices but 1"), ("2by2", "DxM")])
def test_bad_mesh_on_the_command_line_is_a_clear_error(mesh, match):
    proc = run_cli(["engine.generate", "--prompt", "hi", "--mesh", mesh], devices=None)
    assert proc.returncode == 2 and match in proc.stderr


def test_app_refuses_a_mesh_bigger_than_the_machine(tmp_path):
    proc = subprocess.run([sys.executable, "app.py", "--mesh", "2x4", "--db", str(tmp_path / "h.duckdb")], cwd=ROOT,
                          env=child_env(None), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "mesh 2x4 needs 8 devices" in proc.stderr
