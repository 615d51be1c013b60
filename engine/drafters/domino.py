"""Domino: a causal correction head on a DFlash block (SpecForge / vLLM speculators `projector_type: "domino"`).

DFlash drafts a block in one non-causal pass, so draft j never sees drafts 1..j-1 and can repeat or contradict
them. Domino runs a bias-free GRU over the embeddings of the block's tokens (the anchor, then the drafts so far)
and adds a low-rank logit delta from [drafter hidden row ; GRU state] to the base logits:

    logits_j = base_j + [j > P] * proj_out(silu(proj_in([h_j ; g_{j-1}])))      for draft j = 1..K

h_j is the drafter's final-normed row that predicts token j (block row j, or row j-1 with shift_label), g_i the
GRU state after block tokens 0..i, and P = pure_draft_prefix_len (drafts 1..P keep their base logits). Drafting is
a short sequential rollout (each draft feeds the GRU); training is teacher forced on the true block tokens,
which equals the rollout along every accepted prefix.

Tensors (PyTorch names and [out, in] shapes): prefix_gru.weight_ih_l0 [3G, H], prefix_gru.weight_hh_l0 [3G, G]
(gates r, z, n, as torch.nn.GRU), embed_proj.0.weight [E, H + G], embed_proj.2.weight [Vd, E] (Vd: the logits the
drafter's head produces). Early SpecForge checkpoints put both under `logit_head.`.
Params: gru_ih [H, 3G], gru_hh [G, 3G], proj_in [H + G, E], proj_out [E, Vd].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from ..weights import DTYPES
from .base import DrafterError

TENSORS = {"gru_ih": "prefix_gru.weight_ih_l0", "gru_hh": "prefix_gru.weight_hh_l0",
           "proj_in": "embed_proj.0.weight", "proj_out": "embed_proj.2.weight"}
LEGACY_PREFIX = "logit_head."


@dataclass(frozen=True)
class Domino:
    """The head's static shape: P = prefix_len drafts without correction, bottleneck emb_dim, GRU width."""

    prefix_len: int
    emb_dim: int
    gru_hidden: int


def gru_cell(p: dict, x: jax.Array, g: jax.Array) -> jax.Array:
    """One bias-free GRU step (torch.nn.GRU's equations): input x [..., H], state g [..., G] -> new state."""
    ir, iz, in_ = jnp.split(x @ p["gru_ih"], 3, axis=-1)
    hr, hz, hn = jnp.split(g @ p["gru_hh"], 3, axis=-1)
    r, z = jax.nn.sigmoid(ir + hr), jax.nn.sigmoid(iz + hz)
    return (1.0 - z) * jnp.tanh(in_ + r * hn) + z * g


def gru_states(p: dict, x: jax.Array) -> jax.Array:
    """GRU states after each input, from a zero state: x [..., T, H] -> [..., T, G]."""
    g0 = jnp.zeros((*x.shape[:-2], p["gru_hh"].shape[0]), x.dtype)

    def step(g, xt):
        g = gru_cell(p, xt, g)
        return g, g

    _, states = jax.lax.scan(step, g0, jnp.moveaxis(x, -2, 0))
    return jnp.moveaxis(states, 0, -2)


def correction(p: dict, h: jax.Array, g: jax.Array) -> jax.Array:
    """The logit delta [..., Vd] of drafter rows h [..., H] given GRU states g [..., G]."""
    return jax.nn.silu(jnp.concatenate([h, g.astype(h.dtype)], axis=-1) @ p["proj_in"]) @ p["proj_out"]


def teacher_logits(p: dict, dom: Domino, base: jax.Array, rows: jax.Array, block_embeds: jax.Array) -> jax.Array:
    """Corrected logits of drafts 1..K with the true block tokens: base [..., K, Vd] and rows [..., K, H] of drafts
    1..K, block_embeds [..., K, H] the embeddings of block tokens 0..K-1 (anchor first). Columns of base past Vd
    (such as dflash.hint_column's) keep their logits."""
    g = gru_states(p, block_embeds)  # g[..., i] after tokens 0..i: what draft i+1 sees
    if dom.prefix_len >= base.shape[-2]:
        return base
    tail = corrected(p, base[..., dom.prefix_len:, :], rows[..., dom.prefix_len:, :], g[..., dom.prefix_len:, :])
    return jnp.concatenate([base[..., :dom.prefix_len, :], tail], axis=-2)


def corrected(p: dict, base: jax.Array, h: jax.Array, g: jax.Array) -> jax.Array:
    """base [..., V'] plus the correction of rows h given states g on its first Vd columns."""
    delta = correction(p, h, g)
    return jnp.concatenate([base[..., :delta.shape[-1]] + delta, base[..., delta.shape[-1]:]], axis=-1)


def rollout(p: dict, dom: Domino, base: jax.Array, rows: jax.Array, anchor_embeds: jax.Array,
            draft_step: Callable[[int, jax.Array], tuple[jax.Array, jax.Array]]) -> jax.Array:
    """Drafting: logits [B, K, V'] of drafts 1..K, each draft fed to the GRU before the next. base [B, K, Vd],
    rows [B, K, H], anchor_embeds [B, H]; draft_step(j, corrected logits of draft j+1 [B, Vd]) -> (its final
    logits [B, V'], the embeddings [B, H] of the token it drafts), so the GRU sees what is drafted however it is
    picked (argmax, a preferred hint)."""
    g = gru_cell(p, anchor_embeds, jnp.zeros((base.shape[0], p["gru_hh"].shape[0]), anchor_embeds.dtype))
    out = []
    for j in range(base.shape[1]):  # K is small and static: unrolled
        logits, drafted = draft_step(j, base[:, j] if j < dom.prefix_len else corrected(p, base[:, j], rows[:, j], g))
        out.append(logits)
        if j + 1 < base.shape[1]:
            g = gru_cell(p, drafted, g)
    return jnp.stack(out, axis=1)


def shapes(dom: Domino, hidden: int, vocab: int) -> dict[str, tuple[int, int]]:
    """HF [out, in] shape of each tensor (see TENSORS)."""
    g, e = dom.gru_hidden, dom.emb_dim
    return {"gru_ih": (3 * g, hidden), "gru_hh": (3 * g, g), "proj_in": (e, hidden + g), "proj_out": (vocab, e)}


def load(tensors: dict[str, np.ndarray], dom: Domino, hidden: int, vocab: int, dtype: str, path) -> tuple[dict, set]:
    """(params, the tensor names read) of the head from a checkpoint's tensors (legacy `logit_head.` names too)."""
    params, read = {}, set()
    for key, (out, inp) in shapes(dom, hidden, vocab).items():
        name = next((n for n in (TENSORS[key], LEGACY_PREFIX + TENSORS[key]) if n in tensors), TENSORS[key])
        a = tensors.get(name)
        if a is None or a.shape != (out, inp):
            raise DrafterError(f"Domino tensor {TENSORS[key]} in {path} must be [{out}, {inp}] (emb_dim "
                               f"{dom.emb_dim}, gru_hidden_dim {dom.gru_hidden}), got "
                               f"{'none' if a is None else list(a.shape)}")
        params[key] = jnp.asarray(np.asarray(a, np.float32).T, dtype=DTYPES[dtype])
        read.add(name)
    return params, read


def tensors_of(params: dict) -> dict[str, np.ndarray]:
    """The head's checkpoint tensors (PyTorch names, [out, in])."""
    return {TENSORS[key]: np.asarray(params[key], np.float32).T for key in TENSORS}


def init(rng: np.random.Generator, dom: Domino, hidden: int, vocab: int, dtype: str) -> dict:
    """A fresh head: GRU weights U(-1/sqrt(G), 1/sqrt(G)) (torch's default), proj_in N(0, 0.02), proj_out zero, so
    the corrected drafter starts as its base drafter."""
    bound = dom.gru_hidden ** -0.5
    s = {k: v[::-1] for k, v in shapes(dom, hidden, vocab).items()}  # [in, out]
    params = {"gru_ih": rng.uniform(-bound, bound, s["gru_ih"]), "gru_hh": rng.uniform(-bound, bound, s["gru_hh"]),
              "proj_in": rng.normal(0.0, 0.02, s["proj_in"]), "proj_out": np.zeros(s["proj_out"])}
    return {k: jnp.asarray(v.astype(np.float32), dtype=DTYPES[dtype]) for k, v in params.items()}
