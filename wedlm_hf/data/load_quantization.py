"""`--quantization`: weights quantized as the checkpoint loads, through transformers' own quantization configs.

- `torchao-int8`: torchao's int8 weight-only (`Int8WeightOnlyConfig`), on CPUs and GPUs: weights take a quarter of
  float32's memory, activations keep the model's dtype.
- `torchao-int4`: torchao's int4 weight-only, on CUDA GPUs (its CPU kernels need packages outside torchao).
- `bitsandbytes-8bit`, `bitsandbytes-4bit` (NF4): bitsandbytes, on CUDA GPUs, where it is installed.

A checkpoint saved quantized (a `quantization_config` in its config.json) needs no option: it loads as saved, and
quantizing it again is refused. A library that is missing, or a device it cannot run on, is one line naming the fix.
"""

import importlib.util

import torch

QUANTIZATIONS = ("torchao-int8", "torchao-int4", "bitsandbytes-8bit", "bitsandbytes-4bit")


def quantization_config(
    choice: str | None, device: torch.device | str, path: str | None = None, dtype: torch.dtype = torch.bfloat16
):
    """The transformers quantization config for `--quantization choice` on `device`, for the checkpoint at `path`
    loaded in `dtype` (None: nothing to quantize). Raises ValueError where it cannot be done here."""
    if choice is None:
        return None
    if choice not in QUANTIZATIONS:
        raise ValueError(f"--quantization {choice} is not one of {', '.join(QUANTIZATIONS)}.")
    device = torch.device(device)
    saved = saved_quantization(path)
    if saved is not None:
        raise ValueError(
            f"--quantization {choice}: {path} is already quantized ({saved}) and loads as saved; leave out "
            "--quantization."
        )
    library = choice.split("-")[0]
    if importlib.util.find_spec(library) is None:
        extra = " (or wedlm-hf[quantization])" if library == "torchao" else ""
        raise ValueError(f"--quantization {choice} needs {library}: pip install {library}{extra}.")
    if choice != "torchao-int8" and device.type != "cuda":
        raise ValueError(
            f"--quantization {choice} runs on CUDA GPUs, not on {device.type}: use torchao-int8 there, or serve on a "
            "GPU."
        )
    if choice == "torchao-int8" and dtype == torch.float64:  # torchao's int8 weights have no float64 kernels
        raise ValueError(
            "--quantization torchao-int8 quantizes float32, bfloat16 or float16 weights, not float64: give --dtype "
            "float32 (or bfloat16, float16)."
        )
    if choice == "torchao-int4" and dtype != torch.bfloat16:
        raise ValueError(f"--quantization torchao-int4 computes in bfloat16, not {dtype}: add --dtype bfloat16.")
    if library == "torchao":
        from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig
        from transformers import TorchAoConfig

        return TorchAoConfig(Int8WeightOnlyConfig() if choice == "torchao-int8" else Int4WeightOnlyConfig())
    from transformers import BitsAndBytesConfig

    if choice == "bitsandbytes-8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype)


def saved_quantization(path: str | None) -> str | None:
    """How the checkpoint at `path` was saved quantized (its `quant_method`), or None."""
    if path is None:
        return None
    from transformers import AutoConfig

    return quantization_name(AutoConfig.from_pretrained(path))


def quantization_name(config) -> str | None:
    """The `quant_method` of a model config's `quantization_config` (a dict or a config object), or None."""
    quantization = getattr(config, "quantization_config", None)
    if quantization is None:
        return None
    method = quantization.get("quant_method") if isinstance(quantization, dict) else quantization.quant_method
    return str(getattr(method, "value", method))
