"""Drafter registry: names and checkpoint directories -> drafter objects."""

from __future__ import annotations

import importlib
from pathlib import Path

from ..config import read_json
from .base import Drafter, DrafterError, Proposal, check_k

# name -> module exposing `load(target, path=None, k=None) -> Drafter`
_MODEL_DRAFTERS = {"dflash": "engine.drafters.dflash", "eagle3": "engine.drafters.eagle3"}
# DFlash2DraftModel goes to the DFlash loader, which refuses it with the reason
_ARCHITECTURES = {"DFlashDraftModel": "dflash", "DFlashForCausalLM": "dflash", "DFlash2DraftModel": "dflash",
                  "DominoDraftModel": "dflash",
                  "Eagle3LlamaForCausalLM": "eagle3", "LlamaForCausalLMEagle3": "eagle3", "Eagle3DraftModel": "eagle3",
                  "Eagle3Speculator": "eagle3"}
DRAFTER_NAMES = ("ar", "ngram", *_MODEL_DRAFTERS)


def load_drafter(name: str | Path, target, k: int | None = None, **options) -> Drafter:
    """A drafter by name ("ar", "ngram", "dflash", "eagle3") or from a checkpoint directory."""
    from .ar import ArDrafter
    from .ngram import NgramDrafter

    if name == "ar":
        return ArDrafter()
    if name == "ngram":
        return NgramDrafter(k=8 if k is None else k, **options)
    path = None
    if str(name) not in _MODEL_DRAFTERS:
        path = Path(name).expanduser()
        if not path.is_dir():
            raise DrafterError(f"unknown drafter {str(name)!r}: use one of {', '.join(DRAFTER_NAMES)} "
                               "or a checkpoint directory")
        archs = read_json(path / "config.json").get("architectures") or []
        kinds = [_ARCHITECTURES[a] for a in archs if a in _ARCHITECTURES]
        if not kinds:
            raise DrafterError(f"{path}/config.json names architectures {archs}; expected one of "
                               f"{sorted(_ARCHITECTURES)}")
        name = kinds[0]
    module = importlib.import_module(_MODEL_DRAFTERS[str(name)])
    return module.load(target, path=path, k=k, **options)


__all__ = ["Drafter", "DrafterError", "Proposal", "check_k", "load_drafter", "DRAFTER_NAMES"]
