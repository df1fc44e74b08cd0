"""What loading a WeDLM checkpoint checks beyond transformers, so that a wrong checkpoint fails with the fix to apply.

A config whose attention switches contradict the weights would build a different attention (transformers drops the
extra tensors, or leaves the missing ones random, with only a load report); a truncated weight file would fail inside
safetensors without its name. A `generation_config.json` that is not JSON would be read as absent (transformers
catches the error and decodes with the defaults: `strategy` "ar", W 16), and one with a refused value would fail
without the file's name, so it is read here first. A `config.json` without the model's sizes would build the
model with Qwen3's defaults (4096 wide, 32 layers) and end in a long report of every mismatched weight. Pickle
weights (`pytorch_model.bin`) that `torch.load(weights_only=True)` refuses, or that are cut short, would fail with
torch's multi-line message and no file name.
"""

import json
import pickle
import re
from pathlib import Path

import torch
from transformers import GenerationConfig
from transformers.utils import GENERATION_CONFIG_NAME, cached_file

from .configuration_wedlm import check_sizes
from .decoding_config import WeDLMDecodingConfig
from .generation_wedlm import STRATEGIES

# What `cached_file` takes from from_pretrained's arguments, to find the same files transformers reads.
_HUB_KWARGS = ("cache_dir", "force_download", "proxies", "token", "revision", "local_files_only", "subfolder")
# What torch.load raises for a pickle it refuses or cannot read (a cut-short zip: OSError through transformers).
_TORCH_LOAD_ERRORS = (pickle.UnpicklingError, RuntimeError, EOFError, OSError)
_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


def check_checkpoint_files(pretrained_model_name_or_path, kwargs: dict, can_generate: bool) -> None:
    """Before transformers loads: the checkpoint files it would read, where it would replace or misreport them."""
    if pretrained_model_name_or_path is None or kwargs.get("gguf_file"):
        return
    if kwargs.get("config") is None:  # transformers reads config.json (the Auto classes check it as they read it)
        path = checkpoint_file(pretrained_model_name_or_path, "config.json", kwargs)
        if path is not None:
            check_config_sizes(path)
    if can_generate and kwargs.get("generation_config") is None:  # else transformers does not read the file
        path = checkpoint_file(pretrained_model_name_or_path, GENERATION_CONFIG_NAME, kwargs)
        if path is not None:
            check_generation_config(path)


def checkpoint_file(pretrained_model_name_or_path, filename: str, kwargs: dict) -> Path | None:
    """The checkpoint's `filename` as a local file (in the folder, or fetched into the Hub cache as transformers
    would), or None when there is none or it cannot be fetched (transformers then reports that itself)."""
    try:
        found = cached_file(
            pretrained_model_name_or_path,
            filename,
            **{key: kwargs[key] for key in _HUB_KWARGS if key in kwargs},
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
        )
    except OSError:
        return None
    return Path(found) if found else None


def check_config_sizes(path: Path) -> None:
    """A ValueError naming `path` and the size fields it lacks (a config.json that is not a JSON object is left to
    transformers, whose error names the file)."""
    try:
        values = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return
    if isinstance(values, dict):
        check_sizes(values, path)


def check_generation_config(path: Path) -> None:
    """A ValueError naming `path` and the problem when it is not JSON, not an object, or holds a value that
    GenerationConfig or WeDLM decoding refuses."""
    fix = "fix it, or delete the file to decode with the default settings"
    try:
        values = json.loads(path.read_bytes().decode("utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{path} is not valid JSON ({error.msg} at line {error.lineno}, column {error.colno}): {fix}."
        ) from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not UTF-8 text ({error.reason} at byte {error.start}): {fix}.") from None
    if not isinstance(values, dict):
        kind = _JSON_KINDS.get(type(values), "null")
        raise ValueError(f"{path} holds {kind}, not a JSON object of generation settings: {fix}.")
    try:
        GenerationConfig.from_dict(dict(values))  # transformers' own checks, as loading would run them
        strategy = values.get("strategy")
        if strategy is not None and strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}.")
        WeDLMDecodingConfig.from_values({k: v for k, v in values.items() if k in WeDLMDecodingConfig.keys()})
    except (ValueError, TypeError, AttributeError) as error:
        raise ValueError(
            f"{path} has a setting that generation refuses: {error} Correct it in that file, or remove the entry to "
            "use the default."
        ) from error


_QK_NORM = re.compile(r"(^|\.)self_attn\.[qk]_norm\.weight$")
_QKV_BIAS = re.compile(r"(^|\.)self_attn\.[qkv]_proj\.bias$")
_ATTENTION_WEIGHT = re.compile(r"(^|\.)self_attn\.[qkvo]_proj\.weight$")


def check_attention_weights(config, info: dict, source) -> None:
    """Weights the config's attention switches leave out (or ask for) mean the config describes another model:
    with `qk_norm` or `attention_bias` wrong, the norms or biases would be silently dropped (or left random)."""
    missing, unexpected = set(info["missing_keys"]), set(info["unexpected_keys"])
    # Keys missing because no attention weight loaded at all (another model's checkpoint) say nothing about switches.
    attention_loaded = not any(_ATTENTION_WEIGHT.search(key) for key in missing)
    problems = []
    for pattern, what, field in (
        (_QK_NORM, "q_norm/k_norm weights", "qk_norm"),
        (_QKV_BIAS, "q/k/v biases", "attention_bias"),
    ):
        if any(pattern.search(key) for key in unexpected):
            problems.append(f'the checkpoint has {what} but config.{field} is false: set "{field}": true')
        elif attention_loaded and any(pattern.search(key) for key in missing):
            problems.append(f'the checkpoint has no {what} but config.{field} is true: set "{field}": false')
    if problems:
        raise ValueError(
            f"The weights of {source or 'the checkpoint'} do not match its WeDLM config: {'; '.join(problems)} in "
            "config.json (or in the config passed to from_pretrained)."
        )


def unreadable_weights(error: Exception, pretrained_model_name_or_path, kwargs: dict) -> OSError | None:
    """The error to raise instead of `error` when a weight file could not be read (naming the file), else None."""
    if type(error).__module__.split(".")[0] != "safetensors":
        if isinstance(error, _TORCH_LOAD_ERRORS):
            return unreadable_pickle(checkpoint_folder(pretrained_model_name_or_path, kwargs))
        return None
    damaged = damaged_safetensors(checkpoint_folder(pretrained_model_name_or_path, kwargs))
    if not damaged:
        return OSError(f"Could not read the safetensors weights of {pretrained_model_name_or_path}: {error}")
    files = ", ".join(map(str, damaged))
    return OSError(
        f"{files} {'is' if len(damaged) == 1 else 'are'} damaged or incomplete (cut short or corrupted: "
        f"{error}): download the checkpoint again, or re-save the model with save_pretrained."
    )


def unreadable_pickle(folder: Path | None) -> OSError | None:
    """An OSError naming the first pickle weight file in `folder` that torch.load(weights_only=True) cannot read, and
    the fix: refused (it holds objects other than tensors) or damaged. None when every one reads."""
    for path in sorted(folder.glob("pytorch_model*.bin")) if folder is not None else []:
        try:
            torch.load(path, map_location="meta", weights_only=True)
        except _TORCH_LOAD_ERRORS as error:
            text = " ".join(str(error).split())
            found = re.search(r"WeightsUnpickler error: (.+?)(\. |\.?$)", text)
            reason = found.group(1) if found else text or type(error).__name__
            if "Unsupported" in reason:
                named = re.search(r"GLOBAL (\S+)", reason)  # transformers 5.23 ignores weights_only=False here
                allowed = f"[{named.group(1)}]" if named else "[the classes it holds]"
                return OSError(
                    f"{path} is pickle weights that torch.load(weights_only=True) refuses ({reason}): convert them to "
                    "safetensors. If you trust the file's source, load the checkpoint once inside `with "
                    f"torch.serialization.safe_globals({allowed}):` and save it with save_pretrained (which writes "
                    "model.safetensors); otherwise get the checkpoint's safetensors weights."
                )
            return OSError(
                f"{path} is damaged or incomplete ({reason}): download the checkpoint again, or re-save the model "
                "with save_pretrained."
            )
    return None


def checkpoint_folder(pretrained_model_name_or_path, kwargs: dict) -> Path | None:
    """The local folder holding the checkpoint's files: the path itself, or the Hub cache snapshot of a repo id."""
    if pretrained_model_name_or_path is None:
        return None
    subfolder = kwargs.get("subfolder") or ""
    folder = Path(pretrained_model_name_or_path, subfolder)
    if folder.is_dir():
        return folder
    try:
        config = cached_file(
            pretrained_model_name_or_path,
            "config.json",
            subfolder=subfolder,
            cache_dir=kwargs.get("cache_dir"),
            revision=kwargs.get("revision"),
            local_files_only=True,
        )
    except OSError:
        return None
    return Path(config).parent if config else None


def damaged_safetensors(folder: Path | None) -> list[Path]:
    """The .safetensors files in `folder` whose header is unreadable or whose size differs from what it declares."""
    damaged = []
    for path in sorted(folder.glob("*.safetensors")) if folder is not None else []:
        try:
            size = path.stat().st_size
            with open(path, "rb") as file:
                header_size = int.from_bytes(file.read(8), "little")
                header = json.loads(file.read(header_size)) if 8 + header_size <= size else None
            ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
            intact = 8 + header_size + max(ends, default=0) == size
        except (OSError, ValueError, AttributeError, KeyError, IndexError, TypeError):
            intact = False
        if not intact:
            damaged.append(path)
    return damaged
