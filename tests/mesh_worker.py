"""Run the embedded model on one device and on meshes of simulated CPU devices; print what to compare as JSON.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/mesh_worker.py
Run as a separate process by tests/test_sharding.py (the device count is fixed when JAX starts).
"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np

from engine.cache import init_cache
from engine.decode import generate, generate_batch
from engine.drafters import load_drafter
from engine.model import forward
from engine.sharding import describe
from engine.target import load_target, shard_target
from tests.prompts import LOSSLESS_PROMPTS

PROMPTS = ["What is 12 plus 7? Explain step by step.", "Write a Python function that reverses a string."]
DRAFTERS = {"ar": None, "ngram": 4, "dflash": 4, "eagle3": 4}
MAX_NEW = 24


def logits_of(target, ids: np.ndarray) -> np.ndarray:
    cache = init_cache(target.cfg, 1, 64, target.params["embed"].dtype, target.mesh)
    logits, _, _ = forward(target.params, cache, ids[None], np.zeros(1, np.int32), cfg=target.cfg)
    return np.asarray(jax.device_get(logits))[0]


def run(target, name: str, prompt: str) -> dict:
    drafter = load_drafter(name, target, k=DRAFTERS[name])
    warm_up = PROMPTS[1] if prompt != PROMPTS[1] else PROMPTS[0]
    generate(target, warm_up, drafter, max_new_tokens=MAX_NEW)  # warm-up on another prompt: compiles
    res = generate(target, prompt, drafter, max_new_tokens=MAX_NEW)
    return {"tokens": res.token_ids, "p": [x for s in res.steps for x in s.p], "q": [x for s in res.steps for x in s.q],
            "compiles": res.stats["compiles"]}


def main() -> None:
    single = load_target()
    ids = single.encode(PROMPTS[0])
    ref = {name: run(single, name, PROMPTS[0]) for name in DRAFTERS}
    ref_logits = logits_of(single, ids)
    out = {"devices": jax.device_count(), "meshes": {}, "batch": {}}
    for spec in ("1x8", "1x3"):
        target = shard_target(single, spec)
        runs = {}
        for name in DRAFTERS:
            got = run(target, name, PROMPTS[0])
            runs[name] = {"same_tokens": got["tokens"] == ref[name]["tokens"], "n_tokens": len(got["tokens"]),
                          "p_diff": float(np.max(np.abs(np.subtract(got["p"], ref[name]["p"])), initial=0.0)),
                          "q_diff": float(np.max(np.abs(np.subtract(got["q"], ref[name]["q"])), initial=0.0)),
                          "compiles": got["compiles"]}
        out["meshes"][spec] = {"layout": describe(target.mesh, target.params, target.cfg.num_heads,
                                                  target.cfg.num_kv_heads),
                               "logits_diff": float(np.max(np.abs(logits_of(target, ids) - ref_logits))),
                               "runs": runs}
    # a batch of 8 ragged prompts over the data axis, drafted in one call per step: each as plain greedy alone
    target, batch = shard_target(single, "2x4"), LOSSLESS_PROMPTS[:8]
    alone = [generate(single, p, max_new_tokens=MAX_NEW).token_ids for p in batch]
    for name in ("ngram", "dflash", "eagle3"):
        drafter = load_drafter(name, target, k=4)
        results = generate_batch(target, batch, drafter, max_new_tokens=MAX_NEW)
        out["batch"][name] = {"same_tokens": [r.token_ids == a for r, a in zip(results, alone, strict=True)],
                              "n_tokens": [len(r.token_ids) for r in results],
                              "accepted": sum(r.stats["accepted"] for r in results)}
        if drafter.feature_layers:  # the drafter cache's batch axis, before and after an extend
            state = drafter.start([np.arange(3)] * 8, 256)
            feats = np.zeros((len(drafter.feature_layers), 8, 5, single.cfg.hidden_size), np.float32)
            grown = drafter.extend(state, feats, np.full(8, 2, np.int32))
            out["batch"][name]["cache_batch_axis"] = [jax.tree.leaves(s.k)[0].sharding.spec[0] for s in (state, grown)]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
