"""Python's standard library source as an offline code corpus, with a fixed held-out split.

The files are found through `sysconfig` (never a hard-coded path). A file is held out when a hash of its path
relative to the stdlib root falls in the evaluation bucket, so the split is the same on every machine with the
same Python version.
"""

import hashlib
import sysconfig
from pathlib import Path

_SKIP_PARTS = {"site-packages", "test", "tests", "idlelib", "__pycache__", "lib2to3", "turtledemo"}
EVAL_BUCKETS = 20  # 1 file in 20 is held out


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(split: str = "train", max_bytes: int = 200_000) -> list[Path]:
    """Sorted stdlib `.py` files of one split ("train" or "eval"), skipping tests and files over `max_bytes`."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}.")
    root = stdlib_root()
    chosen = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _SKIP_PARTS & set(rel.parts) or path.stat().st_size > max_bytes:
            continue
        held_out = int(hashlib.sha256(rel.as_posix().encode()).hexdigest(), 16) % EVAL_BUCKETS == 0
        if held_out == (split == "eval"):
            chosen.append(path)
    return chosen


def stdlib_texts(split: str = "train") -> list[str]:
    return [p.read_text(encoding="utf-8", errors="replace") for p in stdlib_files(split)]
