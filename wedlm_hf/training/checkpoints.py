"""Checkpoints that appear whole, and resuming from the newest complete one.

Trainer writes `checkpoint-N` file by file in place, so a run killed while saving leaves a half-written
`checkpoint-N`, and `resume_from_checkpoint=True` (`get_last_checkpoint`: the highest N) then picks it and fails.
Here a checkpoint is written under `tmp-checkpoint/checkpoint-N` (every process adds its RNG state there), flushed
to disk, and renamed to `checkpoint-N` by the main process; old checkpoints are renamed away before they are deleted.
So a `checkpoint-N` folder is complete or absent, whenever the run is killed. Resuming takes the highest N whose
files are all there and readable, and removes what a crash left behind: the staging and to-be-deleted folders of
our own saves (nothing else of the output folder), and incomplete checkpoints written without this protection.
"""

import json
import os
import re
import shutil
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..hub import check_safetensors

LEFTOVER = "tmp-"  # the prefix of everything here that exists only while a save or a deletion is under way
STAGING = LEFTOVER + "checkpoint"  # where checkpoints are written before they are renamed into place
FINAL_STAGING = LEFTOVER + "final"  # the same for the final model folder
CHECKPOINT = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
# What `Trainer._save_checkpoint` writes besides the weights and RNG states (save_only_model is never set here).
REQUIRED = ("config.json", "trainer_state.json", "optimizer.pt", "scheduler.pt")


def fsync_tree(folder: Path) -> None:
    """Flushes every file of `folder` and the folder itself, so the rename that follows publishes data on disk."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    fsync_dir(folder)


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def discard(folder: Path) -> None:
    """Deletes a folder after renaming it to a leftover name, so it is never seen half-deleted under its own name."""
    doomed = folder.with_name(f"{LEFTOVER}old-{folder.name}")
    os.replace(folder, doomed)
    shutil.rmtree(doomed)


def publish(staged: Path, final: Path) -> Path:
    """Moves a fully written folder to its final name in one rename (an older folder of that name goes first)."""
    fsync_tree(staged)
    if final.exists():
        discard(final)
    os.replace(staged, final)
    fsync_dir(final.parent)
    return final


def rotate(output_dir: Path, keep: int | None) -> None:
    """Keeps the newest `keep` checkpoints (all, when `keep` is None or 0), like Trainer's `save_total_limit`."""
    if keep:
        for old in checkpoints(output_dir)[keep:]:
            discard(old)


def step_of(folder: Path) -> int | None:
    match = CHECKPOINT.match(folder.name)
    return int(match.group(1)) if match and folder.is_dir() else None


def is_complete(folder: Path) -> bool:
    """All of a checkpoint's files are there and readable: state of the right step, weights, optimizer, RNG."""
    if any(not (folder / name).is_file() for name in REQUIRED):
        return False
    if not any(folder.glob("rng_state*.pth")):
        return False
    try:
        state = json.loads((folder / "trainer_state.json").read_text())
        if state.get("global_step") != step_of(folder):
            return False
        index = folder / "model.safetensors.index.json"
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else []
        for name in shards or ["model.safetensors"]:
            check_safetensors(folder / name)
    except (OSError, ValueError, KeyError):
        return False
    return True


def checkpoints(output_dir: Path) -> list[Path]:
    """The `checkpoint-N` folders of a run, newest (highest N) first."""
    found = [p for p in output_dir.iterdir() if step_of(p) is not None] if output_dir.is_dir() else []
    return sorted(found, key=step_of, reverse=True)


def last_complete_checkpoint(output_dir) -> Path | None:
    """The checkpoint a resumed run continues from: the newest complete one."""
    return next((p for p in checkpoints(Path(output_dir)) if is_complete(p)), None)


def remove_crash_leftovers(output_dir, resume_from: Path | None, log=print) -> None:
    """Removes the leftovers of our own saves (`tmp-checkpoint`, `tmp-final`, `tmp-old-*`) and the incomplete
    checkpoints newer than `resume_from` (the resumed run writes those steps again; left in place they would outrank
    complete checkpoints in the rotation)."""
    out = Path(output_dir)
    ours = [out / STAGING, out / FINAL_STAGING, *out.glob(LEFTOVER + "old-*")]  # only names this module makes
    for leftover in sorted(p for p in ours if p.exists()):
        log(f"removing {leftover}, left by an interrupted save")
        if leftover.is_dir():
            shutil.rmtree(leftover)
        else:
            leftover.unlink()
    newest = step_of(resume_from) if resume_from is not None else -1
    for folder in checkpoints(out):
        if step_of(folder) > newest and not is_complete(folder):
            log(f"removing {folder}: incomplete (an interrupted save), resuming from {resume_from or 'the start'}")
            shutil.rmtree(folder)
