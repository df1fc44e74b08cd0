"""`--dtype`: what `auto` resolves to on each device, and that every command that loads a checkpoint takes it."""

import pytest
import torch

from wedlm_hf import default_model_path
from wedlm_hf.cli import DTYPES as CLI_DTYPES
from wedlm_hf.cli import build_parser
from wedlm_hf.data import DTYPES, load_dtype
from wedlm_hf.data.checkpoint_dtype import checkpoint_dtype


def test_auto_is_float32_on_a_cpu_and_half_precision_on_a_gpu():
    for saved in (None, torch.float32, torch.bfloat16, torch.float16):
        assert checkpoint_dtype("auto", "cpu", saved) == torch.float32
    assert checkpoint_dtype("auto", "cuda", torch.bfloat16) == torch.bfloat16  # the released checkpoints
    assert checkpoint_dtype("auto", "cuda", torch.float16) == torch.float16
    assert checkpoint_dtype("auto", "cuda", torch.float32) == torch.bfloat16  # halved, as vLLM's auto does
    assert checkpoint_dtype("auto", "cuda", torch.bfloat16, bf16_ok=False) == torch.float16
    assert checkpoint_dtype("bfloat16", "cpu", None) == torch.bfloat16  # an explicit choice is taken as given
    with pytest.raises(ValueError, match="--dtype 'half' is not one of auto, bfloat16, float16, float32"):
        checkpoint_dtype("half", "cpu", None)


def test_the_shipped_checkpoint_and_every_command():
    assert load_dtype("auto", "cpu", default_model_path()) == torch.float32
    assert load_dtype("float16", "cpu", default_model_path()) == torch.float16
    assert CLI_DTYPES == DTYPES
    for command in (["serve"], ["generate", "x"], ["evaluate"], ["bench"]):
        assert build_parser().parse_args(command).dtype == "auto"
        assert build_parser().parse_args([*command, "--dtype", "bfloat16"]).dtype == "bfloat16"
