"""Tiny random MoE (Qwen3-MoE, gpt-oss) and hybrid (Qwen3.5 dense and MoE) targets on one device and on meshes of
simulated CPU devices; print JSON.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/moe_mesh_worker.py [KIND ...]
Run as a separate process by tests/test_moe_targets.py (the device count is fixed when JAX starts). Every kind of
CONFIGS runs unless KINDs are given.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import numpy as np

from engine.cache import init_cache
from engine.config import config_from_hf
from engine.decode import generate_batch
from engine.drafters.dflash import DFlashDrafter
from engine.drafters.dflash_checkpoint import init_dflash
from engine.drafters.ngram import NgramDrafter
from engine.model import forward
from engine.qwen3_5 import hybrid_config_from_hf, layer_shapes, load_params
from engine.sharding import describe
from engine.target import Target, shard_target
from engine.weights import build_params, hf_shapes
from tests.test_dflash import OracleMix, scramble
from tests.test_sampling import ByteTokenizer

VOCAB, MAX_NEW = 128, 16
PROMPTS = ["one two three one two three one two", "abc abc abc abc"]  # batch 2: split over "data" on 2x4
COMMON = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 512, "num_experts_per_tok": 2}
# hybrid: layers 1 and 3 full attention (8 query, 4 KV heads: split on 2x4 only), 0 and 2 gated DeltaNet (8 value
# heads: split on 1x8 and 2x4)
HYBRID = {**COMMON, "model_type": "qwen3_5_text", "num_attention_heads": 8, "num_key_value_heads": 4,
          "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
          "linear_conv_kernel_dim": 4, "full_attention_interval": 2}
CONFIGS = {
    "qwen3_moe": {**COMMON, "model_type": "qwen3_moe", "intermediate_size": 48, "moe_intermediate_size": 16,
                  "num_experts": 8, "norm_topk_prob": True, "mlp_only_layers": [1]},
    "gpt_oss": {**COMMON, "model_type": "gpt_oss", "intermediate_size": 16, "num_local_experts": 8,
                "sliding_window": 6, "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                                         "original_max_position_embeddings": 16}},
    "qwen3_5": {k: v for k, v in HYBRID.items() if k != "num_experts_per_tok"} | {"intermediate_size": 48},
    "qwen3_5_moe": {**HYBRID, "model_type": "qwen3_5_moe_text", "num_experts": 8, "moe_intermediate_size": 16,
                    "shared_expert_intermediate_size": 24},
}
# leaves whose placement each report shows (the first layer holding each)
SHOWN = ("wq", "we_gate", "w_z", "w_out", "A_log", "w_qkv", "shared_w_gate")


def hybrid_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape of a text-only hybrid checkpoint of cfg."""
    shapes = {f"model.layers.{i}.{suffix}": shape for i in range(cfg.num_layers)
              for suffix, shape in layer_shapes(cfg, i).items()}
    h = cfg.hidden_size
    return shapes | {"model.embed_tokens.weight": (VOCAB, h), "model.norm.weight": (h,), "lm_head.weight": (VOCAB, h)}


def tiny_target(kind: str) -> Target:
    """Random weights that make confident, non-uniform predictions: matrices N(0, 0.2), norms ~1, biases N(0, 0.5)."""
    hybrid = kind.startswith("qwen3_5")
    cfg = (hybrid_config_from_hf if hybrid else config_from_hf)(CONFIGS[kind])
    rng = np.random.default_rng(7)
    shapes = hybrid_shapes(cfg) if hybrid else hf_shapes(cfg)

    def get(name: str) -> np.ndarray:
        shape = shapes[name]
        if "norm" in name:
            return (1 + 0.1 * rng.normal(size=shape)).astype(np.float32)
        return rng.normal(0, 0.5 if len(shape) == 1 else 0.2, shape).astype(np.float32)

    params = load_params(cfg, get, shapes)[0] if hybrid else build_params(cfg, get, "float32")
    return Target(cfg, params, ByteTokenizer(), Path(kind), "float32", (), kind)


def drafters(target: Target, references: list[list[int]]) -> dict:
    """ar, and ngram and a random DFlash (taps on layers of both kinds in a hybrid) whose first drafts an oracle
    overwrites with the known continuation, so that blocks are accepted at every length."""
    cfg, params = init_dflash(target, num_layers=2, block_size=8, target_layer_ids=(0, 2, 3), mask_token_id=VOCAB - 1,
                              intermediate_size=48)
    return {"ar": None, "ngram": OracleMix(NgramDrafter(k=4), references),
            "dflash": OracleMix(DFlashDrafter(target, cfg, scramble(params, 1), k=7), references)}


def logits_of(target: Target, ids: np.ndarray) -> np.ndarray:
    cache = init_cache(target.cfg, 1, 64, target.params["embed"].dtype, target.mesh)
    logits, _, _ = forward(target.params, cache, ids[None], np.zeros(1, np.int32), cfg=target.cfg)
    return np.asarray(jax.device_get(logits))[0]


def placement(target: Target) -> dict[str, list[str]]:
    """PartitionSpec of each SHOWN leaf the target has, and of a hybrid's recurrent state in a batch-2 cache."""
    specs = {}
    for lp in target.params["layers"]:
        specs |= {name: [str(a) for a in lp[name].sharding.spec] for name in SHOWN if name in lp and name not in specs}
    cache = init_cache(target.cfg, len(PROMPTS), 64, target.params["embed"].dtype, target.mesh)
    if "rec" in cache:
        state = next(a for a in cache["rec"] if a is not None)
        specs["rec_state"] = [str(a) for a in state.sharding.spec]
    return specs


def main() -> None:
    out = {"devices": jax.device_count(), "targets": {}}
    for kind in sys.argv[1:] or CONFIGS:
        single = tiny_target(kind)
        ids = single.encode(PROMPTS[0], raw=True)
        ref = [r.token_ids for r in generate_batch(single, PROMPTS, max_new_tokens=MAX_NEW, raw=True)]
        references = [list(single.encode(p, raw=True)) + r for p, r in zip(PROMPTS, ref, strict=True)]
        ref_logits = logits_of(single, ids)
        got = {"one_device": {}}
        for name, d in drafters(single, references).items():  # lossless on one device too
            got["one_device"][name] = [r.token_ids for r in generate_batch(single, PROMPTS, d, max_new_tokens=MAX_NEW,
                                                                           raw=True)] == ref
        for spec in ("1x8", "2x4"):
            target = shard_target(single, spec)
            same, n_tokens, accepted, rolled = {}, {}, {}, {}
            for name, d in drafters(target, references).items():
                runs = generate_batch(target, PROMPTS, d, max_new_tokens=MAX_NEW, raw=True)
                same[name] = [r.token_ids for r in runs] == ref
                n_tokens[name] = sorted({len(r.token_ids) for r in runs})
                accepted[name] = sum(r.stats["accepted"] for r in runs)
                rolled[name] = sum(s.state_rollback for r in runs for s in r.steps)
            again = generate_batch(target, PROMPTS, max_new_tokens=MAX_NEW, raw=True)[0]  # as ar, above
            got[spec] = {"same_tokens": same, "n_tokens": n_tokens, "accepted": accepted, "state_rollback": rolled,
                         "logits_diff": float(np.max(np.abs(logits_of(target, ids) - ref_logits))),
                         "compiles_again": again.stats["compiles"], "specs": placement(target),
                         "layout": describe(target.mesh, target.params, target.cfg.num_heads,
                                            target.cfg.num_kv_heads)}
        out["targets"][kind] = got
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
