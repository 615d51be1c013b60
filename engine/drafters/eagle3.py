"""`eagle3`: EAGLE-3 drafting (one Llama decoder layer over [embedding ; target features]; dflash.md section 8).

Feature layers: EAGLE-3 reads the INPUTS of target layers (2, N//2, N-3); published configs list
such input-of-layer ids in `eagle_config.eagle_aux_hidden_state_layer_ids`. The engine captures layer
OUTPUTS (id L = output of layer L, -1 = embeddings), so feature_layers = published ids - 1, i.e.
(1, N//2-1, N-4) by default. save_eagle3 writes published (input-of-layer) ids back.

Alignment (the EAGLE convention). Drafter row t sits at position t and reads (token t+1, g_t),
g_t = fc(concat of the target features of position t); it predicts token t+2. In the engine the
anchor x_p (last committed token, position p) has no feature yet; the features of 0..p-1 came through
extend(). propose(tokens) runs, inside one jitted function (K = k passes):
    pass 0: rows p-W..p-1 (W = K+1) = (tokens[r+1], g_r) at positions r; their K/V go into the cache
            and row p-1 = (x_p, g_{p-1}) attends to cache rows <= p-1               -> d_1
    pass j: row p-1+j = (d_j, h_{j-1}) at position p-1+j, attending rows <= p-1+j    -> d_{j+1}
h_{j-1} being the previous pass's pre-norm output ("residual"). The drafter keeps its own causal
K/V cache [B, Nkv, S, D] for a batch, each sequence at its own (ragged) positions; each pass runs the
whole batch. extend() writes the K/V of rows whose next token it already knows (the
prompt's, during prefill) and keeps the fc features of the last W rows; after a verify step the
new rows p..p+a (a accepted) have next tokens known only at the next propose (accepted drafts, then
the bonus), so pass 0 (re)computes the last W rows from the committed `tokens` (rewriting rows
already written gives the same K/V). Drafted rows p.. are rewritten before any read, so rejected
drafts never leak. Training uses the same alignment (eagle3_train_logits / eagle3_labels).

Checkpoint formats (config_from_json / load_params): EAGLE / SpecForge (`LlamaForCausalLMEagle3`, layer keys at the
top level, aux ids in eagle_config or at the top, tensors midlayer.*) and speculators (`speculators_model_type:
"eagle3"`, layer keys in transformer_layer_config, speculators_config's greedy proposal gives the default K and its
verifier the target architecture, tensors layers.0.*). Unknown keys and tensors are refused.

Params (matrices [in, out], norms float32; d2t is kept apart because it is integer data):
    fc [F*Ht, H]; norm [H]; lm_head [H, Vd]; optional embed [V, H] (else the target's);
    layer: attn_norm (input_layernorm), hidden_norm [H], wq [2H, Nh*D], wk/wv [2H, Nkv*D], wo, mlp_norm,
           w_gate, w_up, w_down
    d2t [Vd] int64: target id = draft id + d2t[draft id] (read once into a vocab.DraftVocab)
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ..cache import take_rows
from ..ops import attention, linear, rms_norm, rope, write
from ..sharding import fetch
from ..target import Target
from .base import DrafterError, Proposal, check_k
from .eagle3_checkpoint import load_params
from .eagle3_config import DEFAULT_CHECKPOINT, DEFAULT_K, MAX_K, Eagle3Config, check_fit, config_from_json
from .layers import (
    anchors_of,
    cache_zeros,
    check_extend,
    check_hidden,
    check_layer_ids,
    checkpoint_dir,
    concat_features,
    greedy_pick,
    on_mesh,
    read_config,
)
from .vocab import DraftVocab, from_d2t


@dataclass(frozen=True)
class Eagle3State:
    """One generation's drafter state for a batch of B sequences.

    k, v [B, Nkv, S, D]: the drafter's K/V cache, rows < done[b] of sequence b valid. window [B, W, H]: fc
    features of rows length-W..length-1 (zeros before row 0). lengths [B]: feature rows received (= the anchor
    position at propose). prompts: the prompt ids, whose rows extend() writes at once.
    """

    k: jax.Array
    v: jax.Array
    window: jax.Array
    lengths: np.ndarray
    done: np.ndarray
    prompts: list[np.ndarray]

    def take(self, rows: jax.Array) -> Eagle3State:
        """The state of batch rows `rows` [B'] only (the engine drops finished sequences)."""
        k, v, window = take_rows((self.k, self.v, self.window), rows)
        index = np.asarray(rows)
        return Eagle3State(k, v, window, self.lengths[index], self.done[index], [self.prompts[i] for i in index])


def midlayer_qkv(params: dict, cfg: Eagle3Config, emb: jax.Array, g: jax.Array,
                 positions: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Attention inputs of rows (token embedding emb [B, T, H], hidden g [B, T, H]) at positions [B, T].

    q [B, T, Nh, D] and k, v [B, Nkv, T, D] (q, k rotated), from concat[input_layernorm(emb), hidden_norm(g)].
    """
    lp, body = params["layer"], cfg.body
    b, t, _ = emb.shape
    x = jnp.concatenate([rms_norm(emb, lp["attn_norm"], body.rms_eps), rms_norm(g, lp["hidden_norm"], body.rms_eps)],
                        axis=-1)
    inv_freq, scale = jnp.asarray(body.inv_freq()), body.attention_factor()
    q = rope(linear(x, lp["wq"]).reshape(b, t, body.num_heads, body.head_dim), positions, inv_freq, scale)
    k = rope(linear(x, lp["wk"]).reshape(b, t, body.num_kv_heads, body.head_dim), positions, inv_freq, scale)
    v = linear(x, lp["wv"]).reshape(b, t, body.num_kv_heads, body.head_dim)
    return q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)


def midlayer_out(params: dict, cfg: Eagle3Config, g: jax.Array, attn: jax.Array) -> jax.Array:
    """Residual + o_proj(attn [B, T, Nh*D]), then the MLP block -> pre-norm output hidden [B, T, H]."""
    lp, body = params["layer"], cfg.body
    x = (rms_norm(g, lp["hidden_norm"], body.rms_eps) if cfg.norm_before_residual else g) + linear(attn, lp["wo"])
    h = rms_norm(x, lp["mlp_norm"], body.rms_eps)
    return x + linear(jax.nn.silu(linear(h, lp["w_gate"])) * linear(h, lp["w_up"]), lp["w_down"])


def draft_logits(params: dict, cfg: Eagle3Config, h: jax.Array) -> jax.Array:
    """Pre-norm hidden [..., H] -> draft-vocab logits [..., Vd]."""
    return linear(rms_norm(h, params["norm"], cfg.body.rms_eps), params["lm_head"])


@partial(jax.jit, static_argnames=("cfg", "write_kv"), donate_argnames=("cache_k", "cache_v", "window"))
def extend_rows(params: dict, embed: jax.Array, cache_k: jax.Array, cache_v: jax.Array, window: jax.Array,
                features: jax.Array, next_tokens: jax.Array, starts: jax.Array, n_new: jax.Array, *,
                cfg: Eagle3Config, write_kv: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Take feature rows starts[b]..starts[b]+T-1 of each sequence (features [F, B, T, Ht], the first n_new[b]
    verified).

    Slides each sequence's n_new[b] new fc features into window [B, W, H]; with write_kv, also writes the K/V of
    rows (next_tokens [B, T], fc feature) at positions starts[b].. (rows without a known next token hold
    placeholders that propose rewrites). Returns cache_k, cache_v, window.
    """
    g = linear(concat_features(features), params["fc"])
    slide = lambda rows, n: jax.lax.dynamic_slice_in_dim(rows, n, window.shape[1], axis=0)  # noqa: E731
    window = jax.vmap(slide)(jnp.concatenate([window, g], axis=1), n_new)
    if write_kv:
        positions = starts[:, None] + jnp.arange(g.shape[1], dtype=jnp.int32)[None]
        _, k, v = midlayer_qkv(params, cfg, embed[next_tokens].astype(jnp.float32), g, positions)
        cache_k, cache_v = write(cache_k, k, starts), write(cache_v, v, starts)
    return cache_k, cache_v, window


@partial(jax.jit, static_argnames=("cfg", "k"), donate_argnames=("cache_k", "cache_v"))
def draft(params: dict, embed: jax.Array, vocab: DraftVocab, cache_k: jax.Array, cache_v: jax.Array,
          window: jax.Array, window_tokens: jax.Array, ends: jax.Array, *, cfg: Eagle3Config, k: int):
    """k greedy draft passes over a batch; pass 0 runs each sequence's rows ends[b]-W+1..ends[b] (window
    [B, W, H], their next tokens window_tokens [B, W]; rows < 0 are not written), ends[b] = p_b - 1.

    Returns ids [B, k] (target ids), q [B, k] (drafter probability), logits [B, k, Vd], cache_k, cache_v.
    """
    s, w = cache_k.shape[2], window.shape[1]
    put = jax.vmap(lambda cache, rows, at: cache.at[:, at].set(rows.astype(cache.dtype), mode="drop"))

    def run(cache_k, cache_v, tokens, g, positions):
        """Write rows (tokens [B, n], g [B, n, H]) at positions [B, n], then each last row's pre-norm output."""
        q, k_rows, v_rows = midlayer_qkv(params, cfg, embed[tokens].astype(jnp.float32), g, positions)
        at = jnp.where(positions >= 0, positions, s)  # out of range: dropped
        cache_k, cache_v = put(cache_k, k_rows, at), put(cache_v, v_rows, at)
        mask = (jnp.arange(s)[None] <= positions[:, -1:])[:, None, :]
        return cache_k, cache_v, midlayer_out(params, cfg, g[:, -1:], attention(q[:, -1:], cache_k, cache_v, mask))

    def pick(h):
        logits = draft_logits(params, cfg, h)[:, 0]
        best, prob = greedy_pick(logits)
        return vocab.ids[best], prob, logits

    cache_k, cache_v, h = run(cache_k, cache_v, window_tokens, window,
                              ends[:, None] - (w - 1) + jnp.arange(w, dtype=jnp.int32))
    token, prob, logits = pick(h)
    b = ends.shape[0]
    init = (cache_k, cache_v, token, h, jnp.zeros((b, k), jnp.int32).at[:, 0].set(token),
            jnp.zeros((b, k), jnp.float32).at[:, 0].set(prob),
            jnp.zeros((b, k, cfg.draft_vocab_size)).at[:, 0].set(logits))

    def step(j, carry):
        cache_k, cache_v, token, h, ids, qs, all_logits = carry
        cache_k, cache_v, h = run(cache_k, cache_v, token[:, None], h, (ends + j)[:, None])
        token, prob, logits = pick(h)
        return (cache_k, cache_v, token, h, ids.at[:, j].set(token), qs.at[:, j].set(prob),
                all_logits.at[:, j].set(logits))

    cache_k, cache_v, _, _, ids, qs, all_logits = jax.lax.fori_loop(1, k, step, init)
    return ids, qs, all_logits, cache_k, cache_v


def eagle3_train_logits(params: dict, cfg: Eagle3Config, embed: jax.Array, features: jax.Array, tokens: jax.Array,
                        steps: int = 1) -> jax.Array:
    """Teacher-forced forward with training-time test (TTT) over `steps` draft steps: logits [B, steps, T, Vd].

    features [B, T, F*Ht] (feature_layers concatenated), tokens [B, T], embed [V, H] (params["embed"] if
    the drafter has its own, else the target's). logits[:, i, t] is step i of a draft started at row t:
    step 0 reads (tokens[t+1], fc(features[t])) at position t; step i reads (tokens[t+1+i], step i-1's
    output at t) at position t+i, attending to step-0 rows <= t and its own earlier steps at t, exactly
    as propose() does after the anchor tokens[t+1]. Targets: eagle3_labels (tokens[t+2+i]).
    """
    b, t = tokens.shape
    g = linear(features, params["fc"])
    rows = jnp.arange(t)
    positions = jnp.broadcast_to(rows, (b, t))
    causal, diagonal = rows[:, None] >= rows[None, :], rows[:, None] == rows[None, :]
    keys, values, out = [], [], []
    for i in range(steps):
        next_tokens = jnp.pad(tokens[:, 1 + i:], ((0, 0), (0, 1 + i)))
        q, k, v = midlayer_qkv(params, cfg, embed[next_tokens].astype(jnp.float32), g, positions + i)
        keys.append(k)
        values.append(v)
        mask = jnp.concatenate([causal] + [diagonal] * i, axis=-1)[None]
        g = midlayer_out(params, cfg, g, attention(q, jnp.concatenate(keys, 2), jnp.concatenate(values, 2), mask))
        out.append(draft_logits(params, cfg, g))
    return jnp.stack(out, axis=1)


def eagle3_labels(tokens: jax.Array, t2d: jax.Array, steps: int = 1) -> tuple[jax.Array, jax.Array]:
    """Targets of eagle3_train_logits: draft ids of tokens[t+2+i] [B, steps, T], valid where that token
    exists and is in the draft vocab (t2d [V]: DraftVocab.slots)."""
    t = tokens.shape[1]
    idx = jnp.arange(t)[None, :] + 2 + jnp.arange(steps)[:, None]  # [steps, T]
    labels = t2d[tokens[:, jnp.minimum(idx, t - 1)]]
    valid = (idx < t)[None] & (labels >= 0)
    return jnp.where(valid, labels, 0), valid


class Eagle3Drafter:
    """The engine-facing drafter: start / extend / propose over an Eagle3State.

    extend() and propose() donate the cache buffers of the state they are given: keep only the state
    they return.
    """

    name = "eagle3"

    def __init__(self, target: Target, cfg: Eagle3Config, params: dict, d2t: np.ndarray, k: int | None = None,
                 checkpoint: str | None = None):
        self.vocab = from_d2t(d2t, target.cfg.vocab_size, "EAGLE-3")
        check_fit(cfg, params, self.vocab, target.cfg)
        self.cfg, self.params = cfg, on_mesh(params, target.mesh, cfg.body)
        self.embed = self.params.get("embed", target.params["embed"])
        self.mesh = target.mesh
        self.k, self.max_k = check_k((cfg.default_k or DEFAULT_K) if k is None else k, MAX_K, self.name), MAX_K
        self.feature_layers = cfg.feature_layers
        self.checkpoint = checkpoint

    def with_k(self, k: int) -> Eagle3Drafter:
        """The same drafter (shared params) drafting k tokens per step."""
        other = copy.copy(self)
        other.k = check_k(k, MAX_K, self.name)
        return other

    def start(self, prompts: list[np.ndarray], max_len: int) -> Eagle3State:
        body, dtype, batch = self.cfg.body, self.params["fc"].dtype, len(prompts)
        window = jnp.zeros((batch, self.k + 1, body.hidden_size), jnp.float32)
        cache = lambda: cache_zeros(body, batch, max_len, dtype, self.mesh)  # noqa: E731
        zero = np.zeros(batch, np.int32)
        return Eagle3State(cache(), cache(), window, zero, zero, [np.asarray(p, np.int32) for p in prompts])

    def extend(self, state: Eagle3State, features: jax.Array, n_new: np.ndarray) -> Eagle3State:
        n_new, rows = np.asarray(n_new, np.int32), features.shape[2]
        check_extend(state.lengths, n_new, rows, state.k.shape[2])
        starts, next_tokens = state.lengths, np.zeros((len(n_new), rows), np.int32)
        n_known = np.zeros_like(n_new)
        for b, (prompt, start, n) in enumerate(zip(state.prompts, starts, n_new, strict=True)):
            known = prompt[start + 1:start + 1 + n]  # next tokens of prompt rows
            next_tokens[b, :len(known)], n_known[b] = known, len(known)
        k, v, window = extend_rows(self.params, self.embed, state.k, state.v, state.window, features, next_tokens,
                                   starts, n_new, cfg=self.cfg, write_kv=bool(n_known.any()))
        done = np.where(state.done == starts, starts + n_known, state.done)
        return Eagle3State(k, v, window, starts + n_new, done, state.prompts)

    def propose(self, state: Eagle3State, tokens: list[list[int]]) -> tuple[Proposal, Eagle3State]:
        _, positions = anchors_of(tokens, state.lengths)
        w = state.window.shape[1]
        if (positions - state.done).max() > w:
            raise DrafterError(f"{(positions - state.done).max()} feature rows arrived since the last propose; "
                               f"EAGLE-3 with K={self.k} catches up at most {w}")
        next_ids = np.maximum(positions[:, None] - w + 1 + np.arange(w), 0)  # rows p-W..p-1 read tokens p-W+1..p
        window_tokens = np.array([[seq[i] for i in row] for seq, row in zip(tokens, next_ids, strict=True)], np.int32)
        ids, q, _, k, v = draft(self.params, self.embed, self.vocab, state.k, state.v, state.window, window_tokens,
                                positions - 1, cfg=self.cfg, k=self.k)
        ids, q = fetch((ids, q))
        n = np.where(positions > 0, self.k, 0).astype(np.int32)  # position 0: no target feature to draft from
        return Proposal(ids, n, q), replace(state, k=k, v=v, done=positions)


def load(target: Target, path: str | Path | None = None, k: int | None = None, **options) -> Eagle3Drafter:
    """An EAGLE-3 drafter from a checkpoint directory, EAGLE / SpecForge or speculators format (None: the shipped
    SmolLM2-135M drafter)."""
    path = checkpoint_dir(path, DEFAULT_CHECKPOINT, "EAGLE-3", options)
    cfg = config_from_json(read_config(path), target.cfg.num_layers)
    if cfg.target_hidden_size is None:  # features as wide as the drafter: check that before reading tensors
        check_hidden(cfg.body.hidden_size, target.cfg, "EAGLE-3")
    check_layer_ids(cfg.feature_layers, target.cfg.num_layers, "EAGLE-3")
    params, d2t = load_params(path, cfg, target.dtype)
    return Eagle3Drafter(target, cfg, params, d2t, k=k, checkpoint=str(path))
