"""Write the example dataset used in the README and docs/tasks.md: sums and differences in
the arithmetic task's prompt template (so the built-in tiny model can learn them), with a
`difficulty` column that reaches reward functions as a keyword argument.

    python examples/data/make_sums.py
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = "What is {a} {op} {b}? Answer in format: 'Answer: {{result}}'\n"


def rows(rng: random.Random, count: int, seen: set) -> list[dict]:
    out = []
    while len(out) < count:
        a, b, op = rng.randint(0, 50), rng.randint(0, 50), rng.choice("+-")
        if (a, op, b) in seen:
            continue
        seen.add((a, op, b))
        answer = a + b if op == "+" else a - b
        out.append({"question": TEMPLATE.format(a=a, op=op, b=b), "answer": answer,
                    "difficulty": "hard" if answer < 0 or answer >= 50 else "easy"})
    return out


if __name__ == "__main__":
    rng, seen = random.Random(0), set()
    for name, count in (("sums_test.jsonl", 40), ("sums_train.jsonl", 400)):  # held-out drawn first
        (HERE / name).write_text("".join(json.dumps(row) + "\n" for row in rows(rng, count, seen)))
