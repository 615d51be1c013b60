"""Twenty varied prompts (code, math, chat) for lossless checks."""

LOSSLESS_PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "def is_prime(n):\n    \"\"\"Return True if n is prime.\"\"\"",
    "Write a SQL query that counts orders per customer.",
    "Fix the bug: for i in range(10) print(i)",
    "Write a bash one-liner that counts lines in all .py files.",
    "Explain what a Python list comprehension is, with an example.",
    "What is 17 * 23? Show your steps.",
    "A train travels 60 km in 45 minutes. What is its speed in km/h?",
    "Tom has 3 apples and buys 5 more. He eats 2. How many are left?",
    "Solve for x: 2x + 7 = 19.",
    "What is the sum of the first 10 positive integers?",
    "If a rectangle is 4 cm by 9 cm, what is its area and perimeter?",
    "Tell me a short story about a robot who learns to paint.",
    "What are three tips for sleeping better?",
    "Summarize the water cycle in a few sentences.",
    "Write a haiku about autumn leaves.",
    "Who was Ada Lovelace?",
    "Give me a recipe for a simple tomato soup.",
    "Translate 'good morning, how are you?' into French.",
    "List five animals that live in the ocean.",
]

# Right-to-left, CJK, Cyrillic and emoji text: multibyte tokens and byte pieces split across tokens.
NON_ASCII_PROMPTS = [
    "Translate into English: السلام عليكم، كيف حالك اليوم؟",
    "日本の首都はどこですか？一文で答えてください。",
    "Write one sentence that uses these three emoji: 🚀🌍✨",
    "Объясни в двух предложениях, что такое фотосинтез.",
]
