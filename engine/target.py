"""A loaded target model: static config, params pytree, tokenizer and stop tokens."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh
from transformers import PreTrainedTokenizerBase

from .config import CheckpointError, ModelConfig, read_json
from .qwen3_5 import HybridConfig
from .sharding import place_params, resolve_mesh
from .tokenizer import encode_prompt, load_tokenizer
from .weights import load_weights

PIECE_CONTEXT = 4  # tokens of context, at least, that piece_texts decodes a block after (a character spans <= 4 bytes)
REPLACEMENT = "\ufffd"  # what a tokenizer decodes an incomplete UTF-8 sequence to


@dataclass(eq=False)
class Target:
    cfg: ModelConfig
    params: dict
    tokenizer: PreTrainedTokenizerBase
    path: Path
    dtype: str
    eos_ids: tuple[int, ...]
    name: str = field(default="")
    mesh: Mesh | None = None  # params live on this mesh (None: one device)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one forward streams (the tied embedding counted once, as the LM head)."""
        return sum(x.nbytes for x in jax.tree.leaves(self.params))

    def encode(self, prompt: str, raw: bool = False, template: dict | None = None) -> np.ndarray:
        """Prompt ids: chat-formatted with the template's switches unless raw (engine.tokenizer.encode_prompt)."""
        return encode_prompt(self.tokenizer, prompt, raw, template)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def token_texts(self, ids) -> list[str]:
        """Each token's own text (special tokens kept), for token-level views."""
        return [self.tokenizer.decode([int(i)]) for i in ids]

    def piece_texts(self, ids, context=()) -> list[str]:
        """Each token's text where it stands, after the tokens in `context` (special tokens kept). Byte pieces are
        merged: a character split over several tokens is the text of the token that completes it, and the pieces
        before it carry only what they complete themselves ("" for a bare piece)."""
        context = [int(i) for i in context]
        n = min(PIECE_CONTEXT, len(context))
        while n < min(len(context), 3 * PIECE_CONTEXT) and self.tokenizer.decode(context[-n:]).startswith(REPLACEMENT):
            n += 1  # start the context at a character's first byte, not inside one
        ctx = context[len(context) - n:]
        seen = self.tokenizer.decode(ctx).rstrip(REPLACEMENT)
        texts = []
        for n in range(1, len(ids) + 1):
            full = self.tokenizer.decode(ctx + [int(i) for i in ids[:n]]).rstrip(REPLACEMENT)
            if not full.startswith(seen):  # a tokenizer whose decoding is not prefix-stable here: the token alone
                texts.append(self.tokenizer.decode([int(ids[n - 1])]))
                continue
            texts.append(full[len(seen):])
            seen = full
        return texts


def _eos_ids(path: Path, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    gen = path / "generation_config.json"
    if path.is_dir() and gen.is_file():
        eos = read_json(gen).get("eos_token_id")
        ids |= set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return tuple(sorted(ids))


def shard_target(target: Target, mesh: Mesh | str | None) -> Target:
    """The target with its weights placed on a mesh (a Mesh or "DxM"); None or "1x1" leaves it on one device."""
    mesh = resolve_mesh(mesh)
    if mesh is None:
        return target
    cfg = target.cfg
    linear_heads = cfg.delta.num_v_heads if isinstance(cfg, HybridConfig) else 0  # gated DeltaNet value heads
    params = place_params(target.params, mesh, cfg.num_heads, cfg.num_kv_heads, linear_heads)
    return replace(target, params=params, mesh=mesh)


def load_target(path: str | Path | None = None, dtype: str = "float32",
                tokenizer: str | Path | PreTrainedTokenizerBase | None = None,
                mesh: Mesh | str | None = None) -> Target:
    """Load a target: a HF directory, a .gguf file, or (None) the embedded SmolLM2-135M-Instruct.

    `tokenizer`: a directory to load the tokenizer from instead of the checkpoint (e.g. one saved with
    `save_pretrained`, to skip the GGUF conversion or run where that conversion is unavailable), or a tokenizer
    object to use as it is.
    `mesh`: shard the weights over a device mesh (see engine.sharding).
    """
    mesh = resolve_mesh(mesh)  # a bad mesh fails before the weights load
    # with a mesh, weights load into host memory and each device then receives only its shard
    with jax.default_device(jax.local_devices(backend="cpu")[0]) if mesh is not None else contextlib.nullcontext():
        cfg, params, resolved = load_weights(path, dtype)
    if tokenizer is None or isinstance(tokenizer, (str, Path)):
        tokenizer = load_tokenizer(Path(tokenizer) if tokenizer else resolved)
    if len(tokenizer) > cfg.vocab_size:
        raise CheckpointError(f"tokenizer has {len(tokenizer)} tokens but the model only {cfg.vocab_size}")
    name = resolved.stem if resolved.suffix == ".gguf" else resolved.name
    return shard_target(Target(cfg, params, tokenizer, resolved, dtype, _eos_ids(resolved, tokenizer), name), mesh)
