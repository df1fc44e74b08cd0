"""The benchmarks' shared report: columns whose header and cells line up, ratios and counts in words."""

import json

from wedlm_hf.evaluation.bench_report import (
    Column,
    best_of,
    plural,
    ratio_column,
    ratio_line,
    table_head,
    table_row,
    write_json,
)


def test_a_header_and_its_rows_line_up_whatever_the_figures():
    columns = [
        Column("run", 6, align="<"),
        Column("tok/s", 8, ".1f"),
        ratio_column("x/y", 7),
        Column("p50", 8, ".3f", "s"),
    ]
    head = table_head(columns, sep=" ")
    rows = [table_row(columns, ["ar", 12.345, 1.5, 0.25], sep=" "), table_row(columns, ["wedlm", 1234.5, 12.25, 3])]
    assert head == "run       tok/s     x/y      p50"
    assert rows[0] == "ar         12.3   1.50x   0.250s"
    assert rows[1] == "wedlm   1234.5 12.25x  3.000s"  # no separator: the widths alone
    assert len(rows[0]) == len(head)


def test_a_row_with_fewer_values_ends_early():
    columns = [Column("decoder", 8, align="<"), Column("tokens", 7), Column("forced", 7)]
    assert table_row(columns, ["AR", 12]) == "AR           12"


def test_counts_and_ratios_in_words():
    assert plural(1, "thread") == "1 thread" and plural(2, "thread") == "2 threads" and plural(0, "run") == "0 runs"
    assert best_of(1) == "best of 1 interleaved run" and best_of(3) == "best of 3 interleaved runs"
    assert ratio_line("a / b tokens/s", 2.345) == "a / b tokens/s: 2.35x"
    assert ratio_line("a / b", 1, " (timed once)") == "a / b: 1.00x (timed once)"


def test_measurements_go_to_a_json_file_only_when_one_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_json(None, {"a": 1})
    assert list(tmp_path.iterdir()) == []
    write_json(str(tmp_path / "out.json"), {"a": [1.5]})
    assert json.loads((tmp_path / "out.json").read_text()) == {"a": [1.5]}
