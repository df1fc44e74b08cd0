"""`wedlm-hf train` and `wedlm-hf convert` end to end on tiny models: logs, checkpoints, resume, seeds, 2 processes."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
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
from wedlm_hf.cli import main as cli

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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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
