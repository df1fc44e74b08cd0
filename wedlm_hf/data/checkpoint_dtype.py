"""The dtype a checkpoint loads in: `--dtype` of `serve`, `generate`, `evaluate` and `bench`.

`auto` means what vLLM's `--dtype auto` means. On a GPU a model runs in half precision: the checkpoint's own
(`dtype` in its config.json, bfloat16 for the released WeDLM models), and a float32 checkpoint is halved to bfloat16
(float16 on a GPU without bfloat16). On a CPU it runs in float32, whose matrix products a CPU computes faster than
half-precision ones, and exactly as the shipped model was trained and measured.
"""

import torch

DTYPES = ("auto", "bfloat16", "float16", "float32", "float64")


def checkpoint_dtype(choice: str, device_type: str, saved: torch.dtype | None, bf16_ok: bool = True) -> torch.dtype:
    """The dtype for `--dtype choice` on a device of `device_type` ("cpu", "cuda", ...), for a checkpoint saved in
    `saved` (None: unknown); `bf16_ok`: whether that device computes in bfloat16."""
    if choice not in DTYPES:
        raise ValueError(f"--dtype {choice!r} is not one of {', '.join(DTYPES)}.")
    if choice != "auto":
        return getattr(torch, choice)
    if device_type == "cpu":
        return torch.float32
    if saved in (torch.bfloat16, torch.float16) and (saved != torch.bfloat16 or bf16_ok):
        return saved
    return torch.bfloat16 if bf16_ok else torch.float16


def load_dtype(choice: str, device: torch.device | str, path: str | None) -> torch.dtype:
    """`checkpoint_dtype` for the checkpoint at `path` (a folder or Hub id; None: a model built here) on `device`."""
    from transformers import AutoConfig

    device = torch.device(device)
    saved = None
    if choice == "auto" and device.type != "cpu" and path is not None:
        saved = getattr(AutoConfig.from_pretrained(path), "dtype", None)
        saved = getattr(torch, saved) if isinstance(saved, str) else saved
    bf16_ok = device.type != "cuda" or torch.cuda.is_bf16_supported()
    return checkpoint_dtype(choice, device.type, saved, bf16_ok)
