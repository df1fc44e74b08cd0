"""`wedlm-hf train` and `wedlm-hf convert` end to end on tiny models: logs, checkpoints, resume (also after kill -9),
seeds, 2 processes, and the errors for bad options and data."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import absolute_paths
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from wedlm_hf import WeDLMForCausalLM
from wedlm_hf.cli import console
from wedlm_hf.cli import main as cli
from wedlm_hf.evaluation.server_process import free_port

SHAPE = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=128,
)


def char_tokenizer_without_mask() -> PreTrainedTokenizerFast:
    vocab = {chr(c): i for i, c in enumerate(range(32, 126))}
    vocab["<eos>"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")


@pytest.mark.parametrize(
    "make",
    [
        lambda v: Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=16, vocab_size=v)),
        lambda v: Qwen2ForCausalLM(Qwen2Config(**SHAPE, vocab_size=v)),
        lambda v: LlamaForCausalLM(LlamaConfig(**SHAPE, vocab_size=v)),
    ],
    ids=["qwen3", "qwen2", "llama"],
)
def test_convert_round_trip(tmp_path, make):
    tokenizer = char_tokenizer_without_mask()
    torch.manual_seed(0)
    ar = make(len(tokenizer)).eval()
    ar.save_pretrained(tmp_path / "ar")
    tokenizer.save_pretrained(tmp_path / "ar")
    cli(["convert", str(tmp_path / "ar"), str(tmp_path / "wedlm")])

    before = AutoTokenizer.from_pretrained(tmp_path / "ar")
    converted_tok = AutoTokenizer.from_pretrained(tmp_path / "wedlm")
    model = WeDLMForCausalLM.from_pretrained(tmp_path / "wedlm").eval()
    assert before.mask_token_id is None and converted_tok.mask_token == "<|mask|>"
    assert model.config.mask_token_id == converted_tok.mask_token_id == len(converted_tok) - 1
    assert model.config.vocab_size == len(converted_tok)
    x = torch.randint(0, len(tokenizer) - 1, (2, 10))
    vocab = ar.config.vocab_size
    torch.testing.assert_close(model(x).logits[..., :vocab], ar(x).logits, rtol=0, atol=1e-5)
    out = model.generate(x[:1], strategy="wedlm", max_new_tokens=6, eos_token_id=None)
    assert out.shape == (1, 16)


def test_convert_refuses_other_families(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=95)).save_pretrained(tmp_path / "gpt2")
    char_tokenizer_without_mask().save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="supported families are qwen2, qwen3, llama"):
        cli(["convert", str(tmp_path / "gpt2"), str(tmp_path / "out")])


def test_convert_names_a_missing_folder_or_file(tmp_path):
    from wedlm_hf.training.conversion import convert_ar_checkpoint

    with pytest.raises(FileNotFoundError, match=f"{re.escape(str(tmp_path / 'nowhere'))}: no such folder.*local"):
        convert_ar_checkpoint(str(tmp_path / "nowhere"), str(tmp_path / "out"))
    with pytest.raises(SystemExit):  # the command line refuses it before anything loads
        cli(["convert", str(tmp_path / "nowhere"), str(tmp_path / "out")])
    char_tokenizer_without_mask().save_pretrained(tmp_path / "no-config")
    with pytest.raises(FileNotFoundError, match="no-config has no config.json"):
        cli(["convert", str(tmp_path / "no-config"), str(tmp_path / "out")])
    Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=16, vocab_size=96)).save_pretrained(tmp_path / "no-tokenizer")
    with pytest.raises(FileNotFoundError, match="no-tokenizer has no tokenizer files.*save_pretrained"):
        cli(["convert", str(tmp_path / "no-tokenizer"), str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def save_ar(folder: Path, seed: int = 0, **save_kwargs) -> None:
    torch.manual_seed(seed)
    Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=16, vocab_size=95)).save_pretrained(folder, **save_kwargs)
    char_tokenizer_without_mask().save_pretrained(folder)


def test_convert_into_a_non_empty_folder_needs_overwrite(tmp_path, capsys):
    """Before: the user's config.json was overwritten, and the command said nothing (exit status 0)."""
    from wedlm_hf.training.conversion import convert_ar_checkpoint

    save_ar(tmp_path / "ar")
    dst = tmp_path / "mine"
    dst.mkdir()
    (dst / "config.json").write_text('{"model_type": "mine"}')
    capsys.readouterr()
    status = console(["convert", str(tmp_path / "ar"), str(dst)])
    err = capsys.readouterr().err
    assert status == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"wedlm-hf convert: error: {dst} already holds files: ") and "--overwrite" in err
    with pytest.raises(FileExistsError, match=f"{re.escape(str(dst))} already holds files.*overwrite=True"):
        convert_ar_checkpoint(str(tmp_path / "ar"), str(dst))
    assert [p.name for p in dst.iterdir()] == ["config.json"] and "mine" in (dst / "config.json").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ar", "mine"]  # no staging folder left


def test_convert_overwrite_leaves_no_weights_of_the_earlier_model(tmp_path):
    dst = tmp_path / "wedlm"
    save_ar(dst, seed=0, max_shard_size="20KB")  # an earlier model there, sharded: an index and several shards
    assert (dst / "model.safetensors.index.json").exists()
    save_ar(tmp_path / "ar", seed=1)
    (dst / "notes.txt").write_text("mine")
    (dst / "pytorch_model.bin").write_bytes(b"older still")

    cli(["convert", str(tmp_path / "ar"), str(dst), "--overwrite"])
    names = {p.name for p in dst.iterdir()}
    assert "model.safetensors" in names and (dst / "notes.txt").read_text() == "mine"
    assert not {n for n in names if n.startswith("model-") or n.endswith((".index.json", ".bin"))}, names
    expected = Qwen3ForCausalLM.from_pretrained(tmp_path / "ar").state_dict()
    loaded = WeDLMForCausalLM.from_pretrained(dst).state_dict()
    assert all(torch.equal(loaded[k][: len(v)], v) for k, v in expected.items())  # embeddings grew by the mask
    assert not list(tmp_path.glob(".wedlm.convert-*"))


@pytest.fixture(scope="module")
def setup_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    tok = char_tokenizer_without_mask()
    tok.add_special_tokens({"mask_token": "<|mask|>"})
    tok.save_pretrained(root / "tok")
    (root / "config.json").write_text(json.dumps({**SHAPE, "head_dim": 16, "qk_norm": True, "attention_bias": False}))
    lines = [
        json.dumps({"prompt": f"count {i}:", "completion": " " + " ".join(str(i + k) for k in range(6))})
        for i in range(40)
    ]
    (root / "data.jsonl").write_text("\n".join(lines))
    return root


def train_args(root: Path, out: Path, *extra) -> list[str]:
    return [
        "train",
        "--config",
        str(root / "config.json"),
        "--tokenizer",
        str(root / "tok"),
        "--data",
        str(root / "data.jsonl"),
        "--output-dir",
        str(out),
        "--seq-len",
        "32",
        "--block-size",
        "8",
        "--batch-size",
        "4",
        "--max-steps",
        "6",
        "--lr",
        "3e-3",
        "--logging-steps",
        "2",
        "--save-steps",
        "3",
        "--seed",
        "0",
        *extra,
    ]


def weights(folder: Path) -> dict:
    return load_file(folder / "model.safetensors")


def test_train_logs_both_losses_checkpoints_and_saves(setup_dir, tmp_path):
    cli(train_args(setup_dir, tmp_path / "run"))
    state = json.loads((tmp_path / "run" / "checkpoint-6" / "trainer_state.json").read_text())
    logged = [entry for entry in state["log_history"] if "loss" in entry]
    assert len(logged) == 3 and all({"ar_loss", "mlm_loss"} <= set(entry) for entry in logged)
    assert (tmp_path / "run" / "checkpoint-3").is_dir()
    final = tmp_path / "run" / "final"
    model = WeDLMForCausalLM.from_pretrained(final)
    assert model.config.mask_token_id == AutoTokenizer.from_pretrained(final).mask_token_id
    # The record travels with the model: paths outside the working directory keep only their name.
    info = json.loads((final / "training_info.json").read_text())
    assert not absolute_paths(info)
    assert info["arguments"]["output_dir"] == "run" and info["arguments"]["data"] == ["data.jsonl"]
    assert info["arguments"]["config"] == "config.json" and info["arguments"]["tokenizer"] == "tok"


def test_seeded_runs_are_identical_and_resume_continues_exactly(setup_dir, tmp_path):
    cli(train_args(setup_dir, tmp_path / "a"))
    cli(train_args(setup_dir, tmp_path / "b"))
    a, b = weights(tmp_path / "a" / "final"), weights(tmp_path / "b" / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # Interrupt after step 3: drop what came later, then resume from checkpoint-3.
    import shutil

    shutil.rmtree(tmp_path / "b" / "checkpoint-6")
    shutil.rmtree(tmp_path / "b" / "final")
    cli(train_args(setup_dir, tmp_path / "b", "--resume"))
    resumed = weights(tmp_path / "b" / "final")
    assert all(torch.equal(a[k], resumed[k]) for k in a)


def test_two_processes_under_accelerate_launch(setup_dir, tmp_path):
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    # `--multi_gpu` is accelerate's multi-process launcher (torchrun); without GPUs Trainer joins the ranks over gloo.
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(port),
        "-m",
        "wedlm_hf.cli",
        *train_args(setup_dir, tmp_path / "ddp"),
    ]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    state = json.loads((tmp_path / "ddp" / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    # Two processes of batch 4 consume 8 of the 40 samples per step: 6 steps are 1.2 epochs (one process: 0.6).
    assert state["epoch"] == pytest.approx(1.2)
    assert (tmp_path / "ddp" / "final" / "model.safetensors").exists()
    assert result.stdout.count("final model:") == 1  # printed by the main process only


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--max-steps", "0", "--max-steps must be at least 1 (got 0)"),  # Trainer would run one step
        ("--max-steps", "-1", "--max-steps must be at least 1 (got -1)"),  # Trainer would run three epochs
        ("--batch-size", "0", "--batch-size must be at least 1"),
        ("--grad-accum", "0", "--grad-accum must be at least 1"),
        ("--seq-len", "1", "--seq-len must be at least 2"),
        ("--block-size", "0", "--block-size must be at least 1"),
        ("--save-steps", "0", "--save-steps must be at least 1"),
        ("--logging-steps", "-5", "--logging-steps must be at least 1"),
        ("--lr", "0", "--lr must be a positive number"),
        ("--lr", "-0.0003", "--lr must be a positive number"),
        ("--warmup-ratio", "1", "--warmup-ratio is a share of --max-steps in [0, 1)"),
        ("--warmup-ratio", "-0.1", "--warmup-ratio is a share"),
        ("--weight-decay", "-0.01", "--weight-decay must be 0 or more"),
    ],
)
def test_train_refuses_nonsensical_options(setup_dir, tmp_path, option, value, message, capsys):
    """`train()` refuses them for Python callers; the command line refuses them too, most already while parsing."""
    from wedlm_hf.training.trainer import train

    names = {"--lr": "learning_rate", "--warmup-ratio": "warmup_ratio"}
    keyword = names.get(option, option[2:].replace("-", "_"))
    number = float(value) if option in (*names, "--weight-decay") else int(value)
    base = dict(config=str(setup_dir / "config.json"), tokenizer=str(setup_dir / "tok"), seq_len=32, block_size=8)
    with pytest.raises(ValueError, match=re.escape(message)):
        train(str(tmp_path / "run"), [str(setup_dir / "data.jsonl")], **{**base, keyword: number})
    assert option in refusal(train_args(setup_dir, tmp_path / "run", option, value), capsys)
    assert not (tmp_path / "run").exists()


def refusal(args: list[str], capsys) -> str:
    """What the command line says when it refuses `args`: a parse error (exit 2) or the command's own error."""
    with pytest.raises((ValueError, OSError, SystemExit)) as refused:
        cli(args)
    return capsys.readouterr().err if refused.type is SystemExit else str(refused.value)


GOOD = json.dumps({"text": "count 1 2 3"})


@pytest.mark.parametrize(
    "lines, message",
    [
        # json's own message would say "line 1 column 10" and name no file
        ([GOOD, "", '{"text": "unterminated}'], r"bad\.jsonl, line 3, column \d+: not valid JSON"),
        ([GOOD, json.dumps({"prompt": "a:", "completon": " b"})], r"bad\.jsonl, line 2: unknown key\(s\) completon"),
        ([json.dumps({"txt": "a"})], r"bad\.jsonl, line 1: unknown key\(s\) txt; a record is"),
        ([json.dumps({"prompt": "a:"})], r"bad\.jsonl, line 1: keys prompt; a record is"),
        ([json.dumps({"text": "a", "prompt": "b", "completion": "c"})], r"line 1: keys completion, prompt, text"),
        ([GOOD, json.dumps({"text": 5})], r'bad\.jsonl, line 2: "text" must be a string'),
        ([json.dumps(["text"])], r"bad\.jsonl, line 1: a record is a JSON object"),
    ],
)
def test_train_names_file_and_line_of_a_bad_record(setup_dir, tmp_path, lines, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    args = train_args(setup_dir, tmp_path / "run")
    args[args.index("--data") + 1] = str(bad)
    with pytest.raises(ValueError, match=message):
        cli(args)


def test_train_names_missing_data_files(setup_dir, tmp_path, capsys):
    args = train_args(setup_dir, tmp_path / "run")
    args[args.index("--data") + 1] = str(tmp_path / "missing.jsonl")
    assert re.search(r"--data.*missing\.jsonl", refusal(args, capsys))
    (tmp_path / "notes.md").write_text("some notes")
    args[args.index("--data") + 1] = str(tmp_path / "notes.md")
    assert re.search(r"notes\.md: (use|give) \.txt or \.jsonl", refusal(args, capsys))
    for option, missing in (("--config", "missing.json"), ("--tokenizer", "no-tokenizer")):
        args = train_args(setup_dir, tmp_path / "run")
        args[args.index(option) + 1] = str(tmp_path / missing)
        said = refusal(args, capsys)
        assert option in said and missing in said


# kill -9 at several points of a run, each recognised on disk (relative to the output folder) wherever the run writes
# its files, in the order a run that resumes every time reaches them: amid the first save (an optimizer state being
# written), between two saves, amid the save of step 5 after a resume, amid writing the final model.
KILL_POINTS = ("**/optimizer.pt", "checkpoint-3", "**/checkpoint-5", "*final")
CRASH = ("--save-steps", "1", "--logging-steps", "1", "--resume")


def appeared(out: Path, point: str) -> bool:
    try:
        return any(out.glob(point))
    except OSError:  # a folder vanished while it was listed (the run renames and deletes as it goes)
        return False


def run_until(setup_dir: Path, out: Path, point: str | None, log: Path) -> bool:
    """Runs `wedlm-hf train --resume` in a subprocess and kills it (SIGKILL) as soon as `point` exists; True when it
    was killed, False when it finished first."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    with log.open("a") as sink:
        run = subprocess.Popen(
            [sys.executable, "-m", "wedlm_hf.cli", *train_args(setup_dir, out, *CRASH)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
        )
        try:
            while run.poll() is None:
                if point and appeared(out, point):
                    run.send_signal(signal.SIGKILL)
                    run.wait()
                    return True
                time.sleep(0.0005)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
    assert run.returncode == 0, log.read_text()[-3000:]
    return False


def assert_checkpoints_complete(out: Path) -> None:
    """What a kill leaves: every checkpoint-N folder whole (state of step N, readable weights and optimizer)."""
    for folder in out.glob("checkpoint-*"):
        state = json.loads((folder / "trainer_state.json").read_text())
        assert f"checkpoint-{state['global_step']}" == folder.name
        load_file(folder / "model.safetensors")
        torch.load(folder / "optimizer.pt", weights_only=True)
        assert (folder / "scheduler.pt").exists() and (folder / "rng_state.pth").exists()


def test_resume_after_kill_during_saves_continues_exactly(setup_dir, tmp_path):
    """A run killed with SIGKILL at any point, saves included, resumes from its newest complete checkpoint; after
    every kill each checkpoint folder is whole, and the final weights equal those of an uninterrupted run."""
    cli(train_args(setup_dir, tmp_path / "straight", *CRASH))
    out, log = tmp_path / "killed", tmp_path / "runs.log"
    mid_save = 0
    for point in KILL_POINTS:
        if run_until(setup_dir, out, point, log):
            mid_save += any(out.glob("tmp-*"))  # the kill left a save unfinished
            assert_checkpoints_complete(out)
    assert not run_until(setup_dir, out, None, log)
    assert mid_save >= 1 and not any(out.glob("tmp-*"))
    straight, resumed = weights(tmp_path / "straight" / "final"), weights(out / "final")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    assert json.loads((out / "final" / "training_info.json").read_text())["resumed"]
