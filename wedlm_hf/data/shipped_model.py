"""The small WeDLM checkpoint shipped inside the package: where it lives and how a training run becomes it.

The folder is a complete Hub-style checkpoint: its `config.json` has `auto_map` and the remote-code files sit beside
the weights, so `AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)` loads it in a process that never
imported wedlm_hf (lm-eval, the `transformers` CLI). Those code files are relative symlinks into `wedlm_hf/modeling/`
(one source of truth; building a wheel copies their targets in). With wedlm_hf imported, the Auto classes use the
package's own registered classes, with or without `trust_remote_code`.
"""

import json
import os
import shutil
from pathlib import Path

from ..hub import check_safetensors, hub_config
from ..modeling import WeDLMConfig

PACKAGE_DIR = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_DIR = PACKAGE_DIR / "default_model"
MODELING_DIR = PACKAGE_DIR / "modeling"
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
    """The folder of the shipped checkpoint (weights, config, remote code, tokenizer, training and evaluation
    records)."""
    if not (DEFAULT_MODEL_DIR / "config.json").exists():
        raise FileNotFoundError(
            f"No shipped checkpoint at {DEFAULT_MODEL_DIR}: rebuild it with examples/train_default_model.sh "
            "or pass --model PATH."
        )
    return str(DEFAULT_MODEL_DIR)


def link_remote_code(folder: Path | None = None) -> list[Path]:
    """Makes every core module a relative symlink in `folder` (default: the shipped folder), dropping links to
    modules that are gone. A new module in `wedlm_hf/modeling/` needs its link: run this once and commit it."""
    folder = DEFAULT_MODEL_DIR if folder is None else folder
    for stale in folder.glob("*.py"):
        if stale.is_symlink() and not stale.exists():
            stale.unlink()
    links = []
    for module in sorted(p for p in MODELING_DIR.glob("*.py") if p.name != "__init__.py"):
        link = folder / module.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(module, folder))
        links.append(link)
    return links


def ship_default_model(source: str) -> Path:
    """Copies a trained checkpoint into the package: weights, configs, tokenizer and training record; then gives the
    config the Hub export's `auto_map` and `use_cache` and links the remote code, so the folder loads as a Hub
    checkpoint. The previous `eval_results.json` measured the previous weights, so it goes (`wedlm-hf evaluate`
    writes it anew)."""
    src = Path(source)
    weights = src / "model.safetensors"
    if not weights.exists():
        raise FileNotFoundError(f"{src} has no model.safetensors: pass the `final` folder of a `wedlm-hf train` run.")
    if weights.stat().st_size > MAX_BYTES:
        raise ValueError(
            f"{weights} is {weights.stat().st_size / 2**20:.1f} MiB; the shipped model must stay under 25 MiB."
        )
    check_safetensors(weights)
    if not (src / "config.json").exists():
        raise FileNotFoundError(f"{src} has no config.json: pass the `final` folder of a `wedlm-hf train` run.")
    config = json.loads((src / "config.json").read_text())
    if config.get("model_type") != "wedlm":
        raise ValueError(
            f"{src} holds a {config.get('model_type')!r} model: ship a WeDLM checkpoint (`wedlm-hf train`)."
        )
    config = hub_config(config)
    WeDLMConfig.from_dict(config)  # refuse what the package cannot load before touching the shipped folder
    DEFAULT_MODEL_DIR.mkdir(exist_ok=True)
    for name in SHIPPED_FILES:
        if (src / name).exists():
            shutil.copyfile(src / name, DEFAULT_MODEL_DIR / name)
    (DEFAULT_MODEL_DIR / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (DEFAULT_MODEL_DIR / "eval_results.json").unlink(missing_ok=True)
    link_remote_code(DEFAULT_MODEL_DIR)
    return DEFAULT_MODEL_DIR


def ship_default_command(args) -> None:
    """`wedlm-hf ship-default SOURCE`."""
    print(f"shipped checkpoint updated: {ship_default_model(args.source)}")
