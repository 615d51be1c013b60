"""Drafter doctor: test a target + drafter pair for the known causes of low acceptance.

Over 500 lines: one catalogue of checks, each with its variants, measurement and verdict rule side by side,
so a check reads in one place (the report's identity and formats, at the end, are the part that could move out).

    python -m experiments.doctor --drafter dflash [--target PATH] [--prompts gsm8k|FILE] [--limit 12] [--json]

Every check measures the pair as configured and one or more variants on the same prompts and reports tau and
the per-position acceptance P(accepted >= i) of each. Each arm's prompts are decoded greedily by the engine
(lossless: arms on the same target and prompts share one decoding); its tau is tau_est = 1 + mean(accepted run)
of the arm's drafter at EVERY anchor of that greedy continuation whose whole block lies inside it: what the engine
accepts at those anchors (the `train_serve` check proves the two agree on the engine's own anchors), with about
twice the anchors of one engine run and, for drafter-side variants
(taps, mask, head, rope) that leave the continuation unchanged, paired anchor for anchor. The engine's own tau
is kept beside it (`engine_tau`); it reads lower, since the engine's anchors sit right after rejections, where
drafting is harder, so arms are compared by tau_est only. A variant that accepts clearly more is a `fault`: its
mean per-prompt gain must exceed the 95 % t margin of the per-prompt differences (greedy runs are deterministic,
so the noise is prompt-to-prompt variation) and MIN_EFFECT of the configured tau. A gain of RESOLVE_TAU or more
that the margin cannot tell from noise is `unresolved`, with about how many prompts would tell. Checks:

- chat_template: prompts chat-formatted against raw (whichever the pair does not use);
- thinking: the template's thinking mode on against off (only templates that take `enable_thinking`);
- taps: target layer ids as configured against all shifted by -1 and by +1, and against the ids the checkpoint's
  card (training.json) says it was trained with: configured ids that differ from those are a fault however small
  the measured gap;
- mask_token: the configured DFlash mask id against the tokenizer's mask token and the engine's default mask;
- shared_head: an EAGLE-3 drafter's own LM head against the target's (DFlash ships none: nothing to swap);
- dtype: the target in float32 against bfloat16;
- rope: the drafter's RoPE as configured against the target's (when they differ);
- train_serve: tau_est, the offline training metric, at the engine's own anchors of the self-distilled greedy
  continuations against the engine's tau on the same steps; they must agree (a gap either way is the fault);
- temperature: the user's temperature against 0 (engine tau: sampled acceptance has no offline twin), reported as
  `info`: sampling is expected to accept less than greedy.

Variants are written as modified copies of the checkpoint directory (config.json edited, tensors copied) and
loaded through the public loaders. A check that does not apply to the pair is `not applicable`, one whose variant
fails to load `inconclusive`, each with the reason.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats as scipy_stats

from engine import load_target
from engine.config import CheckpointError
from engine.decode import generate_batch
from engine.drafters import DrafterError, dflash_checkpoint, eagle3_config, load_drafter
from engine.drafters.layers import read_tensors, save_checkpoint
from engine.target import Target
from experiments import suites
from experiments.data.distill import target_features
from experiments.training.objectives import dflash_runs, eagle3_runs
from experiments.training.sequences import Sequences, add_hints, batch_of
from storage.digest import sha256

CHECKS = ("chat_template", "thinking", "taps", "mask_token", "shared_head", "dtype", "rope", "train_serve",
          "temperature")
# ok / fault; unresolved: a gain of RESOLVE_TAU or more inside the noise margin (more prompts would tell); info:
# a difference that is expected (sampling); not applicable: the check cannot apply to the pair; inconclusive: a
# variant that could not be measured
VERDICTS = ("ok", "fault", "unresolved", "info", "not applicable", "inconclusive")
MIN_EFFECT = 0.03  # a fault must also move tau by at least this fraction of the configured tau
RESOLVE_TAU = 0.1  # a gain this large that the margin cannot tell from noise is reported as unresolved
DEFAULT_SUITES = ("gsm8k", "humaneval", "mtbench")
PACKAGES = ("jax", "jaxlib", "numpy", "transformers", "safetensors", "duckdb")


class DoctorError(ValueError):
    """Bad doctor input (no prompts, unreadable prompt file); the message says what to change."""


# ---------------------------------------------------------------- measurements


def per_position_of(accepted, k: int) -> list[float]:
    """P(accepted >= i) for i = 1..k over steps' accepted lengths (1 + their sum is tau when every step drafts k)."""
    accepted = np.asarray(accepted)
    return [round(float((accepted >= i).mean()), 4) if len(accepted) else 0.0 for i in range(1, k + 1)]


def summary(runs: list, k: int, engine_tau: float | None = None) -> dict:
    """tau (mean over prompts of 1 + mean accepted run), per-prompt tau and per-position acceptance of per-prompt
    accepted runs; engine_tau: the engine's own tau of the same runs, when there is one."""
    per_prompt = [1 + float(np.mean(r)) if len(r) else None for r in runs]  # None: no anchor (a very short output)
    return {"tau": float(np.mean([x for x in per_prompt if x is not None])), "per_prompt": per_prompt,
            "engine_tau": engine_tau,
            "per_position": per_position_of(np.concatenate([np.asarray(r, int) for r in runs]), k)}


def engine_summary(results: list, k: int) -> dict:
    """The engine's tau (len(output) / steps, mean over prompts) and per-position acceptance of a run."""
    per_prompt = [float(r.stats["tau"]) for r in results]
    return {"tau": float(np.mean(per_prompt)), "per_prompt": per_prompt, "engine_tau": float(np.mean(per_prompt)),
            "per_position": per_position_of([s.accepted for r in results for s in r.steps], k)}


def paired(base: list[float], variant: list[float], two_sided: bool = False) -> dict:
    """Mean per-prompt difference variant - base over the prompts both measured, its 95 % t margin, and whether
    it is a fault: a gain (or for two_sided any gap) beyond both the margin and MIN_EFFECT of the base tau."""
    pairs = [(b, v) for b, v in zip(base, variant, strict=True) if b is not None and v is not None]
    if not pairs:
        return {"diff": None, "margin": None, "fault": False}
    d = np.array([v - b for b, v in pairs])
    n, mean = len(d), float(d.mean())
    if n < 2:
        return {"diff": round(mean, 4), "margin": None, "fault": False}  # one prompt: no noise estimate
    margin = float(scipy_stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n))
    size = abs(mean) if two_sided else mean
    fault = bool(size > margin and size > MIN_EFFECT * float(np.mean([b for b, _ in pairs])))
    out = {"diff": round(mean, 4), "margin": round(margin, 4), "fault": fault}
    if not fault and size >= RESOLVE_TAU:  # the margin shrinks as 1/sqrt(n): the prompts it would take to tell
        out["prompts_needed"] = math.ceil(n * (margin / size) ** 2) + 1
    return out


def row(check: str, variant: str, m: dict | None, verdict: str, detail: str = "", cmp: dict | None = None,
        configured: bool = False) -> dict:
    """One report row (plain data: JSON and DuckDB keep it as is)."""
    return {"check": check, "variant": variant, "configured": configured,
            "tau": None if m is None else round(m["tau"], 4),
            "engine_tau": None if m is None or m.get("engine_tau") is None else round(m["engine_tau"], 4),
            "per_position": [] if m is None else list(m["per_position"]),
            "per_prompt": [] if m is None else [None if x is None else round(x, 4) for x in m["per_prompt"]],
            "diff": None if cmp is None else cmp["diff"], "margin": None if cmp is None else cmp["margin"],
            "verdict": verdict, "detail": detail}


def not_applicable(check: str, reason: str) -> list[dict]:
    return [row(check, "-", None, "not applicable", reason)]


def compared(check: str, base_label: str, base: dict, variants: list[tuple[str, dict | str]],
             two_sided: bool = False) -> list[dict]:
    """Rows of a check: the configured measurement, then each variant (a measurement, or the reason it could
    not run) with its paired comparison; the configured row carries the check's verdict."""
    rows, faults, unresolved, measured = [], [], [], 0
    n = sum(x is not None for x in base["per_prompt"])
    for label, m in variants:
        if isinstance(m, str):
            rows.append(row(check, label, None, "inconclusive", m))
            continue
        cmp = paired(base["per_prompt"], m["per_prompt"], two_sided)
        if cmp["diff"] is None:
            rows.append(row(check, label, m, "inconclusive", "no prompt measured in both arms"))
            continue
        measured += 1
        sign = "gap" if two_sided else "gain"
        margin = "no margin from one prompt" if cmp["margin"] is None else f"margin {cmp['margin']:.3f}"
        detail = f"{sign} {cmp['diff']:+.3f} tau_est over {n} prompts ({margin})"
        if cmp["fault"]:
            verdict, faults = "fault", faults + [label]
        elif "prompts_needed" in cmp:
            verdict, unresolved = "unresolved", unresolved + [(label, cmp["prompts_needed"])]
            detail += f": as large as a misconfiguration, inside the noise; about {cmp['prompts_needed']} prompts"
            detail += " would tell"
        else:
            verdict = "ok"
        rows.append(row(check, label, m, verdict, detail, cmp))
    if faults:
        verdict, detail = "fault", f"{', '.join(faults)} accepts clearly {'differently' if two_sided else 'more'}"
    elif unresolved:
        verdict = "unresolved"
        detail = "; ".join(f"{label}: run about {need} prompts to tell" for label, need in unresolved)
    else:
        verdict, detail = ("ok" if measured else "inconclusive"), ""
    return [row(check, base_label, base, verdict, detail, configured=True)] + rows


# ---------------------------------------------------------------- checkpoint variants


def write_variant(src: Path, dst: Path, edit=None, tensors: dict | None = None) -> Path:
    """A copy of checkpoint `src` at `dst`: config.json passed through edit(config) -> config, and the tensors
    copied (or, given `tensors`, those written as bfloat16/int as they are)."""
    dst.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    config = edit(config) if edit else config
    if tensors is None:
        shutil.copyfile(src / "model.safetensors", dst / "model.safetensors")
        (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        return dst
    return save_checkpoint(dst, config, tensors, "bfloat16")


def _section(config: dict, key: str) -> dict:
    """The config dict that holds `key`: the drafter's sub-config when it has it there, else the top level."""
    for sub in ("dflash_config", "eagle_config"):
        if key in (config.get(sub) or {}):
            return config[sub]
    return config


def tap_key(kind: str) -> str:
    return "target_layer_ids" if kind == "dflash" else "eagle_aux_hidden_state_layer_ids"


def shift_taps(kind: str, by: int | None = None, to: list[int] | None = None):
    """A config edit moving the drafter's tap layer ids: all shifted `by`, or set `to` these."""
    def edit(config: dict) -> dict:
        section = _section(config, tap_key(kind))
        if tap_key(kind) not in section:
            raise DrafterError(f"config.json names no {tap_key(kind)} (the loader's default taps are used)")
        section[tap_key(kind)] = list(to) if to is not None else [int(i) + by for i in section[tap_key(kind)]]
        return config
    return edit


def trained_taps(checkpoint: Path) -> list[int] | None:
    """The feature layer ids (the engine's: output of layer i) a checkpoint's card (training.json) says it was
    trained with, when it records them."""
    card = checkpoint / "training.json"
    if not card.is_file():
        return None
    arch = json.loads(card.read_text()).get("architecture") or {}
    taps = arch.get("feature_layers") or arch.get("target_layer_ids")
    return [int(i) for i in taps] if taps else None


def config_taps(kind: str, features: list[int]) -> list[int]:
    """Feature layer ids as the drafter's config.json names them (DFlash: as they are; EAGLE-3: layer inputs)."""
    return eagle3_config.published_layer_ids(features) if kind == "eagle3" else list(features)


def set_mask(mask_id: int):
    def edit(config: dict) -> dict:
        _section(config, "mask_token_id")["mask_token_id"] = int(mask_id)
        return config
    return edit


def set_rope(theta: float, scaling: dict | None):
    def edit(config: dict) -> dict:
        config["rope_theta"] = theta
        config.pop("rope_scaling", None)
        if scaling:
            config["rope_scaling"] = scaling
        return config
    return edit


# ---------------------------------------------------------------- the doctor


class Doctor:
    """Runs the checks; holds the loaded targets (one per dtype) and a memo of measurements, so that checks and
    repeated reports on the same prompts share work."""

    def __init__(self, target: Target, max_new_tokens: int = 64, seed: int = 0):
        self.targets = {target.dtype: target}
        self.base = target
        self.max_new_tokens, self.seed = max_new_tokens, seed
        self._memo: dict = {}

    def target(self, dtype: str) -> Target:
        if dtype not in self.targets:
            self.targets[dtype] = load_target(self.base.path, dtype=dtype)
        return self.targets[dtype]

    def _remember(self, key: tuple, make):
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def generate(self, source: Path, prompts: list[str], *, dtype: str, raw: bool = False, temperature: float = 0.0,
                 k: int | None = None) -> list:
        """Engine results of the drafter at `source` over `prompts` (memoised on the checkpoint's content)."""
        def make():
            target = self.target(dtype)
            return generate_batch(target, prompts, load_drafter(source, target, k=k),
                                  max_new_tokens=self.max_new_tokens, raw=raw, temperature=temperature, seed=self.seed)
        return self._remember(("engine", _content(source), tuple(prompts), dtype, raw, temperature, k), make)

    def continuations(self, source: Path, prompts: list[str], *, dtype: str, raw: bool, k: int | None) -> list:
        """The target's greedy continuations of `prompts`, from the first drafter that decoded them here (greedy
        speculative decoding is lossless: every drafter yields the same tokens), else from `source`'s run."""
        return self._remember(("greedy", tuple(prompts), dtype, raw),
                              lambda: self.generate(source, prompts, dtype=dtype, raw=raw, k=k))

    def measure(self, source: Path, prompts: list[str], *, dtype: str, raw: bool = False, k: int | None = None,
                on: Path | None = None, engine: bool = False) -> dict:
        """tau_est of the drafter at `source` at every anchor of greedy continuations of `prompts`: those the
        drafter at `on` decoded through the engine (anchor for anchor with it), or with `engine` the drafter's own
        engine run (its tau kept as engine_tau), else the shared continuations."""
        def make():
            target = self.target(dtype)
            drafter = load_drafter(source, target, k=k)
            if on is not None or engine:
                results = self.generate(on or source, prompts, dtype=dtype, raw=raw, k=k)
                self._memo.setdefault(("greedy", tuple(prompts), dtype, raw), results)
            else:
                results = self.continuations(source, prompts, dtype=dtype, raw=raw, k=k)
            engine_tau = engine_summary(results, drafter.k)["tau"] if engine else None
            return summary(anchored_runs(target, drafter, results), drafter.k, engine_tau)
        return self._remember(("offline", _content(source), None if on is None else _content(on), engine,
                               tuple(prompts), dtype, raw, k), make)

    def diagnose(self, drafter: str | Path, prompts: list[str], raw: bool = False, temperature: float = 0.0,
                 k: int | None = None, checks: tuple[str, ...] = CHECKS,
                 on_check: Callable[[int, int, str], None] | None = None) -> dict:
        """The report {identity, settings, rows, wall_s} of every check in `checks` for the pair; on_check(i, n,
        check) before each check runs."""
        if not prompts:
            raise DoctorError("no prompts to diagnose with")
        t0 = time.perf_counter()
        loaded = load_drafter(drafter, self.base, k=k)
        if loaded.checkpoint is None:
            raise DoctorError(f"drafter {drafter!r} has no checkpoint to test: give a DFlash or EAGLE-3 drafter")
        rows = []
        with tempfile.TemporaryDirectory(prefix="doctor-") as tmp:
            ctx = _Context(self, loaded, Path(tmp), list(prompts), raw)
            for i, check in enumerate(checks):
                if on_check is not None:
                    on_check(i, len(checks), check)
                rows += getattr(ctx, check)(temperature) if check == "temperature" else getattr(ctx, check)()
        return {"identity": identity(self.base, loaded, drafter), "rows": rows,
                "settings": {"prompts": list(prompts), "max_new_tokens": self.max_new_tokens, "raw": raw,
                             "temperature": temperature, "k": loaded.k, "seed": self.seed, "min_effect": MIN_EFFECT},
                "wall_s": round(time.perf_counter() - t0, 1)}


def _content(source: Path) -> tuple[str, str]:
    """A checkpoint directory's identity for the memo: the hashes of its config and tensors."""
    return sha256(source / "config.json"), sha256(source / "model.safetensors")


class _Context:
    """One diagnosis: the pair as configured and the checks as methods returning report rows."""

    def __init__(self, doctor: Doctor, drafter, tmp: Path, prompts: list[str], raw: bool):
        self.doctor, self.drafter, self.tmp, self.prompts, self.raw = doctor, drafter, tmp, prompts, raw
        self.src, self.k, self.kind, self.target = Path(drafter.checkpoint), drafter.k, drafter.name, doctor.base
        self.served_dtype = self.target.dtype
        self.label = "raw prompts" if raw else "chat template"

    @property
    def base(self) -> dict:
        return self.doctor.measure(self.src, self.prompts, dtype=self.served_dtype, raw=self.raw, k=self.k,
                                   engine=True)

    def variant(self, name: str, edit=None, tensors: dict | None = None) -> dict | str:
        """tau_est of a checkpoint variant on the configured pair's continuations, or why it could not load."""
        try:
            path = write_variant(self.src, self.tmp / name, edit, tensors)
            return self.doctor.measure(path, self.prompts, dtype=self.served_dtype, raw=self.raw, k=self.k, on=self.src)
        except (DrafterError, CheckpointError) as e:
            return f"variant refused by the loader: {e}"

    def chat_template(self) -> list[dict]:
        if not self.target.tokenizer.chat_template:
            return not_applicable("chat_template", "the target's tokenizer has no chat template")
        other = self.doctor.measure(self.src, self.prompts, dtype=self.served_dtype, raw=not self.raw, k=self.k)
        return compared("chat_template", self.label, self.base,
                        [("chat template" if self.raw else "raw prompts", other)])

    def thinking(self) -> list[dict]:
        template = self.target.tokenizer.chat_template or ""
        if self.raw or "enable_thinking" not in template:
            why = "prompts are raw" if self.raw else "the chat template has no thinking mode (enable_thinking)"
            return not_applicable("thinking", why)
        default = [thinking_text(self.target, p, None) for p in self.prompts]
        variants = []
        for flag in (True, False):
            texts = [thinking_text(self.target, p, flag) for p in self.prompts]
            if texts != default:
                m = self.doctor.measure(self.src, texts, dtype=self.served_dtype, raw=True, k=self.k)
                variants.append((f"thinking {'on' if flag else 'off'}", m))
        if not variants:
            return not_applicable("thinking", "enable_thinking does not change the rendered prompts")
        base = self.doctor.measure(self.src, default, dtype=self.served_dtype, raw=True, k=self.k)
        return compared("thinking", "template default", base, variants)

    def taps(self) -> list[dict]:
        configured, trained = list(self.drafter.feature_layers), trained_taps(self.src)
        variants = [(f"taps {by:+d}", self.variant(f"taps{by:+d}", shift_taps(self.kind, by))) for by in (-1, 1)]
        if trained is None or trained == configured:
            return compared("taps", f"as configured {configured}", self.base, variants)
        rows = compared("taps", f"as configured {configured}", self.base,  # the card knows better than the noise
                        [(f"trained with {trained} (its card)",
                          self.variant("taps-card", shift_taps(self.kind, to=config_taps(self.kind, trained))))]
                        + variants)
        rows[0] |= {"verdict": "fault", "detail": f"config.json taps {configured} are not the {trained} its card "
                    "(training.json) says it was trained with" + (f"; {rows[0]['detail']}" if rows[0]["detail"]
                                                                  else "")}
        return rows

    def mask_token(self) -> list[dict]:
        if self.kind != "dflash":
            return not_applicable("mask_token", f"{self.kind} drafts without a mask token")
        tok, configured = self.target.tokenizer, self.drafter.cfg.mask_token_id
        candidates = {}
        if tok.mask_token_id is not None:
            candidates[int(tok.mask_token_id)] = f"tokenizer mask {tok.mask_token!r}"
        try:
            candidates.setdefault(dflash_checkpoint.default_mask_token_id(self.target), "engine default")
        except DrafterError:
            pass
        variants = [(f"{what} {i}", self.variant(f"mask{i}", set_mask(i))) for i, what in candidates.items()
                    if i != configured]
        if not variants:
            return not_applicable("mask_token", f"the configured mask id {configured} is the tokenizer's / engine's "
                                "default mask; there is no other candidate")
        return compared("mask_token", f"configured {configured}", self.base, variants)

    def shared_head(self) -> list[dict]:
        if self.kind != "eagle3":
            return not_applicable("shared_head", f"{self.kind} ships no embedding or LM head: both are the target's, "
                                "as trained")
        tensors = read_tensors(self.src)
        variants = []
        if "embed_tokens.weight" in tensors:
            variants.append(("target embedding", self.variant("embed", tensors={
                k: v for k, v in tensors.items() if k != "embed_tokens.weight"})))
        target_head = np.asarray(self.target.params.get("lm_head", self.target.params["embed"].T), np.float32)
        ids = np.asarray(self.drafter.vocab.ids)
        variants.append(("target LM head", self.variant("head", tensors={**tensors,
                                                                         "lm_head.weight": target_head[:, ids].T})))
        return compared("shared_head", "own LM head", self.base, variants)

    def dtype(self) -> list[dict]:
        other = "bfloat16" if self.served_dtype == "float32" else "float32"
        m = self.doctor.measure(self.src, self.prompts, dtype=other, raw=self.raw, k=self.k)
        return compared("dtype", f"{self.served_dtype} target", self.base, [(f"{other} target", m)])

    def rope(self) -> list[dict]:
        body, t = self.drafter.cfg.body, self.target.cfg
        if (body.rope_theta, body.rope_scaling) == (t.rope_theta, t.rope_scaling):
            return not_applicable("rope", f"the drafter's RoPE (theta {body.rope_theta:g}, scaling "
                                f"{dict(body.rope_scaling) or 'none'}) is the target's")
        config = self.target.path / "config.json"
        if not config.is_file():
            return not_applicable("rope", "the target has no config.json to take its RoPE from")
        hf = json.loads(config.read_text())
        edit = set_rope(float(hf.get("rope_theta", t.rope_theta)), hf.get("rope_scaling"))
        return compared("rope", f"drafter's (theta {body.rope_theta:g})", self.base,
                        [("target's", self.variant("rope", edit))])

    def train_serve(self) -> list[dict]:
        results = self.doctor.generate(self.src, self.prompts, dtype=self.served_dtype, raw=self.raw, k=self.k)
        inside = [[s for s in r.steps if s.position + self.k < len(r.prompt_ids) + len(r.token_ids)]
                  for r in results]
        keep = [i for i, steps in enumerate(inside) if steps]
        if len(keep) < 2:
            return not_applicable("train_serve", "too few engine steps with a whole block inside the continuation")
        offline = anchored_runs(self.target, self.drafter, [results[i] for i in keep],
                                [[s.position for s in inside[i]] for i in keep])
        served = summary([[s.accepted for s in inside[i]] for i in keep], self.k)
        return compared("train_serve", "engine, its steps", served, [("tau_est at the engine's anchors",
                                                                     summary(offline, self.k))], two_sided=True)

    def temperature(self, temperature: float) -> list[dict]:
        if temperature == 0:
            return not_applicable("temperature", "the pair is diagnosed at temperature 0 already (pass --temperature "
                                "to compare it with greedy)")
        engine = lambda t: engine_summary(self.doctor.generate(  # noqa: E731
            self.src, self.prompts, dtype=self.served_dtype, raw=self.raw, temperature=t, k=self.k), self.k)
        rows = compared("temperature", f"engine, T={temperature:g}", engine(temperature),
                        [("engine, T=0", engine(0.0))])
        expected = (f"expected: at T={temperature:g} a draft is kept with probability p(draft) < 1 (one-hot q), so "
                    "tau reads lower than greedy; this is what the pair gives when sampling, not a fault")
        return [r | {"verdict": "info", "detail": expected if r["configured"] else r["detail"]}
                if r["verdict"] in ("fault", "unresolved", "ok") else r for r in rows]


def thinking_text(target: Target, prompt: str, enable: bool | None) -> str:
    """The chat-formatted prompt text with the template's thinking mode on, off, or (None) at its default."""
    kw = {} if enable is None else {"enable_thinking": enable}
    return target.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                add_generation_prompt=True, **kw)


_dflash_runs = jax.jit(dflash_runs, static_argnames=("cfg",))
_eagle3_runs = jax.jit(eagle3_runs, static_argnames=("cfg", "k"))


def _bucket(n: int, size: int) -> int:
    return max(size, -(-n // size) * size)


def anchored_runs(target: Target, drafter, results: list, anchors: list[list[int]] | None = None) -> list[np.ndarray]:
    """Per result, the accepted-run lengths (at most K) of the drafter's greedy block at `anchors` of its
    sequence (prompt + greedy continuation), by the offline training metric (experiments.training.train);
    anchors None: every anchor whose whole block lies inside the continuation. One batched pass, shapes padded
    to buckets."""
    k = drafter.k
    seqs = [np.asarray(list(r.prompt_ids) + list(r.token_ids), np.int32) for r in results]
    if anchors is None:
        anchors = [list(range(len(r.prompt_ids) - 1, len(s) - k)) for r, s in zip(results, seqs, strict=True)]
    lengths = [len(s) for s in seqs]
    data = Sequences(np.concatenate(seqs), np.concatenate([[0], np.cumsum(lengths)]),
                     np.array([len(r.prompt_ids) for r in results]))
    batch = batch_of(data, np.arange(len(seqs)), _bucket(max(lengths), 64))
    width = _bucket(max(len(a) for a in anchors), 16)
    batch["anchors"] = np.zeros((len(seqs), width), np.int32)
    batch["anchor_valid"] = np.zeros((len(seqs), width), bool)
    for i, a in enumerate(anchors):
        batch["anchors"][i, :len(a)], batch["anchor_valid"][i, :len(a)] = a, True
    feats = target_features(target.params, batch["tokens"], cfg=target.cfg, capture=tuple(drafter.feature_layers))
    params = jax.tree.map(lambda x: x.astype(jnp.float32), drafter.params)
    if drafter.name == "dflash":
        runs = _dflash_runs(params, drafter.cfg, drafter.head, feats, add_hints(batch, drafter.cfg), drafter.vocab)
    else:
        runs = _eagle3_runs(params, drafter.cfg, drafter.embed, drafter.vocab.slots, feats, batch, k)
    runs = np.minimum(np.asarray(runs), k)
    return [runs[i, :len(a)] for i, a in enumerate(anchors)]


# ---------------------------------------------------------------- identity, prompts, formats


def _file_sha(path: Path) -> str | None:
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        return None
    if path.suffix == ".gguf":  # the header (metadata and tokenizer), not gigabytes of weights
        return "head:" + sha256(path, head=1 << 20)
    return sha256(path)


def identity(target: Target, drafter, source) -> dict:
    """Who was tested: paths, config hashes, package versions and the device."""
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    ckpt = Path(drafter.checkpoint)
    return {"target": target.name, "target_path": str(target.path), "target_dtype": target.dtype,
            "target_config_sha256": _file_sha(target.path), "drafter": drafter.name, "drafter_source": str(source),
            "drafter_path": str(ckpt), "drafter_config_sha256": _file_sha(ckpt), "k": drafter.k,
            "backend": jax.default_backend(), "device": jax.devices()[0].device_kind, "versions": versions}


def load_prompts(spec: str | None, limit: int) -> list[str]:
    """Prompts: a suite name, a JSONL suite file, a text file (one prompt a line), or (None) the first of each
    of GSM8K, HumanEval and MT-Bench in turn; the first `limit`."""
    if limit < 1:
        raise DoctorError(f"--limit must be a positive integer, got {limit}")
    if spec is None:
        per = -(-limit // len(DEFAULT_SUITES))
        columns = [[r["prompt"] for r in suites.load_suite(name, limit=per)] for name in DEFAULT_SUITES]
        return [p for group in zip(*columns, strict=False) for p in group][:limit]
    path = Path(spec).expanduser()
    if spec in suites.SUITES or path.suffix in (".jsonl", ".gz"):
        return [r["prompt"] for r in suites.load_suite(spec, limit=limit)]
    if not path.is_file():
        raise DoctorError(f"--prompts {spec!r} is neither a suite ({', '.join(suites.SUITES)}) nor a file")
    prompts = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not prompts:
        raise DoctorError(f"{path} holds no prompts (one a line)")
    return prompts[:limit]


def faults(report: dict, verdict: str = "fault") -> list[str]:
    """Checks whose verdict is `verdict` (fault), in check order."""
    return [r["check"] for r in report["rows"] if r["configured"] and r["verdict"] == verdict]


def cells(r: dict) -> list[str]:
    """A report row as the table's text cells."""
    tau, engine = ("-" if x is None else f"{x:.3f}" for x in (r["tau"], r["engine_tau"]))
    pos = " ".join(f"{x:.2f}" for x in r["per_position"]) or "-"
    return [r["check"], r["variant"], tau, engine, pos, r["verdict"], r["detail"]]


HEADERS = ["check", "variant", "tau_est", "engine tau", "per-position acceptance", "verdict", "detail"]
# what the two tau columns are (every report says it under its table)
TAU_LEGEND = ("tau_est: 1 + the mean accepted run of the arm's drafter at every anchor of the greedy continuation "
              "(what verdicts compare); engine tau: tokens per verify step of the engine's own run, whose anchors "
              "follow rejections, so it reads lower; train_serve sets the engine's tau against tau_est at the "
              "engine's own anchors")


def _identity_lines(report: dict) -> list[str]:
    i, s = report["identity"], report["settings"]
    v = ", ".join(f"{k} {x}" for k, x in i["versions"].items() if x)
    return [f"target {i['target']} ({i['target_dtype']}) {i['target_path']} config sha256 {i['target_config_sha256']}",
            f"drafter {i['drafter']} K={i['k']} {i['drafter_path']} config sha256 {i['drafter_config_sha256']}",
            f"{len(s['prompts'])} prompts, {s['max_new_tokens']} new tokens, {'raw' if s['raw'] else 'chat template'}"
            f", temperature {s['temperature']:g}; {i['backend']} ({i['device']}); {v}",
            f"faults: {', '.join(faults(report)) or 'none'} · unresolved (more prompts would tell): "
            f"{', '.join(faults(report, 'unresolved')) or 'none'} · {report['wall_s']} s", TAU_LEGEND]


def to_text(report: dict) -> str:
    """The report as a fixed-width table under the pair's identity."""
    table = [HEADERS] + [cells(r) for r in report["rows"]]
    widths = [max(len(line[c]) for line in table) for c in range(len(HEADERS) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=False)) + "  " + line[-1]
             for line in table]
    return "\n".join(_identity_lines(report) + [""] + lines) + "\n"


def to_markdown(report: dict) -> str:
    """The report as Markdown to paste into an issue."""
    esc = lambda text: str(text).replace("|", "\\|")  # noqa: E731
    rows = [f"| {' | '.join(esc(c) for c in cells(r))} |" for r in report["rows"]]
    head = [f"| {' | '.join(HEADERS)} |", "|" + "---|" * len(HEADERS)]
    return "\n".join(["### drafter doctor", ""] + [f"- {line}" for line in _identity_lines(report)] + [""]
                     + head + rows) + "\n"


def to_json(report: dict) -> str:
    return json.dumps(report, indent=2) + "\n"


def from_json(text: str) -> dict:
    return json.loads(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m experiments.doctor", description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=None, help="HF directory or .gguf (default: the embedded SmolLM2-135M)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="target dtype as served")
    ap.add_argument("--drafter", required=True, help="dflash, eagle3 or a checkpoint directory")
    ap.add_argument("--prompts", default=None, help=f"a suite ({', '.join(suites.SUITES)}), a JSONL suite file or "
                    "a text file with one prompt a line (default: GSM8K, HumanEval and MT-Bench in turn)")
    ap.add_argument("--limit", type=int, default=12, help="number of prompts (12 x 64 tokens tell a one-layer tap "
                    "shift of the shipped DFlash drafter from the prompt-to-prompt noise)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=None, help="draft length (default: the drafter's)")
    ap.add_argument("--raw", action="store_true", help="the pair is served on raw prompts (no chat template)")
    ap.add_argument("--temperature", type=float, default=0.0, help="the temperature the pair is served at")
    ap.add_argument("--json", action="store_true", help="print the rows as a JSON list instead of the table")
    ap.add_argument("--markdown", default=None, help="also write the report as Markdown to this file")
    ap.add_argument("--export-json", default=None, help="also write the whole report (identity too) as JSON")
    ap.add_argument("--history", default=None, help="store the report in this DuckDB history")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        prompts = load_prompts(args.prompts, args.limit)
        doctor = Doctor(load_target(args.target, dtype=args.dtype), max_new_tokens=args.max_new_tokens)
        report = doctor.diagnose(args.drafter, prompts, raw=args.raw, temperature=args.temperature, k=args.k)
    except (DoctorError, DrafterError, CheckpointError, suites.SuiteError) as e:
        sys.exit(f"doctor: {e}")
    if args.history:
        from storage import open_history

        report["report_id"] = open_history(args.history).write_doctor_report(report)
    if args.markdown:
        Path(args.markdown).write_text(to_markdown(report))
    if args.export_json:
        Path(args.export_json).write_text(to_json(report))
    print(json.dumps(report["rows"], indent=2) if args.json else to_text(report), end="" if not args.json else "\n")


if __name__ == "__main__":
    main()
