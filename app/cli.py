"""Command line: python app.py [--host] [--port] [--db] [--target] [--dtype] [--mesh DxM] [--drafter-dir]
[--model-root ...]."""

from __future__ import annotations

import argparse

from engine import CheckpointError, MeshError

from . import state, ui


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="app.py", description="draftscope workbench (Gradio)")
    ap.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    ap.add_argument("--port", type=int, default=7860)
    ap.add_argument("--db", default=None, help="history file (default ./draftscope.duckdb)")
    ap.add_argument("--target", default=None, help="HF directory or .gguf (default: embedded SmolLM2-135M)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--mesh", default=None, metavar="DxM",
                    help="shard target and drafters over a data x model device mesh, e.g. 1x8 (default: one device)")
    ap.add_argument("--drafter-dir", default=None, help="a drafter checkpoint directory, or a folder of them")
    ap.add_argument("--model-root", action="append", default=None, metavar="PATH",
                    help="folder users may load drafter checkpoints from (repeatable; default: the repo and the "
                         "embedded model's folder)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Load the target and drafters once, then serve until interrupted."""
    a = parse(argv)
    try:
        wb = state.start(a.target, a.dtype, a.db, a.drafter_dir, a.model_root, a.mesh)
    except (CheckpointError, MeshError) as e:
        raise SystemExit(f"draftscope: {e}") from None
    ui.launch(wb, a.host, a.port)
