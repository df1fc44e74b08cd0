"""The benchmarks' shared timing: every run once per repeat in a rotating order, each kept at its best."""

import gc

from wedlm_hf.evaluation import interleaved_runs
from wedlm_hf.evaluation.interleaved_runs import interleave, rotated


class FakeClock:
    """perf_counter for runs that say how long they take."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_each_repeat_starts_from_the_next_name():
    names = ["a", "b", "c"]
    assert [rotated(names, r) for r in range(4)] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], names]


def test_runs_are_warmed_up_then_interleaved_case_by_case(monkeypatch):
    clock, calls = FakeClock(), []
    monkeypatch.setattr(interleaved_runs.time, "perf_counter", clock)

    def run(name: str):
        def call(case):
            calls.append((case, name))
            return name

        return call

    timings = interleave({"a": run("a"), "b": run("b")}, repeats=2, cases=["x", "y"], warm_up=True)
    warm_up, first, second = calls[:4], calls[4:8], calls[8:]
    assert warm_up == [("x", "a"), ("x", "b"), ("y", "a"), ("y", "b")]
    assert first == warm_up and second == [("x", "b"), ("x", "a"), ("y", "b"), ("y", "a")]
    assert set(timings.seconds) == {("x", "a"), ("x", "b"), ("y", "a"), ("y", "b")}
    assert all(len(seconds) == 2 for seconds in timings.seconds.values())


def test_the_best_time_and_the_fastest_runs_result_are_kept(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(interleaved_runs.time, "perf_counter", clock)
    durations = iter([3.0, 1.0, 2.0])

    def run():
        clock.now += next(durations)
        return clock.now

    timings = interleave({"only": run}, repeats=3)  # without cases: keyed by name, called without an argument
    assert timings.seconds["only"] == [3.0, 1.0, 2.0]
    assert timings.best("only") == 1.0 and timings.result("only") == 4.0  # what the second (fastest) run returned


def test_what_exists_before_the_timed_runs_is_left_out_of_collections_while_they_run():
    before = gc.get_freeze_count()
    frozen = []
    interleave({"run": lambda: frozen.append(gc.get_freeze_count())}, repeats=2)
    assert len(frozen) == 2 and all(count > before for count in frozen)
    assert gc.get_freeze_count() == before
