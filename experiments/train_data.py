"""Training data for drafters: prompts that are NOT from the evaluation suites, answered by the target.

Three families, all generated here: templated arithmetic word problems (GSM8K-like in form, new
numbers and stories), code-completion tasks built from Python standard-library function signatures
and docstrings (HumanEval-like in form), and templated general instructions (MT-Bench-like in form).
Responses are the target's own greedy outputs (self-distillation), generated in batches on device.
"""

from __future__ import annotations

import importlib
import inspect
import random
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from engine.cache import init_cache
from engine.model import forward
from engine.target import Target

NAMES = ["Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jack", "Keira", "Liam", "Maya",
         "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sam", "Tariq", "Uma", "Victor", "Wen", "Yusuf", "Zoe"]
ITEMS = ["apples", "marbles", "stickers", "books", "cookies", "pencils", "cards", "shells", "coins", "stamps",
         "eggs", "flowers", "toy cars", "cupcakes", "balloons", "oranges", "notebooks", "beads"]
MATH_TEMPLATES = [
    "{a} has {x} {item}. {b} gives {a} {y} more {item}. Then {a} gives away {z} {item}. How many {item} does {a} "
    "have now?",
    "A box holds {x} {item}. {a} buys {y} boxes and uses {z} {item} for a party. How many {item} are left?",
    "{a} earns ${x} per hour and works {y} hours a week. After spending ${z}, how much money does {a} have left at "
    "the end of the week?",
    "{a} reads {x} pages a day for {y} days, then {z} pages on the last day. How many pages did {a} read in total?",
    "A shop sells {item} at ${x} each. {a} buys {y} of them and pays with ${z}. How much change does {a} get?",
    "{a} has {x} {item} and shares them equally among {y} friends. How many {item} does each friend get, and how "
    "many are left over?",
    "There are {x} students in a class. {y} percent of them like {item}. How many students like {item}?",
    "{a} runs {x} km on Monday, {y} km on Tuesday and twice as far on Wednesday as on Monday. How many km did {a} "
    "run in total?",
    "A farmer has {x} rows of trees with {y} trees in each row. {z} trees are cut down. How many trees remain?",
    "{a} is {x} years old. {b} is {y} years older than {a}. How old will {b} be in {z} years?",
    "A recipe needs {x} grams of flour for {y} cakes. How much flour is needed for {z} cakes?",
    "{a} saves ${x} every week. How many weeks will it take {a} to save ${y}?",
]
TOPICS = ["the ocean", "volcanoes", "photosynthesis", "the moon", "honey bees", "the internet", "rainbows",
          "democracy", "climate change", "the Roman Empire", "electric cars", "sleep", "music", "friendship",
          "recycling", "gravity", "the human heart", "deserts", "chess", "coffee", "airplanes", "vaccines",
          "mountains", "libraries", "robots", "time zones", "the stock market", "bread", "whales", "solar power"]
INSTRUCTION_TEMPLATES = [
    "Explain {t} to a ten-year-old.", "Write a short poem about {t}.", "Give me three interesting facts about {t}.",
    "Write a short story that involves {t}.", "What are the pros and cons of {t}?",
    "Write an email to a friend telling them about {t}.", "Summarize what you know about {t} in one paragraph.",
    "List five questions a student might ask about {t}, with short answers.",
    "Write a persuasive paragraph about why people should learn about {t}.", "Describe {t} in simple terms.",
    "Compare {t} and {u} in a few sentences.", "Write a blog post introduction about {t}.",
]
STDLIB_MODULES = ["string", "textwrap", "math", "statistics", "itertools", "functools", "collections", "heapq",
                  "bisect", "fractions", "decimal", "random", "re", "json", "os.path", "shlex", "fnmatch",
                  "difflib", "calendar", "datetime", "operator", "copy", "base64", "binascii", "html",
                  "urllib.parse", "ipaddress", "colorsys", "zlib", "hashlib", "keyword", "glob", "csv",
                  "secrets", "uuid", "pathlib", "enum", "dataclasses", "contextlib", "typing", "shutil",
                  "tempfile", "inspect", "ast", "tokenize", "pprint", "reprlib", "email.utils", "mimetypes",
                  "locale", "gettext", "argparse", "logging", "platform", "sysconfig", "quopri", "wave",
                  "numbers", "graphlib", "ntpath", "posixpath", "genericpath", "linecache", "traceback",
                  "warnings", "weakref", "types", "abc", "codecs", "encodings", "html.parser", "http.cookies",
                  "urllib.request", "xml.sax.saxutils", "imaplib", "smtplib", "ftplib", "zipfile", "tarfile",
                  "gzip", "bz2", "lzma", "configparser", "netrc", "plistlib", "sched", "queue", "threading",
                  "subprocess", "socket", "selectors", "signal", "unittest.util", "doctest", "pydoc", "trace",
                  "timeit", "cProfile", "pstats", "optparse", "getopt", "cmd", "code", "dis", "pickletools",
                  "compileall", "py_compile", "zipimport", "pkgutil", "modulefinder", "runpy", "importlib.util"]
CODE_TASKS = [
    "reverses the words in a sentence", "checks whether a string is a palindrome", "counts the vowels in a string",
    "returns the n-th Fibonacci number", "merges two sorted lists into one sorted list",
    "removes duplicates from a list while keeping the order", "returns the largest element of a list",
    "computes the factorial of a number", "checks whether a number is prime", "flattens a nested list",
    "converts Celsius to Fahrenheit", "returns the frequency of each character in a string",
    "finds the second largest number in a list", "computes the greatest common divisor of two numbers",
    "checks whether two strings are anagrams", "returns all even numbers from a list", "sums the digits of a number",
    "capitalizes the first letter of every word", "rotates a list by k positions",
    "returns the running sum of a list", "counts words in a text", "transposes a matrix given as a list of lists",
    "finds the index of a target value with binary search", "checks whether brackets in a string are balanced",
    "converts a decimal number to binary", "returns the longest common prefix of a list of strings",
    "groups a list of words by their first letter", "computes the average of a list of numbers",
    "splits a list into chunks of size n", "returns the intersection of two lists",
]


def math_prompt(rng: random.Random) -> str:
    a, b = rng.sample(NAMES, 2)
    x, y = rng.randint(2, 60), rng.randint(2, 30)
    z = rng.randint(1, max(1, min(x, y)))
    return rng.choice(MATH_TEMPLATES).format(a=a, b=b, x=x, y=y, z=z, item=rng.choice(ITEMS))


STYLE_SUFFIXES = ["", " Keep it under 100 words.", " Use bullet points.", " Use a friendly tone.",
                  " Answer in three sentences.", " Include an example.", " Be concise.", " Explain step by step."]
CODE_SUFFIXES = ["", " Use type hints.", " Add a short explanation after the code.", " Handle edge cases."]


def instruction_prompt(rng: random.Random) -> str:
    t, u = rng.sample(TOPICS, 2)
    return rng.choice(INSTRUCTION_TEMPLATES).format(t=t, u=u) + rng.choice(STYLE_SUFFIXES)


def stdlib_functions() -> list[tuple[str, str]]:
    """(signature line, docstring) of public pure-Python standard-library functions."""
    out = []
    for mod_name in STDLIB_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        for name, fn in sorted(vars(mod).items()):
            if name.startswith("_") or not inspect.isfunction(fn) or not fn.__doc__:
                continue
            try:
                sig = str(inspect.signature(fn))
            except (TypeError, ValueError):
                continue
            doc = inspect.cleandoc(fn.__doc__).split("\n\n")[0]
            if 20 <= len(doc) <= 400:
                out.append((f"def {name}{sig}:", doc))
    return out


def code_prompt(rng: random.Random, functions: list[tuple[str, str]]) -> str:
    if rng.random() < 0.3:
        task = rng.choice(CODE_TASKS)
        return rng.choice([f"Write a Python function that {task}.", f"Write a Python function that {task}. "
                           "Include a docstring and an example.", f"How do I write a function that {task} in Python?"]
                          ) + rng.choice(CODE_SUFFIXES)
    sig, doc = rng.choice(functions)
    body = "\n".join("    " + line for line in doc.splitlines())
    task = f'{sig}\n    """\n{body}\n    """\n'
    return rng.choice([f"Complete the following Python function:\n\n```python\n{task}```",
                       f"Implement this function in Python:\n\n```python\n{task}```",
                       f"Write the body of this Python function and explain it briefly:\n\n```python\n{task}```"]
                      ) + rng.choice(CODE_SUFFIXES)


def build_prompts(n: int, seed: int = 0, mix: tuple[float, float, float] = (0.4, 0.35, 0.25)) -> list[dict]:
    """Up to n distinct training prompts {prompt, kind} (math, code, chat in proportion `mix`), deterministic
    given seed and the Python version (code tasks read the running interpreter's standard library)."""
    rng = random.Random(seed)
    functions = stdlib_functions()
    make = {"math": lambda: math_prompt(rng), "code": lambda: code_prompt(rng, functions),
            "chat": lambda: instruction_prompt(rng)}
    seen, out = set(), []
    for _ in range(20 * n):
        kind = rng.choices(["math", "code", "chat"], weights=mix)[0]
        prompt = make[kind]()
        if prompt not in seen:
            seen.add(prompt)
            out.append({"prompt": prompt, "kind": kind})
            if len(out) == n:
                break
    return out


@partial(jax.jit, static_argnames=("cfg", "max_new"))
def _greedy_batch(params, cache, anchors, starts, *, cfg, max_new: int):
    """Greedy decode max_new tokens for a batch from anchors [B] at positions starts [B], in one device loop."""
    def step(i, carry):
        cache, tok, out = carry
        logits, _, cache = forward(params, cache, tok[:, None], starts + i, cfg=cfg)
        nxt = jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)
        return cache, nxt, out.at[:, i].set(nxt)
    out = jnp.zeros((anchors.shape[0], max_new), jnp.int32)
    _, _, out = jax.lax.fori_loop(0, max_new, step, (cache, anchors, out))
    return out


def generate_batch(target: Target, prompts: list[np.ndarray], max_new: int, max_prompt: int) -> list[np.ndarray]:
    """Greedy responses (cut after the first EOS) for prompts of up to max_prompt tokens, ragged positions.

    Shapes depend only on (len(prompts), max_prompt, max_new): one compilation for a whole dataset."""
    b = len(prompts)
    max_len = -(-(max_prompt + max_new + 1) // 128) * 128
    cache = init_cache(target.cfg, b, max_len, target.params["embed"].dtype)
    body = np.zeros((b, max_prompt - 1), np.int32)  # prefill prompt[:-1]; pads land past each length
    for i, p in enumerate(prompts):
        body[i, :len(p) - 1] = p[:-1]
    _, _, cache = forward(target.params, cache, jnp.asarray(body), jnp.zeros(b, jnp.int32), cfg=target.cfg,
                          with_logits=False)
    anchors = jnp.asarray([p[-1] for p in prompts], jnp.int32)
    starts = jnp.asarray([len(p) - 1 for p in prompts], jnp.int32)
    out = np.asarray(_greedy_batch(target.params, cache, anchors, starts, cfg=target.cfg, max_new=max_new))
    responses = []
    for row in out:
        stop = np.flatnonzero(np.isin(row, target.eos_ids))
        responses.append(row[:stop[0] + 1] if stop.size else row)
    return responses
