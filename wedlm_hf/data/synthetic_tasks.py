"""Low-entropy task families generated offline: counting, copying, simple arithmetic and list operations.

Each item is a (prompt, answer) pair of plain text; the answer is fully determined by the prompt, which is what lets
a WeDLM model fill many slots per forward. Items are drawn from a seeded RNG; `split="eval"` items are drawn from a
disjoint seed space and filtered against the training prompts by the evaluation code.
"""

import random

FAMILIES = ("counting", "copying", "arithmetic", "lists")
_WORDS = (
    "apple river stone cloud tiger lamp orange seven piano forest candle mirror silver rocket garden window "
    "yellow thunder pencil planet bridge castle dragon ocean marble rabbit summer winter violin basket"
).split()


def counting(rng: random.Random) -> tuple[str, str]:
    start = rng.randint(0, 200)
    length = rng.randint(6, 24)
    step = rng.choice((1, 1, 1, 2, 5, 10))
    numbers = [start + i * step for i in range(length)]
    return f"count from {start} by {step}, {length} numbers:", " " + " ".join(map(str, numbers))


def copying(rng: random.Random) -> tuple[str, str]:
    words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 10)))
    return f"copy: {words} =>", f" {words}"


def arithmetic(rng: random.Random) -> tuple[str, str]:
    op = rng.choice("+-*")
    a, b = rng.randint(0, 99), rng.randint(0, 99 if op != "*" else 12)
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"{a} {op} {b} =", f" {value}"


def lists(rng: random.Random) -> tuple[str, str]:
    items = [rng.randint(0, 99) for _ in range(rng.randint(3, 9))]
    op = rng.choice(("reverse", "sort", "max", "min", "sum", "len"))
    result = {
        "reverse": items[::-1],
        "sort": sorted(items),
        "max": max(items),
        "min": min(items),
        "sum": sum(items),
        "len": len(items),
    }[op]
    return f"{op}({items}) =", f" {result}"


_GENERATORS = {"counting": counting, "copying": copying, "arithmetic": arithmetic, "lists": lists}


def task_items(family: str, count: int, seed: int) -> list[tuple[str, str]]:
    """`count` (prompt, answer) pairs of one family from a seeded RNG."""
    if family not in _GENERATORS:
        raise ValueError(f"Unknown task family {family!r}; known: {', '.join(FAMILIES)}.")
    rng = random.Random(f"{family}-{seed}")
    return [_GENERATORS[family](rng) for _ in range(count)]
