"""The EAGLE-3 training step twice, ours (pure functions over a params pytree + optax) and flax.nnx (an nnx.Module
with nnx.Optimizer), on the shipped drafter's weights: logits parity, step time, and what each needs around it.

Run: `scripts/setup.sh dev` (flax is a dev dependency for this script only), then
`python -m experiments.ablations.flax_side_by_side [--batch 4] [--tokens 256] [--steps 3] [--repeats 10]`.
The result and the decision it led to are in docs/architecture.md ("Why no Flax").
"""

from __future__ import annotations

import argparse
import inspect
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from engine import load_target
from engine.drafters import eagle3
from engine.drafters.eagle3_config import Eagle3Config
from engine.ops import attention, rope
from experiments.training.loop import make_update, optimizer


class Midlayer(nnx.Module):
    """EAGLE-3's draft model in nnx: fc, one decoder layer over [embedding, hidden], final norm, LM head."""

    def __init__(self, cfg: Eagle3Config, n_features: int, rngs: nnx.Rngs):
        b, h = cfg.body, cfg.body.hidden_size
        lin = lambda i, o: nnx.Linear(i, o, use_bias=False, rngs=rngs)  # noqa: E731
        norm = lambda: nnx.RMSNorm(h, epsilon=b.rms_eps, rngs=rngs)  # noqa: E731
        self.cfg = cfg
        self.fc = lin(n_features * h, h)
        self.attn_norm, self.hidden_norm, self.mlp_norm, self.norm = norm(), norm(), norm(), norm()
        self.wq, self.wk = lin(2 * h, b.num_heads * b.head_dim), lin(2 * h, b.num_kv_heads * b.head_dim)
        self.wv, self.wo = lin(2 * h, b.num_kv_heads * b.head_dim), lin(b.num_heads * b.head_dim, h)
        self.w_gate, self.w_up = lin(h, b.intermediate_size), lin(h, b.intermediate_size)
        self.w_down, self.lm_head = lin(b.intermediate_size, h), lin(h, cfg.draft_vocab_size)

    def __call__(self, embed: jax.Array, features: jax.Array, tokens: jax.Array, steps: int) -> jax.Array:
        """Teacher-forced TTT logits [B, steps, T, Vd], as eagle3.eagle3_train_logits."""
        body, (bsz, t) = self.cfg.body, tokens.shape
        inv_freq, scale = jnp.asarray(body.inv_freq()), body.attention_factor()
        g, rows = self.fc(features), jnp.arange(t)
        positions = jnp.broadcast_to(rows, (bsz, t))
        causal, diagonal = rows[:, None] >= rows[None, :], rows[:, None] == rows[None, :]
        keys, values, out = [], [], []
        for i in range(steps):
            emb = embed[jnp.pad(tokens[:, 1 + i:], ((0, 0), (0, 1 + i)))].astype(jnp.float32)
            x = jnp.concatenate([self.attn_norm(emb), self.hidden_norm(g)], axis=-1)
            heads = lambda w, n, x=x: w(x).reshape(bsz, t, n, body.head_dim)  # noqa: E731
            q = rope(heads(self.wq, body.num_heads), positions + i, inv_freq, scale)
            keys.append(rope(heads(self.wk, body.num_kv_heads), positions + i, inv_freq, scale).transpose(0, 2, 1, 3))
            values.append(heads(self.wv, body.num_kv_heads).transpose(0, 2, 1, 3))
            mask = jnp.concatenate([causal] + [diagonal] * i, axis=-1)[None]
            a = attention(q, jnp.concatenate(keys, 2), jnp.concatenate(values, 2), mask)
            x = (self.hidden_norm(g) if self.cfg.norm_before_residual else g) + self.wo(a)
            hm = self.mlp_norm(x)
            g = x + self.w_down(jax.nn.silu(self.w_gate(hm)) * self.w_up(hm))
            out.append(self.lm_head(self.norm(g)))
        return jnp.stack(out, axis=1)


def load_into(model: Midlayer, params: dict) -> None:
    """Our params pytree (checkpoint layout) into the module: the name map a published checkpoint would need too."""
    lp = params["layer"]
    for name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
        getattr(model, name).kernel.value = jnp.asarray(lp[name], jnp.float32)
    for name in ("attn_norm", "hidden_norm", "mlp_norm"):
        getattr(model, name).scale.value = jnp.asarray(lp[name], jnp.float32)
    model.fc.kernel.value = jnp.asarray(params["fc"], jnp.float32)
    model.norm.scale.value = jnp.asarray(params["norm"], jnp.float32)
    model.lm_head.kernel.value = jnp.asarray(params["lm_head"], jnp.float32)


def interleaved_ms(steps: dict, repeats: int) -> dict:
    """Median ms of each step function, called in turn (so a busy machine slows both alike); first calls compile."""
    for step in steps.values():
        jax.block_until_ready(step())
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            t0 = time.perf_counter()
            jax.block_until_ready(step())
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: round(float(np.median(t)), 1) for name, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments.ablations.flax_side_by_side", description=__doc__)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3, help="TTT steps")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args(argv)
    target = load_target()
    drafter = eagle3.load(target)
    cfg, embed = drafter.cfg, drafter.embed
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), drafter.params)
    rng = np.random.default_rng(0)
    n_feat = len(cfg.feature_layers)
    feats = jnp.asarray(rng.normal(size=(args.batch, args.tokens, n_feat * cfg.body.hidden_size)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, target.cfg.vocab_size, (args.batch, args.tokens)), jnp.int32)
    labels = jnp.asarray(rng.integers(0, cfg.draft_vocab_size, (args.batch, args.steps, args.tokens)), jnp.int32)
    batch, frozen = {"feats": feats, "tokens": tokens, "labels": labels}, {"embed": embed}

    def ce(logits: jax.Array, labels: jax.Array) -> jax.Array:
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def ours_loss(p, b, fz):
        return ce(eagle3.eagle3_train_logits(p, cfg, fz["embed"], b["feats"], b["tokens"], args.steps),
                  b["labels"]), ()

    model = Midlayer(cfg, n_feat, nnx.Rngs(0))
    load_into(model, params)
    want = eagle3.eagle3_train_logits(params, cfg, embed, feats, tokens, args.steps)
    got = model(embed, feats, tokens, args.steps)
    parity = float(jnp.max(jnp.abs(want - got)))

    tx = optimizer(1e-4, 1000)
    update = make_update(ours_loss, tx)
    state = {"params": params, "opt": tx.init(params)}

    def ours_step():
        state["params"], state["opt"], loss, _ = update(state["params"], state["opt"], batch, frozen)
        return loss

    opt = nnx.Optimizer(model, tx, wrt=nnx.Param)

    @nnx.jit
    def nnx_update(model: Midlayer, opt: nnx.Optimizer, b: dict, embed: jax.Array) -> jax.Array:
        loss, grads = nnx.value_and_grad(lambda m: ce(m(embed, b["feats"], b["tokens"], args.steps),
                                                      b["labels"]))(model)
        opt.update(model, grads)
        return loss

    times = interleaved_ms({"ours (jax.jit + optax)": ours_step,
                            "flax.nnx (nnx.jit + nnx.Optimizer)": lambda: nnx_update(model, opt, batch, embed)},
                           args.repeats)
    # the same updates from the same weights: the two losses after the timed steps agree
    loss_gap = abs(float(ours_step()) - float(nnx_update(model, opt, batch, embed)))
    lines = {"ours: eagle3_train_logits + midlayer_qkv + midlayer_out + draft_logits":
             sum(len(inspect.getsource(f).splitlines()) for f in (eagle3.eagle3_train_logits, eagle3.midlayer_qkv,
                                                                  eagle3.midlayer_out, eagle3.draft_logits)),
             "nnx: Midlayer + load_into": len(inspect.getsource(Midlayer).splitlines())
             + len(inspect.getsource(load_into).splitlines())}
    print(json.dumps({"shape": vars(args), "device": jax.devices()[0].device_kind,
                      "max_abs_logit_diff": parity, "loss_gap_after_steps": loss_gap,
                      "train_step_ms": times,
                      "lines": lines}, indent=1))


if __name__ == "__main__":
    main()
