"""Editing a saved drafter checkpoint in place (config.json + model.safetensors), for the loaders' refusal tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from safetensors.numpy import load_file, save_file


def rewrite_checkpoint(path: Path, edit: Callable[[dict, dict], None]) -> Path:
    """Read path's config and tensors, let edit(config, tensors) change them in place, write them back."""
    conf = json.loads((path / "config.json").read_text())
    tensors = load_file(path / "model.safetensors")
    edit(conf, tensors)
    (path / "config.json").write_text(json.dumps(conf))
    save_file(tensors, path / "model.safetensors")
    return path


# refusals every drafter's loader must give, by name: edit(config, tensors) in place
COMMON_BREAKS = {
    "wrong hidden size": lambda conf, tensors: conf.update(hidden_size=48),
    "wrong vocab": lambda conf, tensors: conf.update(vocab_size=conf["vocab_size"] + 4),
    "wrong architecture": lambda conf, tensors: conf.update(architectures=["LlamaForCausalLM"]),
}
