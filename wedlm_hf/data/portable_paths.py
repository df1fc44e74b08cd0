"""Paths as the records of a run (`training_info.json`, `eval_results.json`) hold them: machine-independent.

The records travel with a checkpoint (into the package, onto the Hub), so an absolute path of the machine that made
them would name a folder nobody else has. A path inside the working directory is kept relative to it (a run started
from a checkout records `build/default-model/run`); any other path keeps only its last component.
"""

from pathlib import Path


def portable_path(path) -> str | None:
    """`path` relative to the working directory when it lies inside it, else its final component; None stays None."""
    if path is None:
        return None
    given = Path(path)
    try:
        return given.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return given.resolve().name
