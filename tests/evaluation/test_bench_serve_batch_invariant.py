"""`wedlm-hf bench-serve --servers wedlm wedlm-bi --rounds N`: the batch-invariant server beside the plain one, the
servers taking turns, and the switch's cost at every concurrency level (a smoke test, not a timing test)."""

import json

from wedlm_hf.cli import main as cli
from wedlm_hf.evaluation.serve_benchmark import server_command, summary
from wedlm_hf.evaluation.streaming_clients import LevelResult


def result(server: str, clients: int, tokens_per_s: float) -> LevelResult:
    return LevelResult(server, clients, clients, 1.0, 1.0, tokens_per_s, 0.1, 0.2, 0.3, 0.01, 0.02)


def test_the_switch_is_a_server_of_its_own_reported_against_wedlm_at_every_level():
    assert "--batch-invariant" in server_command("wedlm-bi", 9000, "m", None, None, 1)
    assert "--batch-invariant" not in server_command("wedlm", 9000, "m", None, None, 1)
    lines = summary([result("wedlm", 1, 100.0), result("wedlm-bi", 1, 90.0), result("wedlm", 16, 400.0)])
    assert lines == ["wedlm-bi / wedlm output tokens/s at 1 client: 0.90x (the switch costs 10%)"]


def test_side_by_side_rounds_keep_each_server_best_level(tmp_path, capsys):
    out = tmp_path / "bench.json"
    cli(
        ["bench-serve", "--servers", "wedlm", "wedlm-bi", "--clients", "1", "2", "--requests", "1"]
        + ["--max-tokens", "6", "--rounds", "2", "--json", str(out)]
    )
    printed = capsys.readouterr().out
    assert "best of 2 side-by-side rounds" in printed
    assert "wedlm-bi / wedlm output tokens/s at 1 client:" in printed
    assert "wedlm-bi / wedlm output tokens/s at 2 clients:" in printed
    rows = json.loads(out.read_text())
    assert [(r["server"], r["clients"]) for r in rows] == [("wedlm", 1), ("wedlm-bi", 1), ("wedlm", 2), ("wedlm-bi", 2)]
