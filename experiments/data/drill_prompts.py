"""Procedural number prompts ("drill"): sequences to continue, counting, tables, arithmetic and school algebra.

Word-problem templates teach a drafter the wording of GSM8K; these teach it the number text in between: counts that
go on, digits that carry, equations that are solved line by line. Each generator draws its numbers so that the task
has one clean answer, and every prompt names its generator as its source (`drill/<name>`).
"""

from __future__ import annotations

import random
from collections.abc import Callable

SEPARATORS = [" ", ", ", ",", "\n", " - ", "; "]
ORDINAL_SETS = {
    "letters of the alphabet": [chr(c) for c in range(ord("A"), ord("Z") + 1)],
    "months of the year": ["January", "February", "March", "April", "May", "June", "July", "August", "September",
                           "October", "November", "December"],
    "days of the week": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"],
}
SERIES: dict[str, Callable[[int], int]] = {
    "square numbers": lambda i: (i + 1) ** 2, "cube numbers": lambda i: (i + 1) ** 3,
    "triangular numbers": lambda i: (i + 1) * (i + 2) // 2, "powers of 2": lambda i: 2 ** i,
    "powers of 3": lambda i: 3 ** i, "odd numbers": lambda i: 2 * i + 1, "even numbers": lambda i: 2 * i + 2,
}


def _progression(rng: random.Random) -> tuple[int, int]:
    start = rng.choice([rng.randint(0, 20), rng.randint(20, 500), rng.randint(1000, 9999)])
    step = rng.choice([1, 1, 1, 2, 3, 5, 10, rng.randint(2, 25)]) * rng.choice([1, 1, 1, -1])
    return start, step


def continue_sequence(rng: random.Random) -> str:
    start, step = _progression(rng)
    shown = [start + i * step for i in range(rng.randint(3, 12))]
    sep = rng.choice(SEPARATORS)
    lead = rng.choice(["Continue the sequence", "What comes next", "Continue this pattern for {n} more terms",
                       "Extend the list", "Write the next {n} numbers"]).format(n=rng.randint(3, 15))
    return f"{lead}: {sep.join(map(str, shown))}{sep.rstrip() or ' '}..."


def count_range(rng: random.Random) -> str:
    start, step = _progression(rng)
    n = rng.randint(8, 60)
    end = start + step * (n - 1)
    by = "" if abs(step) == 1 else f" in steps of {abs(step)}"
    verb = "Count down" if step < 0 else "Count"
    how = rng.choice(["", " Separate the numbers with commas.", " Put each number on its own line.",
                      " Use spaces between the numbers.", " Write them in words.", ""])
    return f"{verb} from {start} to {end}{by}.{how}"


def named_series(rng: random.Random) -> str:
    name, ordinal = rng.choice(list(SERIES)), None
    if rng.random() < 0.3:
        ordinal = rng.choice(list(ORDINAL_SETS))
        items = ORDINAL_SETS[ordinal]
        a = rng.randrange(len(items) - 2)
        b = rng.randrange(a + 2, len(items))
        return rng.choice([f"List the {ordinal} from {items[a]} to {items[b]}.",
                           f"Write the {ordinal} in reverse order, starting from {items[b]}.",
                           f"List every second entry of the {ordinal}, starting from {items[a]}."])
    n = rng.randint(5, 20)
    return rng.choice([f"List the first {n} {name}.", f"Write the first {n} {name}, separated by commas.",
                       f"What are the first {n} {name}?", f"Write the Fibonacci sequence up to its {n}th term."])


def times_table(rng: random.Random) -> str:
    k, upto = rng.randint(2, 25), rng.choice([10, 12, 15, 20])
    return rng.choice([f"Write the {k} times table up to {k} x {upto}.", f"List the multiples of {k} up to {k * upto}.",
                       f"Write out the multiplication table for {k}, from 1 to {upto}."])


def arithmetic(rng: random.Random) -> str:
    a, b = rng.randint(12, 9999), rng.randint(11, 999)
    show = rng.choice(["", " Show each step.", " Work it out step by step.", " Explain how you carry the digits."])
    task = rng.choice([f"What is {a} + {b}?", f"Compute {a} - {b}.", f"Multiply {a % 1000} by {b % 100 + 2}.",
                       f"What is {a * (b % 50 + 2)} divided by {b % 50 + 2}?", f"Calculate {a} x {b % 100 + 2}.",
                       f"What is {rng.choice([5, 10, 12.5, 15, 20, 25, 40, 75])}% of {rng.randint(2, 400) * 8}?",
                       f"Round {a / rng.choice([7, 13, 17]):.5f} to two decimal places.",
                       f"Evaluate {a % 90 + 2} + {b % 40 + 2} * {rng.randint(2, 12)} - {rng.randint(1, 30)}."])
    return task + show


def fractions(rng: random.Random) -> str:
    p, q, r, s = rng.randint(1, 9), rng.randint(2, 12), rng.randint(1, 9), rng.randint(2, 12)
    op = rng.choice(["+", "-", "x", "divided by"])
    return rng.choice([f"What is {p}/{q} {op} {r}/{s}? Give the answer in lowest terms.",
                       f"Simplify the fraction {p * r * 6}/{q * r * 6}.",
                       f"Convert {p}/{q} to a decimal and to a percentage."])


def signed(n: int) -> str:
    """A term after another: '+ 3' or '- 3'."""
    return f"+ {n}" if n >= 0 else f"- {-n}"


def linear_equation(rng: random.Random) -> str:
    x, a, b = rng.randint(-20, 30), rng.randint(2, 15), rng.randint(-50, 50)
    if rng.random() < 0.4:
        y, c, d, e, f = rng.randint(-10, 15), rng.randint(1, 9), rng.randint(1, 9), rng.randint(1, 9), rng.randint(1, 9)
        return (f"Solve the system of equations: {c}x + {d}y = {c * x + d * y} and {e}x - {f}y = {e * x - f * y}.")
    return rng.choice([f"Solve {a}x {signed(b)} = {a * x + b} for x.", f"Find x if {a}x {signed(b)} = {a * x + b}.",
                       f"Solve for x: {a}(x {signed(b)}) = {a * (x + b)}. Show your steps."])


def polynomial(rng: random.Random) -> str:
    r1, r2 = rng.randint(-9, 9), rng.randint(-9, 9)
    quad = f"x^2 {signed(-(r1 + r2))}x {signed(r1 * r2)}"
    k, n = rng.randint(2, 9), rng.randint(2, 6)
    return rng.choice([f"Factor {quad}.", f"Solve {quad} = 0.", f"Expand (x {signed(-r1)})(x {signed(-r2)}).",
                       f"Differentiate {k}x^{n} + {quad}.",
                       f"Find the derivative of f(x) = {k}x^{n} - {abs(r1) + 1}x."])


def number_facts(rng: random.Random) -> str:
    a, b = rng.randint(12, 600), rng.randint(12, 600)
    n = rng.randint(20, 2000)
    return rng.choice([f"What is the greatest common divisor of {a} and {b}?", f"Find the least common multiple of "
                       f"{a % 60 + 2} and {b % 60 + 2}.", f"Is {n} a prime number? Explain.",
                       f"Write the prime factorization of {n}.", f"List all the prime numbers between {n // 10} and "
                       f"{n // 10 + rng.randint(20, 60)}.", f"Convert {n} to binary.", f"Write {n} in Roman numerals.",
                       f"What is the square root of {rng.randint(2, 60) ** 2}?",
                       f"What is {rng.randint(2, 9)} to the power of {rng.randint(2, 6)}?",
                       f"Sort these numbers from smallest to largest: "
                       f"{', '.join(str(rng.randint(-99, 999)) for _ in range(rng.randint(5, 12)))}."])


DRILLS: dict[str, Callable[[random.Random], str]] = {
    "continue_sequence": continue_sequence, "count_range": count_range, "named_series": named_series,
    "times_table": times_table, "arithmetic": arithmetic, "fractions": fractions,
    "linear_equation": linear_equation, "polynomial": polynomial, "number_facts": number_facts,
}
WEIGHTS = {"continue_sequence": 3, "count_range": 3, "named_series": 2, "times_table": 1, "arithmetic": 3,
           "fractions": 1, "linear_equation": 2, "polynomial": 1, "number_facts": 2}


def drill_prompt(rng: random.Random) -> tuple[str, str]:
    """(prompt, source) of a random number drill."""
    name = rng.choices(list(DRILLS), [WEIGHTS[k] for k in DRILLS])[0]
    return DRILLS[name](rng), f"drill/{name}"

