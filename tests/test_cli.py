"""The `wedlm-hf` command as a user meets it: fast help, defaults in the help, mistakes as one line (no traceback)."""

import argparse
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import build_model

from wedlm_hf.cli import _HelpFormatter, build_parser, console


def run_console(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of the installed script's entry point, in this process."""
    capsys.readouterr()  # drop what the test printed before (progress bars of save_pretrained, ...)
    try:
        status = console(list(argv))
    except SystemExit as exit_:  # argparse errors and --help
        status = exit_.code
    out = capsys.readouterr()
    return status, out.out, out.err


def assert_one_line_error(err: str, command: str, *fragments: str) -> None:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"wedlm-hf {command}: error: "), err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def test_help_imports_neither_torch_nor_transformers():
    code = (
        "import contextlib, io, json, sys\n"
        "from wedlm_hf.cli import console\n"
        "texts = []\n"
        "for argv in (['--help'], ['generate', '--help'], ['bench', '--help']):\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "        console(argv)\n"
        "    texts.append(out.getvalue())\n"
        "print(json.dumps([texts, [m for m in ('torch', 'transformers') if m in sys.modules]]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    texts, heavy = json.loads(result.stdout)
    assert heavy == [], f"--help imported {heavy}"
    assert "generate" in texts[0] and "--debug" in texts[0]
    assert "(default: 128)" in texts[1] and "(default: 16)" in texts[1] and "(default: 0.4)" in texts[1]
    assert "(default: cpu)" in texts[2] and "(default: auto)" in texts[2]


def subcommands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_every_option_states_its_default(command):
    formatter = _HelpFormatter(prog="wedlm-hf")
    parser = subcommands()[command]
    one_of = [a for group in parser._mutually_exclusive_groups if group.required for a in group._group_actions]
    for action in parser._actions:
        if not action.option_strings or action.required or isinstance(action, argparse._StoreTrueAction):
            continue
        if action.help is argparse.SUPPRESS or action.dest == "help":
            continue
        if action in one_of:  # train --model / --config: one of them is required, neither has a default
            continue
        assert "default" in formatter._get_help_string(action), f"{command} {action.option_strings[0]}"


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["generate", "hi", "--threshold", "abc"], "argument --threshold: 'abc' is neither a number >= 0 nor 'none'"),
        (["generate", "hi", "--window-size", "0"], "argument --window-size: '0' is not a positive whole number"),
        (["generate", "hi", "--max-new-tokens", "many"], "argument --max-new-tokens: 'many' is not a whole number"),
        (["generate", "hi", "--penalty", "-1"], "argument --penalty: '-1' is not a number >= 0"),
        (["bench", "--long-tokens", "-3"], "argument --long-tokens: '-3' is negative"),
        (["bench", "--dtype", "float8"], "argument --dtype: invalid choice: 'float8'"),
    ],
)
def test_bad_values_are_one_line_without_internal_names(capsys, argv, fragment):
    status, _, err = run_console(capsys, *argv)
    assert status == 2
    assert_one_line_error(err, argv[0], fragment, f"(see `wedlm-hf {argv[0]} --help`)")
    assert "_threshold" not in err and "positive_int" not in err and "invalid" not in err.replace("invalid choice", "")


def test_empty_prompt_is_refused_up_front(capsys):
    status, out, err = run_console(capsys, "generate", "")
    assert status == 2 and out == ""
    assert_one_line_error(err, "generate", "the prompt is empty")


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "hi", "--model", "/nonexistent"],
        ["evaluate", "--model", "/nonexistent"],
        ["bench", "--model", "/nonexistent"],
        ["train", "--output-dir", "out", "--data", "offline-mix", "--model", "/nonexistent"],
        ["convert", "/nonexistent", "out"],
        ["export", "/nonexistent", "out"],
        ["card", "/nonexistent", "README.md", "--repo-id", "me/x"],
        ["ship-default", "/nonexistent"],
        ["push", "/nonexistent", "me/x"],
    ],
)
def test_missing_local_folders_are_reported_as_missing_folders(capsys, argv):
    status, _, err = run_console(capsys, *argv)
    assert status == 2
    assert_one_line_error(err, argv[0], "no folder /nonexistent", "hf download")
    assert "model identifier" not in err and "huggingface.co" not in err  # not read as a Hub repo id


def test_missing_files_are_named(capsys, tmp_path):
    status, _, err = run_console(
        capsys, "train", "--output-dir", "o", "--data", str(tmp_path / "gone.jsonl"), "--config", "x"
    )
    assert status == 2
    assert_one_line_error(err, "train", f"no file {tmp_path / 'gone.jsonl'}")


def test_prompt_longer_than_the_context_names_the_users_values(capsys, tmp_path, char_tokenizer):
    """Before: the AR warm-up failed first and reported its own max_new_tokens (2)."""
    build_model(dtype=torch.float32).save_pretrained(tmp_path, tokenizer=char_tokenizer)  # 512 positions
    status, out, err = run_console(capsys, "generate", "x" * 500, "--model", str(tmp_path), "--max-new-tokens", "20")
    assert status == 1 and out == ""
    assert_one_line_error(err, "generate", "500 tokens", "--max-new-tokens is 20", "512 positions", "(to 12 at most)")
    status, _, err = run_console(capsys, "generate", "x" * 600, "--model", str(tmp_path))
    assert status == 1
    assert_one_line_error(err, "generate", "600 tokens and the model has 512 positions")


@pytest.mark.parametrize(
    "argv",
    [["generate", "hi", "--no-compare"], ["evaluate", "--items", "1", "--code-items", "0"], ["serve", "--port", "0"]],
    ids=lambda argv: argv[0],
)
def test_pickle_weights_torch_refuses_are_one_line_naming_the_file(capsys, tmp_path, char_tokenizer, argv):
    """Before: torch's UnpicklingError, a bug to the command line, with its traceback and multi-line message."""
    if argv[0] == "serve":
        pytest.importorskip("fastapi")
    model = build_model(dtype=torch.float32)
    model.save_pretrained(tmp_path, tokenizer=char_tokenizer)
    (tmp_path / "model.safetensors").unlink()
    torch.save({**model.state_dict(), "args": argparse.Namespace(lr=1e-3)}, tmp_path / "pytorch_model.bin")
    status, out, err = run_console(capsys, *argv, "--model", str(tmp_path))
    assert status == 1 and out == ""
    assert_one_line_error(err, argv[0], f"{tmp_path / 'pytorch_model.bin'} is pickle weights", "safetensors")


def test_errors_raised_by_a_command_are_one_line_and_debug_shows_the_traceback(capsys, tmp_path, monkeypatch):
    status, _, err = run_console(capsys, "push", str(tmp_path), "not a/valid/name")
    assert status == 1
    assert_one_line_error(err, "push", "repo name", "ORG/NAME")
    with pytest.raises(ValueError, match="repo name"):
        console(["--debug", "push", str(tmp_path), "not a/valid/name"])
    with pytest.raises(ValueError, match="repo name"):
        console(["push", str(tmp_path), "not a/valid/name", "--debug"])
    monkeypatch.setenv("WEDLM_HF_DEBUG", "1")
    with pytest.raises(ValueError, match="repo name"):
        console(["push", str(tmp_path), "not a/valid/name"])


def test_multi_line_messages_become_one_line(capsys, tmp_path):
    (tmp_path / "config.json").write_text("{ not json")  # a checkpoint folder with a broken config
    status, _, err = run_console(capsys, "export", str(tmp_path), str(tmp_path / "out"))
    assert status == 1
    assert_one_line_error(err, "export")


def test_ctrl_c_while_streaming_ends_the_prompt_line_and_exits_130(capsys, tmp_path, char_tokenizer, monkeypatch):
    build_model(dtype=torch.float32).save_pretrained(tmp_path, tokenizer=char_tokenizer)
    import wedlm_hf.evaluation.demo as demo

    class InterruptedStreamer(demo.TextStreamer):
        """Ctrl-C arriving while the completion streams."""

        def put(self, value):
            if not self.next_tokens_are_prompt:
                raise KeyboardInterrupt
            super().put(value)

    monkeypatch.setattr(demo, "TextStreamer", InterruptedStreamer)
    status, out, err = run_console(capsys, "generate", "def f(n):", "--model", str(tmp_path), "--no-compare")
    assert status == 130
    assert out == "def f(n):\n"  # the streamed line is ended before the message
    assert err == "wedlm-hf generate: interrupted\n"


def test_bugs_keep_their_traceback(tmp_path, monkeypatch):
    import wedlm_hf.hub.custom_generate as custom_generate

    def broken(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(custom_generate, "custom_generate_command", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        console(["custom-generate", str(tmp_path)])


def test_console_script_exit_status_and_stderr(tmp_path):
    """The installed entry point, end to end in a fresh process: status 2, one line, no traceback."""
    env = {**os.environ, "WEDLM_HF_DEBUG": ""}
    result = subprocess.run(
        [sys.executable, "-m", "wedlm_hf.cli", "generate", "hi", "--model", str(tmp_path / "gone")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert_one_line_error(result.stderr, "generate", f"no folder {tmp_path / 'gone'}")


def test_serve_names_a_missing_model_folder(capsys):
    """`serve --model` also takes Hub ids, so a missing folder is caught when the server loads, in one line."""
    pytest.importorskip("fastapi")
    status, _, err = run_console(capsys, "serve", "--model", "/nonexistent")
    assert status == 1
    assert_one_line_error(err, "serve", "--model /nonexistent: no such folder")
    assert "Repo id must use" not in err


def test_context_draft_options_reach_the_default_mode(capsys):
    """The default mode drafts from the context too: without --lossless the options are taken, not refused."""
    common = ["generate", REPEATING, "--max-new-tokens", "40", "--no-compare"]
    status, out, err = run_console(capsys, *common)
    assert status == 0, err
    assert accepted_by_source(out)[1] > 0, out
    status, out, err = run_console(capsys, *common, "--no-context-drafts")
    assert status == 0, err
    assert accepted_by_source(out)[1] == 0, out
    args = build_parser().parse_args(["generate", "hi", "--context-ngram", "2"])
    assert not args.lossless and args.context_ngram == 2


def test_context_ngram_must_be_positive(capsys):
    status, _, err = run_console(capsys, "generate", "hi", "--lossless", "--context-ngram", "0")
    assert status == 2
    assert_one_line_error(err, "generate", "argument --context-ngram: '0' is not a positive whole number")


REPEATING = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"


def accepted_by_source(out: str) -> tuple[int, int]:
    """Accepted drafts by source from `generate`'s WeDLM line, (0, 0) where no draft was judged."""
    summary = next(line for line in out.splitlines() if line.startswith("WeDLM ") and " tokens in " in line)
    if "of drafts accepted" not in summary:
        return 0, 0
    model, context = summary.split("of drafts accepted (model ")[1].rstrip(")").split(", context ")
    return int(model), int(context)


def test_lossless_generate_reports_accepted_drafts_by_source(capsys):
    """The shipped model continuing code that repeats itself: drafts copied from the context are accepted."""
    common = ["generate", REPEATING, "--lossless", "--max-new-tokens", "40"]
    status, out, err = run_console(capsys, *common)
    assert status == 0, err
    _, context = accepted_by_source(out)
    assert context > 0, out
    assert "output identical to plain AR generate: yes" in out
    status, out, err = run_console(capsys, *common, "--no-context-drafts", "--no-compare")
    assert status == 0, err
    assert accepted_by_source(out)[1] == 0, out
    status, out, err = run_console(capsys, *common, "--context-ngram", "1", "--no-compare")
    assert status == 0, err
    assert accepted_by_source(out)[1] > 0, out
