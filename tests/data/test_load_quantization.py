"""`--quantization`: each choice's transformers config, and a one-line refusal where it cannot run here."""

import importlib.util

import pytest
import torch
from transformers import TorchAoConfig

from wedlm_hf.cli import QUANTIZATIONS as CLI_QUANTIZATIONS
from wedlm_hf.data import QUANTIZATIONS, default_model_path, quantization_config, quantization_name


def test_the_command_line_offers_the_data_wings_choices():
    assert CLI_QUANTIZATIONS == QUANTIZATIONS


def test_torchao_int8_is_torchaos_int8_weight_only():
    from torchao.quantization import Int8WeightOnlyConfig

    config = quantization_config("torchao-int8", "cpu", default_model_path())
    assert isinstance(config, TorchAoConfig) and isinstance(config.quant_type, Int8WeightOnlyConfig)
    assert quantization_config(None, "cpu", default_model_path()) is None


@pytest.mark.parametrize(
    "choice, fix",
    [
        ("torchao-int4", "runs on CUDA GPUs, not on cpu: use torchao-int8 there"),
        (
            "bitsandbytes-4bit",
            "pip install bitsandbytes" if importlib.util.find_spec("bitsandbytes") is None else "CUDA",
        ),
        ("int3", "is not one of torchao-int8"),
    ],
)
def test_what_cannot_run_here_is_refused_naming_the_fix(choice, fix):
    with pytest.raises(ValueError, match=f"--quantization {choice}") as error:
        quantization_config(choice, torch.device("cpu"), default_model_path())
    assert fix in str(error.value)


def test_int8_in_float64_is_refused_before_transformers_loads_it():
    """torchao has no float64 int8 kernels: transformers' loader died with a conversion report and a traceback."""
    with pytest.raises(ValueError, match="torchao-int8 quantizes float32, bfloat16 or float16 weights, not float64"):
        quantization_config("torchao-int8", torch.device("cpu"), default_model_path(), torch.float64)
    assert quantization_config("torchao-int8", torch.device("cpu"), default_model_path(), torch.float16) is not None


def test_quantization_name_reads_dicts_and_config_objects():
    class Saved:
        quantization_config = {"quant_method": "torchao", "quant_type": {}}

    class Loaded:
        quantization_config = quantization_config("torchao-int8", "cpu", default_model_path())

    class Plain:
        pass

    assert quantization_name(Saved) == quantization_name(Loaded) == "torchao"  # a dict, a TorchAoConfig
    assert quantization_name(Plain) is None
