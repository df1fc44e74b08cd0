"""The small WeDLM checkpoint shipped inside the package: where it lives and how a training run becomes it."""

import json
import shutil
from pathlib import Path

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "default_model"
SHIPPED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "training_info.json",
)
MAX_BYTES = 25 * 1024 * 1024


def default_model_path() -> str:
    """The folder of the shipped checkpoint (weights, config, tokenizer, training and evaluation records)."""
    if not (DEFAULT_MODEL_DIR / "config.json").exists():
        raise FileNotFoundError(
            f"No shipped checkpoint at {DEFAULT_MODEL_DIR}: rebuild it with examples/train_default_model.sh "
            "or pass --model PATH."
        )
    return str(DEFAULT_MODEL_DIR)


def ship_default_model(source: str) -> Path:
    """Copies a trained checkpoint into the package: weights, configs, tokenizer and training record only.

    The package's own classes load it, so the remote-code files and `auto_map` of the training output are left out
    (`wedlm-hf export` adds them back for the Hub).
    """
    src = Path(source)
    weights = src / "model.safetensors"
    if not weights.exists():
        raise FileNotFoundError(f"{src} has no model.safetensors: pass the `final` folder of a `wedlm-hf train` run.")
    if weights.stat().st_size > MAX_BYTES:
        raise ValueError(
            f"{weights} is {weights.stat().st_size / 2**20:.1f} MiB; the shipped model must stay under 25 MiB."
        )
    DEFAULT_MODEL_DIR.mkdir(exist_ok=True)
    for name in SHIPPED_FILES:
        if (src / name).exists():
            shutil.copyfile(src / name, DEFAULT_MODEL_DIR / name)
    config = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
    config.pop("auto_map", None)
    (DEFAULT_MODEL_DIR / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return DEFAULT_MODEL_DIR


def ship_default_command(args) -> None:
    """`wedlm-hf ship-default SOURCE`."""
    print(f"shipped checkpoint updated: {ship_default_model(args.source)}")
