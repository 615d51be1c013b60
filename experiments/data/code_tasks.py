"""Code tasks for drafter-training prompts: (signature, what it does, reference implementation, example arguments).

HumanEval-like tasks whose docstring examples experiments.data.prompts computes with the reference implementation;
the implementations are code, so the table lives here rather than in prompt_tables/.
"""

from __future__ import annotations

import calendar
import itertools
import math
import os.path
import re
import statistics
import textwrap
from collections import Counter
from functools import reduce
from urllib.parse import parse_qsl

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
