"""Held-out evaluation data, the offline corpus split, the evaluation report and the `generate` demo."""

import json
import sysconfig

import pytest
import torch
from conftest import absolute_paths, build_model

from wedlm_hf.data.offline_mix import EOS_TAIL, TRAIN_TASK_SEED, task_windows
from wedlm_hf.data.stdlib_corpus import stdlib_files, stdlib_root
from wedlm_hf.data.synthetic_tasks import FAMILIES, task_items
from wedlm_hf.evaluation.demo import run_demo
from wedlm_hf.evaluation.evaluate import _Lossless, evaluate, fewest_forwards, held_out_items


def test_held_out_items_never_appear_in_training():
    for family in FAMILIES:
        train = {q for q, _ in task_items(family, 2000, TRAIN_TASK_SEED)}
        held = held_out_items(family, 50, 2000)
        assert len(held) == 50 and not train & {q for q, _ in held}


def test_stdlib_split_is_disjoint_and_found_through_sysconfig():
    assert stdlib_root() == __import__("pathlib").Path(sysconfig.get_paths()["stdlib"])
    train, held = set(stdlib_files("train")), set(stdlib_files("eval"))
    assert train and held and not train & held
    assert not any("test" in p.relative_to(stdlib_root()).parts for p in train | held)


def test_task_windows_flag_prompts_and_start_with_an_item(char_tokenizer):
    windows = task_windows(char_tokenizer, seq_len=96, items_per_family=20)
    assert windows and all(len(w["input_ids"]) <= 96 for w in windows)
    eos = char_tokenizer.eos_token_id
    for w in windows:
        assert w["prompt_mask"][0] == 1 and len(w["prompt_mask"]) == len(w["input_ids"])
        assert w["input_ids"][-1 - EOS_TAIL :] == [eos] * (1 + EOS_TAIL)  # answers end with a learned eos tail
        assert w["prompt_mask"][-1 - EOS_TAIL :] == [0] * (1 + EOS_TAIL)


def test_evaluation_report_on_a_tiny_model(tmp_path, char_tokenizer):
    build_model(dtype=torch.float32).save_pretrained(tmp_path, tokenizer=char_tokenizer)
    lines = []
    report = evaluate(
        str(tmp_path),
        items_per_family=3,
        code_items=2,
        code_prompt_tokens=16,
        code_new_tokens=8,
        train_items_per_family=200,
        threads=1,
        log=lines.append,
    )
    assert set(report["families"]) == set(FAMILIES) and len(lines) == len(FAMILIES) + 1
    for r in report["families"].values():
        assert r["items"] == 3 and 0 <= r["wedlm_exact_match"] <= 1 and r["tokens_per_forward"] > 0
        assert r["tokens_per_forward"] <= r["tokens_per_forward_ceiling"]
    for r in [*report["families"].values(), report["code"]]:
        assert r["lossless"]["identical_to_ar"] is True and r["lossless"]["tokens_per_forward"] > 0
        assert r["lossless"]["speedup"] > 0
        by_source = r["lossless"]["accepted_drafts"]
        assert set(by_source) == {"model", "context"} and all(type(v) is int and v >= 0 for v in by_source.values())
    assert all("lossless (identical to AR)" in line for line in lines)
    for family, line in zip([*FAMILIES, "code"], lines):
        r = report["code"] if family == "code" else report["families"][family]
        by_source = r["lossless"]["accepted_drafts"]
        assert f"of drafts accepted (model {by_source['model']}, context {by_source['context']})" in line, line
    assert report["code"]["items"] == 2 and 0 <= report["code"]["token_agreement_with_ar"] <= 1
    json.dumps(report)
    # The report travels with the model (eval_results.json): a folder outside the working directory keeps its name.
    assert report["settings"]["model"] == tmp_path.name and not absolute_paths(report)


def test_lossless_context_drafts_are_counted_apart_from_the_models(monkeypatch):
    """Code repeats its own names: the shipped model's lossless decoding accepts drafts copied from the context, and
    they are reported beside the model's own (their sum: every accepted draft, as the decoder counted them)."""
    from wedlm_hf import default_model_path

    accepted = {}
    real_add = _Lossless.add

    def add(self, prompt, prompt_tokens, ar, out):
        stats = out.wedlm_stats[0]
        totals = accepted.setdefault(self.family, [0, 0])
        totals[0] += stats.accepted_drafts
        totals[1] += stats.accepted_context_drafts
        real_add(self, prompt, prompt_tokens, ar, out)

    monkeypatch.setattr(_Lossless, "add", add)
    report = evaluate(
        default_model_path(), items_per_family=2, code_items=1, train_items_per_family=200, threads=1, log=print
    )
    assert report["code"]["lossless"]["accepted_drafts"]["context"] > 0, report["code"]["lossless"]
    for family, (total, context) in accepted.items():
        r = report["code"] if family == "code" else report["families"][family]
        assert r["lossless"]["accepted_drafts"] == {"model": total - context, "context": context}


def test_generate_demo_streams_and_compares(tmp_path, char_tokenizer, capsys):
    build_model(dtype=torch.float32).save_pretrained(tmp_path, tokenizer=char_tokenizer)
    report = run_demo("def f(n):", model_path=str(tmp_path), max_new_tokens=12)
    printed = capsys.readouterr().out
    assert printed.startswith("def f(n):") and "tokens/forward" in printed and "WeDLM / AR tokens/s" in printed
    assert report["wedlm"]["tokens"] == 12 and report["ar"]["tokens"] == 12


@pytest.mark.parametrize("context", [False, True], ids=["paper", "context-drafts"])
def test_fewest_forwards_is_reached_when_every_mask_is_accepted(model64, context):
    """The ceiling the evaluation reports is exact: a model whose every mask passes the threshold attains it (with
    context drafts, where no copy was checked: a rejected copy costs a forward, and none may hold)."""
    ids = torch.arange(3, 11)[None]
    reached = 0
    for n, window in [(1, 16), (7, 16), (16, 16), (17, 16), (40, 8), (5, 4), (33, 16), (9, 1)]:
        out = model64.generate(
            ids,
            strategy="wedlm",
            max_new_tokens=n,
            eos_token_id=None,
            wedlm_window_size=window,
            wedlm_entropy_threshold=1e9,
            wedlm_context_drafts=context,
            return_dict_in_generate=True,
        )
        stats = out.wedlm_stats[0]
        fewest = fewest_forwards(n, window)
        assert stats.forwards >= fewest, (n, window)
        if not stats.accepted_context_drafts + stats.rejected_context_drafts:
            assert stats.forwards == fewest, (n, window)
            reached += 1
    assert reached >= 6
    assert [fewest_forwards(n, 16) for n in (1, 8, 16, 17, 33)] == [1, 1, 1, 2, 3]


def test_generate_demo_lossless_says_it_matches_ar(tmp_path, char_tokenizer, capsys):
    from wedlm_hf.cli import main as cli

    build_model(dtype=torch.float32).save_pretrained(tmp_path, tokenizer=char_tokenizer)
    cli(["generate", "def f(n):", "--model", str(tmp_path), "--max-new-tokens", "12", "--lossless"])
    printed = capsys.readouterr().out
    assert "WeDLM lossless (W=16" in printed and "of drafts accepted" in printed
    assert "output identical to plain AR generate: yes" in printed


def test_evaluation_refuses_to_average_a_lossless_difference(tmp_path, char_tokenizer, monkeypatch):
    """If lossless decoding ever differed from AR, the evaluation says so instead of reporting numbers."""
    from wedlm_hf.modeling import draft_verification

    build_model(dtype=torch.float32).save_pretrained(tmp_path, tokenizer=char_tokenizer)
    monkeypatch.setattr(draft_verification.ArPredictions, "judge", lambda self, i, draft: None)  # accept every draft
    monkeypatch.setattr(draft_verification.ArPredictions, "held", lambda self, i, tokens: len(tokens))
    with pytest.raises(AssertionError, match=r"lossless decoding differed from plain AR generate on \d+ counting"):
        evaluate(str(tmp_path), items_per_family=3, code_items=1, train_items_per_family=200, threads=1, log=print)
