"""Data wing: what the shipped model is built from and where it lives.

- `stdlib_corpus`: Python's standard library source, split into train / eval files.
- `synthetic_tasks`: the low-entropy task families (counting, copying, arithmetic, lists).
- `offline_mix`: the training mix of both, and the tokenizer corpus.
- `tokenizer_training`: `wedlm-hf train-tokenizer`, the byte-level BPE tokenizer.
- `shipped_model`: `default_model_path()` and `wedlm-hf ship-default` (a Hub-style folder, remote code linked in).
- `checkpoint_dtype`: the dtype a checkpoint loads in (`--dtype`, `auto` as vLLM's).
- `load_quantization`: weights quantized at load (`--quantization`).
- `portable_paths`: how run records (`training_info.json`, `eval_results.json`) name files, machine-independently.

Public to other wings: `default_model_path`, `DTYPES` and `load_dtype` (every command that loads a checkpoint),
`QUANTIZATIONS`, `quantization_config` and `quantization_name` (the server),
`offline_mix`, `task_items`, `FAMILIES`, `TRAIN_TASK_SEED`, `EVAL_TASK_SEED`, `stdlib_texts` (training reads the
mix, evaluation the held-out items), `portable_path` (training and evaluation records). Imports the Hub wing's
`hub_config` and `check_safetensors` (ship-default).
"""

from .checkpoint_dtype import DTYPES, load_dtype
from .load_quantization import QUANTIZATIONS, quantization_config, quantization_name
from .offline_mix import EVAL_TASK_SEED, TRAIN_TASK_SEED, offline_mix
from .portable_paths import portable_path
from .shipped_model import default_model_path
from .stdlib_corpus import stdlib_texts
from .synthetic_tasks import FAMILIES, task_items

__all__ = [
    "DTYPES",
    "EVAL_TASK_SEED",
    "FAMILIES",
    "QUANTIZATIONS",
    "TRAIN_TASK_SEED",
    "default_model_path",
    "load_dtype",
    "offline_mix",
    "portable_path",
    "quantization_config",
    "quantization_name",
    "stdlib_texts",
    "task_items",
]
