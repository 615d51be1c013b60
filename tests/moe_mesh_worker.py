"""Tiny random Qwen3-MoE and gpt-oss targets on one device and on meshes of simulated CPU devices; print JSON.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/moe_mesh_worker.py
Run as a separate process by tests/test_moe_targets.py (the device count is fixed when JAX starts).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import numpy as np

from engine.cache import init_cache
from engine.config import config_from_hf
from engine.decode import generate
from engine.drafters.dflash import DFlashDrafter, init_dflash
from engine.drafters.ngram import NgramDrafter
from engine.model import forward
from engine.sharding import describe
from engine.target import Target, shard_target
from engine.weights import build_params, hf_shapes
from tests.test_dflash import scramble
from tests.test_sampling import ByteTokenizer

VOCAB, MAX_NEW = 128, 16
PROMPT = "one two three one two three one two"
COMMON = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 512, "num_experts_per_tok": 2}
CONFIGS = {
    "qwen3_moe": {**COMMON, "model_type": "qwen3_moe", "intermediate_size": 48, "moe_intermediate_size": 16,
                  "num_experts": 8, "norm_topk_prob": True, "mlp_only_layers": [1]},
    "gpt_oss": {**COMMON, "model_type": "gpt_oss", "intermediate_size": 16, "num_local_experts": 8,
                "sliding_window": 6, "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                                         "original_max_position_embeddings": 16}},
}


def tiny_target(kind: str) -> Target:
    """Random weights that make confident, non-uniform predictions: matrices N(0, 0.2), norms ~1, biases N(0, 0.5)."""
    cfg = config_from_hf(CONFIGS[kind])
    rng, shapes = np.random.default_rng(7), hf_shapes(cfg)

    def get(name: str) -> np.ndarray:
        shape = shapes[name]
        if "norm" in name:
            return (1 + 0.1 * rng.normal(size=shape)).astype(np.float32)
        return rng.normal(0, 0.5 if len(shape) == 1 else 0.2, shape).astype(np.float32)

    return Target(cfg, build_params(cfg, get, "float32"), ByteTokenizer(), Path(kind), "float32", (), kind)


def drafters(target: Target) -> dict:
    cfg, params = init_dflash(target, num_layers=2, block_size=8, target_layer_ids=(0, 2, 3), mask_token_id=VOCAB - 1)
    return {"ar": None, "ngram": NgramDrafter(k=4), "dflash": DFlashDrafter(target, cfg, scramble(params, 1), k=7)}


def logits_of(target: Target, ids: np.ndarray) -> np.ndarray:
    cache = init_cache(target.cfg, 1, 64, target.params["embed"].dtype, target.mesh)
    logits, _, _ = forward(target.params, cache, ids[None], np.zeros(1, np.int32), cfg=target.cfg)
    return np.asarray(jax.device_get(logits))[0]


def main() -> None:
    out = {"devices": jax.device_count(), "targets": {}}
    for kind in CONFIGS:
        single = tiny_target(kind)
        ids = single.encode(PROMPT, raw=True)
        ref = {name: generate(single, PROMPT, d, max_new_tokens=MAX_NEW, raw=True).token_ids
               for name, d in drafters(single).items()}
        ref_logits = logits_of(single, ids)
        got = {}
        for spec in ("1x8", "2x4"):
            target = shard_target(single, spec)
            runs = {name: generate(target, PROMPT, d, max_new_tokens=MAX_NEW, raw=True).token_ids
                    for name, d in drafters(target).items()}
            moe_layer = next(lp for i, lp in enumerate(target.params["layers"]) if target.cfg.is_moe(i))
            got[spec] = {"same_tokens": {name: runs[name] == ref[name] for name in ref},
                         "n_tokens": {name: len(runs[name]) for name in ref},
                         "logits_diff": float(np.max(np.abs(logits_of(target, ids) - ref_logits))),
                         "expert_spec": [str(a) for a in moe_layer["we_gate"].sharding.spec],
                         "layout": describe(target.mesh, target.params, target.cfg.num_heads,
                                            target.cfg.num_kv_heads)}
        out["targets"][kind] = got
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
