"""The llama.cpp peer: plain decode, n-gram, DFlash and EAGLE-3 on the same target GGUF and drafter weights,
with our engine's tau beside (llama_cpp_main):

    python -m experiments.bench.llama_cpp --suite gsm8k,humaneval --limit 5 --max-new-tokens 64 --k 4 \
        --threads 2 [--ours]

Its tools come from scripts/build_llama_cpp.sh (a cache outside the repo; without them the command says so). On
loaded cores use --threads 1: ggml's threads synchronize at every graph node, and 2 threads on 2 busy cores decoded
~20x slower than one (measured 2026-12-01).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from engine import Target

from .contenders import Outcome
from .peers import PeerError, write_hf_dir

BUILD_SCRIPT = "scripts/build_llama_cpp.sh"


LLAMA_CPP_ENV = "DRAFTSCOPE_LLAMA_CPP"


LLAMA_TOOLS = ("llama-completion", "llama-speculative-simple")


# method -> (llama.cpp --spec-type, our drafter); plain is llama-completion, the others llama-speculative-simple
LLAMA_METHODS = {"plain": (None, "ar"), "ngram": ("ngram-simple", "ngram"), "dflash": ("draft-dflash", "dflash"),
                 "eagle3": ("draft-eagle3", "eagle3")}


def llama_cpp_home() -> Path:
    """The llama.cpp cache: $DRAFTSCOPE_LLAMA_CPP, else ~/.cache/draftscope/llama.cpp (scripts/build_llama_cpp.sh)."""
    return Path(os.environ.get(LLAMA_CPP_ENV) or "~/.cache/draftscope/llama.cpp").expanduser()


def llama_cpp_tools(home: Path | None = None) -> dict[str, Path]:
    """The built llama.cpp tools by name, or PeerError saying how to build them."""
    home = home or llama_cpp_home()
    tools = {name: home / "build" / "bin" / name for name in LLAMA_TOOLS}
    missing = [name for name, path in tools.items() if not os.access(path, os.X_OK)]
    if missing:
        raise PeerError(f"the llama.cpp peer needs llama.cpp's tools, not built in {home / 'build' / 'bin'} "
                        f"(missing: {', '.join(missing)}): run {BUILD_SCRIPT} (~8 minutes on two cores; "
                        f"${LLAMA_CPP_ENV} picks another cache)")
    return tools


@dataclass
class LlamaRun:
    """One llama.cpp generation as its own printout reports it: decode_s covers n_generated tokens (prefill
    excluded); n_drafted / n_accept are None for plain decode."""

    n_prompt: int
    n_generated: int
    decode_s: float
    n_drafted: int | None = None
    n_accept: int | None = None
    text: str = ""

    @property
    def tok_per_s(self) -> float:
        return self.n_generated / self.decode_s

    @property
    def tau(self) -> float:
        """Tokens per target verify step (accepted + 1): every step emits its accepted drafts and one target token."""
        return self.n_generated / (self.n_generated - (self.n_accept or 0))


def _match(pattern: str, text: str, what: str) -> re.Match:
    m = re.search(pattern, text, re.MULTILINE)
    if m is None:
        raise PeerError(f"llama.cpp printed no {what} (pattern {pattern!r}); its output ends:\n{text[-2000:]}")
    return m


def parse_speculative(log: str, text: str = "") -> LlamaRun:
    """A llama-speculative-simple run from its log (the 'decoded N tokens in S seconds' and n_* lines)."""
    enc = _match(r"encoded\s+(\d+) tokens in", log, "prompt size")
    dec = _match(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log, "decode time")
    drafted = _match(r"n_drafted\s*=\s*(\d+)", log, "n_drafted")
    accept = _match(r"n_accept\s*=\s*(\d+)", log, "n_accept")
    return LlamaRun(int(enc[1]), int(dec[1]), float(dec[2]), int(drafted[1]), int(accept[1]), text)


def parse_completion(log: str, text: str = "") -> LlamaRun:
    """A llama-completion run from its perf lines: the prompt eval makes the first token, 'eval time = ms / N runs'
    the N after it."""
    prompt = _match(r"prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens", log, "prompt eval line")
    ev = _match(r":\s+eval time =\s*([\d.]+) ms /\s*(\d+) runs", log, "eval line")
    return LlamaRun(int(prompt[1]), int(ev[2]), float(ev[1]) / 1e3, None, None, text)


class LlamaCppContender:
    """One llama.cpp method (plain, ngram, dflash, eagle3) on our chat-formatted prompt text, greedy."""

    def __init__(self, tools: dict[str, Path], model: Path, method: str, k: int, max_new_tokens: int,
                 threads: int, target: Target, drafter: Path | None = None, template: dict | None = None,
                 ctx: int = 2048) -> None:
        self.tools, self.model, self.method, self.k, self.drafter = tools, model, method, k, drafter
        self.name, self.peer_of = f"llama.cpp {method}", LLAMA_METHODS[method][1]
        self.max_new_tokens, self.threads, self.target, self.template, self.ctx = (max_new_tokens, threads, target,
                                                                                    template, ctx)
        self.runs: list[LlamaRun] = []  # every counted run, for tau

    def command(self, prompt: str) -> list[str]:
        common = ["-m", str(self.model), "-p", prompt, "-n", str(self.max_new_tokens), "-t", str(self.threads),
                  "-tb", str(self.threads), "-c", str(self.ctx), "--temp", "0", "--seed", "0"]
        spec, _ = LLAMA_METHODS[self.method]
        if spec is None:
            return [str(self.tools["llama-completion"]), *common, "-no-cnv", "--no-display-prompt"]
        cmd = [str(self.tools["llama-speculative-simple"]), *common, "--spec-type", spec, "--spec-draft-n-max",
               str(self.k)]
        if spec == "ngram-simple":  # as our ngram: a 3-token key, K tokens drafted after its last occurrence
            cmd += ["--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", str(self.k)]
        if self.drafter is not None:
            cmd += ["-md", str(self.drafter)]
        return cmd

    def prompt_text(self, row: dict) -> str:
        """Our prompt ids as text, special tokens kept: llama.cpp tokenizes it back (parsing special tokens)."""
        ids = self.target.encode(row["prompt"], template=self.template)
        return self.target.tokenizer.decode(list(ids), skip_special_tokens=False)

    def run_llama(self, row: dict) -> LlamaRun:
        prompt = self.prompt_text(row)
        proc = subprocess.run(self.command(prompt), capture_output=True, text=True, errors="replace")
        if proc.returncode != 0:
            raise PeerError(f"{self.name} exited {proc.returncode}: {proc.stderr[-2000:]}")
        log = proc.stdout + proc.stderr
        parse = parse_completion if LLAMA_METHODS[self.method][0] is None else parse_speculative
        run = parse(log, generated_text(proc.stdout, prompt))
        n_ours = len(self.target.encode(row["prompt"], template=self.template))
        if run.n_prompt not in (n_ours, n_ours - 1):  # speculative-simple counts the prompt, completion evaluates it
            raise PeerError(f"{self.name} read the prompt as {run.n_prompt} tokens, ours has {n_ours}")
        return run

    def warm_up(self, row: dict) -> None:
        self.run_llama(row)

    def run(self, row: dict) -> Outcome:
        run = self.run_llama(row)
        self.runs.append(run)
        return Outcome(self.target.tokenizer(run.text, add_special_tokens=False)["input_ids"], run.decode_s,
                       run.n_generated, run.decode_s)


def generated_text(stdout: str, prompt: str) -> str:
    """The generated text of a tool's stdout (after the echoed prompt, when it echoes it), stripped."""
    i = stdout.find(prompt)
    return (stdout[i + len(prompt):] if i >= 0 else stdout).strip()


def _fresh(out: Path, source: Path) -> bool:
    return out.is_file() and out.stat().st_mtime >= source.stat().st_mtime


def target_hf_dir(target: Target, home: Path) -> Path:
    """The target's HF directory in the cache (written once per target file)."""
    out = home / "targets" / target.name
    if not _fresh(out / "model.safetensors", Path(target.path)):
        write_hf_dir(target, out)
    return out


def full_vocab_copy(checkpoint: Path, out: Path) -> Path:
    """A DFlash checkpoint without its restricted draft vocabulary (d2t / t2d, draft_vocab_size): the published
    z-lab layout, drafting over the target's whole LM head, which llama.cpp's converter reads."""
    from safetensors.torch import load_file, save_file  # bf16 tensors: numpy cannot hold them

    source = checkpoint / "model.safetensors"
    if _fresh(out / "model.safetensors", source):
        return out
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v for k, v in load_file(str(source)).items() if k not in ("d2t", "t2d")}
    config = {k: v for k, v in json.loads((checkpoint / "config.json").read_text()).items()
              if k != "draft_vocab_size"}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def llama_cpp_refusal(checkpoint: Path) -> str | None:
    """Why llama.cpp's draft-dflash cannot draft as this DFlash checkpoint does (it starts every block from MASK
    tokens and has no Domino head), else None."""
    config = json.loads((checkpoint / "config.json").read_text())
    extra = config.get("dflash_config", {})
    if extra.get("lookup_hints"):
        return "its blocks start from lookup hints (dflash_config.lookup_hints), which llama.cpp's DFlash lacks"
    if extra.get("projector_type") == "domino" or "DominoDraftModel" in config.get("architectures", []):
        return "its Domino correction head is not in llama.cpp's DFlash"
    return None


def convert_drafter(checkpoint: Path, target_dir: Path, home: Path) -> Path:
    """llama.cpp's convert_hf_to_gguf.py (f32, --target-model-dir) on a drafter checkpoint, cached; PeerError with
    the converter's last lines when it refuses the checkpoint."""
    out = home / "drafters" / f"{checkpoint.name}.gguf"
    if _fresh(out, checkpoint / "model.safetensors"):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(home / "src" / "convert_hf_to_gguf.py"), str(checkpoint), "--target-model-dir",
           str(target_dir), "--outtype", "f32", "--outfile", str(out)]
    env = {**os.environ, "PYTHONPATH": str(home / "pydeps")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        out.unlink(missing_ok=True)
        last = [line for line in proc.stderr.splitlines() if line.strip()][-1:]
        raise PeerError(f"llama.cpp's converter refuses {checkpoint}: {' '.join(last)}")
    return out


def llama_cpp_contenders(target: Target, k: int, max_new_tokens: int, threads: int, template: dict | None,
                         drafters: list[tuple[str, Path]], home: Path) -> tuple[list[LlamaCppContender], list[str]]:
    """llama.cpp's plain, ngram and (from `drafters`: (method, checkpoint) pairs) drafter methods on the target GGUF,
    and one line per drafter it could not take (the converter's reason)."""
    tools = llama_cpp_tools(home)
    model = Path(target.path)
    if model.suffix != ".gguf":
        raise PeerError(f"the llama.cpp peer runs a GGUF target, got {model}")
    kw = dict(k=k, max_new_tokens=max_new_tokens, threads=threads, target=target, template=template)
    out = [LlamaCppContender(tools, model, m, **kw) for m in ("plain", "ngram")]
    problems, hf_dir = [], target_hf_dir(target, home)
    for method, checkpoint in drafters:
        if method == "dflash" and (why := llama_cpp_refusal(checkpoint)):
            problems.append(f"llama.cpp cannot draft as {checkpoint} does: {why}")
            continue
        try:
            out.append(LlamaCppContender(tools, model, method, drafter=convert_drafter(checkpoint, hf_dir, home),
                                         **kw))
            out[-1].name += f" ({checkpoint.name})"
        except PeerError as e:
            problems.append(str(e))
    return out, problems


def llama_rows(contenders: list, outcomes: dict[int, list[Outcome]]) -> list[dict]:
    """One row per contender: pooled tok/s, speedup over its own engine's plain decode (llama.cpp plain, our ar),
    tau (mean over prompts), acceptance and how many outputs equal that plain decode's (over the shorter length)."""
    rows = []
    for c in contenders:
        outs = outcomes[id(c)]
        runs = getattr(c, "runs", None)
        results = [r for o in outs for r in o.results]
        if runs is not None:
            taus = [r.tau for r in runs]
            drafted, accepted = sum(r.n_drafted or 0 for r in runs), sum(r.n_accept or 0 for r in runs)
        else:
            taus = [r.stats["tau"] for r in results]
            drafted, accepted = sum(r.stats["drafted"] for r in results), sum(r.stats["accepted"] for r in results)
        tokens, seconds = sum(o.decode_tokens for o in outs), sum(o.decode_s for o in outs)
        rows.append({"engine": "llama.cpp" if runs is not None else "draftscope", "method": c.name, "k": c.k,
                     "n": len(outs), "tok_per_s": tokens / seconds if seconds else None,
                     "tau": statistics.fmean(taus) if taus else None,
                     "acceptance_rate": accepted / drafted if drafted else None, "token_ids": [o.token_ids
                                                                                              for o in outs]})
    for engine in ("llama.cpp", "draftscope"):
        mine = [r for r in rows if r["engine"] == engine]
        if not mine:
            continue
        plain = mine[0]  # the plain decode comes first
        for r in mine:
            r["speedup"] = r["tok_per_s"] / plain["tok_per_s"] if r["tok_per_s"] and plain["tok_per_s"] else None
            r["same_as_plain"] = sum(same_prefix(a, b) for a, b in zip(r["token_ids"], plain["token_ids"], strict=True))
    for r in rows:
        del r["token_ids"]
    return rows


def same_prefix(a: list, b: list) -> bool:
    """Whether two outputs agree over the shorter one's length (llama-speculative-simple emits one token past -n)."""
    n = min(len(a), len(b))
    return list(a[:n]) == list(b[:n])


def llama_table(rows: list[dict]) -> str:
    from .contenders import fmt, text_table

    body = [[r["engine"], r["method"], r["k"], r["n"], fmt(r["tok_per_s"], ".1f"), fmt(r["speedup"]) + "x",
             fmt(r["tau"]), fmt(r["acceptance_rate"], ".3f"), f"{r['same_as_plain']}/{r['n']}"] for r in rows]
    return text_table(["engine", "method", "K", "n", "tok/s", "speedup", "tau", "accept", "same as plain"], body)


def llama_cpp_main(argv: list[str] | None = None) -> int:
    """python -m experiments.bench.llama_cpp: llama.cpp's plain decode, n-gram, DFlash and EAGLE-3 (our shipped
    drafters, converted by llama.cpp's own converter) on the target GGUF, interleaved per prompt; --ours adds our
    engine's ar, ngram and drafters on the same prompts (tau is the cross-check)."""
    from engine import CheckpointError, DrafterError, load_drafter, load_target
    from engine.tokenizer import default_template

    from ..suites import SuiteError, load_suite
    from .contenders import EngineContender, interleave, load_contenders

    ap = argparse.ArgumentParser(description=llama_cpp_main.__doc__)
    ap.add_argument("--suite", default="gsm8k,humaneval", help="comma-separated suites (prompts pooled in order)")
    ap.add_argument("--limit", type=int, default=3, help="first N prompts of each suite")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4, help="draft length of every drafting method (both engines)")
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp threads (-t and -tb)")
    ap.add_argument("--target", default=None, help="a GGUF target (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--ours", action="store_true", help="also run our engine (float32) on the same prompts")
    ap.add_argument("--json", action="store_true", help="one JSON row per method instead of the table")
    a = ap.parse_args(argv)
    home = llama_cpp_home()
    try:
        llama_cpp_tools(home)  # fail fast, before any model loads
        prompts = [row for name in a.suite.split(",") if name.strip()
                   for row in load_suite(name.strip(), a.limit, split="test")]
        target = load_target(a.target)
        template = default_template(target.tokenizer)
        shipped = {name: Path(load_drafter(name, target, k=a.k).checkpoint) for name in ("dflash", "eagle3")}
        # the default DFlash starts blocks from lookup hints (llama.cpp refuses it, named as a problem); its
        # MASK-started sibling is what llama.cpp's DFlash can draft
        plain = shipped["dflash"].with_name(f"{shipped['dflash'].name}-plain")
        full_vocab = full_vocab_copy(plain, home / "drafters" / f"{plain.name}-fullvocab")
        drafters = [("dflash", shipped["dflash"]), ("dflash", plain), ("dflash", full_vocab),
                    ("eagle3", shipped["eagle3"])]
        contenders, problems = llama_cpp_contenders(target, a.k, a.max_new_tokens, a.threads, template, drafters,
                                                    home)
        if a.ours:
            kw = dict(max_new_tokens=a.max_new_tokens, temperature=0.0, template=template)
            ours, lines = load_contenders(target, ["ngram", "dflash", "eagle3"], [a.k], **kw)
            ours.insert(3, EngineContender(target, load_drafter(full_vocab, target, k=a.k), **kw))
            contenders += ours
            problems += lines
    except (PeerError, SuiteError, CheckpointError, DrafterError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for c in contenders:
        if isinstance(c, EngineContender) and getattr(c.drafter, "checkpoint", None):
            c.name += f" ({Path(c.drafter.checkpoint).name})"
        c.warm_up(prompts[0])
    outcomes: dict[int, list[Outcome]] = {}
    try:
        interleave(prompts, contenders, lambda row, c, out: outcomes.setdefault(id(c), []).append(out))
    except PeerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = llama_rows(contenders, outcomes)
    if a.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print(f"{len(prompts)} prompts ({a.suite}, first {a.limit} each), max {a.max_new_tokens} new tokens, greedy, "
              f"K {a.k}, llama.cpp {a.threads} threads on {Path(target.path).name}; speedup = tok/s over the same "
              "engine's plain decode in this run; tau = tokens per verify step (mean over prompts)")
        print(llama_table(rows))
    for line in problems:
        print(line, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(llama_cpp_main())
