"""Writing a checkpoint folder to its destination (`wedlm-hf export`, `wedlm-hf convert`): whole or not at all.

The folder is written into a temporary sibling and moved into place when complete, so an interrupted write never
looks finished. A destination that already holds files is refused unless `overwrite=True` (`--overwrite`): a
user's folder is not replaced by surprise. Then the earlier checkpoint's weights and indexes are removed first, so
no stale weight file can shadow the new ones (a sharded checkpoint over a single-file one would otherwise load the
old `model.safetensors`), and `config.json` is moved in last, so a folder interrupted midway has none and loads as
nothing.
"""

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# The weights of any earlier checkpoint in an overwritten destination: transformers would read them before ours.
STALE_WEIGHTS = (
    "model*.safetensors",
    "model.safetensors.index.json",
    "pytorch_model*.bin",
    "pytorch_model.bin.index.json",
)


@contextmanager
def staged_checkpoint(source, destination, command: str, overwrite: bool = False) -> Iterator[Path]:
    """Checks `destination` before anything is written, yields an empty staging folder to write the checkpoint
    into, and moves its files into `destination` when the block ends without error (`command` names the
    `wedlm-hf` sub-command in errors and in the staging folder's name)."""
    src, dst = Path(source), Path(destination)
    if dst.resolve() == src.resolve():
        raise ValueError(f"`wedlm-hf {command}` needs a destination different from the source folder.")
    if dst.exists() and not dst.is_dir():
        raise FileExistsError(f"{dst} is a file, not a folder: choose another destination for `wedlm-hf {command}`.")
    occupied = dst.is_dir() and any(dst.iterdir())
    if occupied and not overwrite:
        raise FileExistsError(
            f"{dst} already holds files: {command} into a new or empty folder, or pass --overwrite (overwrite=True) "
            "to replace the checkpoint there (its earlier weight files are removed; other files stay)."
        )
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = dst.parent / f".{dst.name}.{command}-{uuid.uuid4().hex[:8]}"  # same file system: moves are renames
    staging.mkdir()
    try:
        yield staging
        if occupied:
            _replace_checkpoint(staging, dst)
        else:
            if dst.is_dir():
                dst.rmdir()
            os.replace(staging, dst)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _replace_checkpoint(staging: Path, dst: Path) -> None:
    """Moves a finished checkpoint into an occupied folder: its config goes first and comes back last (a folder
    interrupted midway has no config.json, so nothing loads half of it); earlier weights go before new ones come."""
    (dst / "config.json").unlink(missing_ok=True)
    for pattern in STALE_WEIGHTS:
        for stale in dst.glob(pattern):
            stale.unlink()
    for path in sorted(staging.iterdir(), key=lambda p: p.name == "config.json"):
        os.replace(path, dst / path.name)
