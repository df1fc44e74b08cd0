"""What every benchmark times with: its runs interleaved, each kept at its best of N.

A busy machine slows whatever runs while it is busy. Running every decoder once per repeat, in an order that rotates
each repeat, spreads that over all of them alike, and the best of the repeats is the run the machine disturbed
least; so the ratios between decoders compare like with like even where the absolute times do not.
"""

import functools
import gc
import time

import torch


def rotated(names: list, repeat: int) -> list:
    """`names` starting from another one each repeat (the `repeat`-th, wrapping around)."""
    start = repeat % len(names)
    return names[start:] + names[:start]


def _synchronize(device: torch.device | None) -> None:
    """Waits for queued GPU work, so a wall-clock interval covers the kernels it launched."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device | None = None):
    """(wall seconds, result) of one call of `fn`; on a GPU `device`, its queued work is waited for on both ends."""
    _synchronize(device)
    start = time.perf_counter()
    result = fn()
    _synchronize(device)
    return time.perf_counter() - start, result


class Timings:
    """Each run's timed seconds in run order, and what its fastest run returned (the runs are deterministic: any
    run's output is the output; only the fastest one is kept, so a large output is held once)."""

    def __init__(self):
        self.seconds: dict = {}
        self._fastest: dict = {}

    def add(self, key, seconds: float, result) -> None:
        self.seconds.setdefault(key, []).append(seconds)
        if key not in self._fastest or seconds < self._fastest[key][0]:
            self._fastest[key] = (seconds, result)

    def best(self, key) -> float:
        return self._fastest[key][0]

    def result(self, key):
        """What the fastest run of `key` returned."""
        return self._fastest[key][1]


def interleave(runs: dict, repeats: int, cases=None, device=None, warm_up: bool = False) -> Timings:
    """Times every run `repeats` times. Each repeat goes through `cases` in order and, for each case, through the
    runs in an order that rotates each repeat (`rotated`), calling `runs[name](case)`; the timings are keyed
    `(case, name)`. Without `cases` the runs take no argument and are keyed by name. `warm_up`: every run once
    first, untimed (compilation, the allocator); a benchmark whose check pass calls every run has had its warm-up.
    `device`: a GPU's queued work is waited for around each timed run.

    Python's collector runs where allocations take it, and a full collection over torch's and transformers' objects
    takes a few hundred milliseconds: one landing in a timed run can multiply its time. What exists before the
    timed runs is collected once and frozen out of the collector (`gc.freeze`) until they end, so a collection
    during them scans only what they made."""

    def calls(order: list):
        if cases is None:
            yield from ((name, runs[name]) for name in order)
        else:
            for case in cases:
                yield from (((case, name), functools.partial(runs[name], case)) for name in order)

    names = list(runs)
    if warm_up:
        for _, call in calls(names):
            call()
    timings = Timings()
    gc.collect()
    gc.freeze()
    try:
        for repeat in range(repeats):
            for key, call in calls(rotated(names, repeat)):
                timings.add(key, *timed(call, device))
    finally:
        gc.unfreeze()
    return timings
