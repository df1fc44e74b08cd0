"""Hub-ready checkpoint folders: weights, config with `auto_map`, our remote code, generation defaults, tokenizer, card.

`export_checkpoint` also re-exports a released-style WeDLM checkpoint (`model_type: "wedlm"`, the authors' remote
code, `mask_token_id: null`) with this project's code: the weight files are copied byte for byte, the config gains
the mask id and our `auto_map`, and the authors' code files are left behind.

An export appears whole or not at all, and a destination that already holds files is refused unless
`overwrite=True` (`--overwrite`), which removes the earlier checkpoint's weights (`checkpoint_destination`).
"""

import json
import shutil
from pathlib import Path

from transformers.dynamic_module_utils import get_relative_import_files

from .. import modeling
from ..modeling import STRATEGIES, WEDLM_GENERATION_DEFAULTS, WeDLMConfig
from .checkpoint_destination import staged_checkpoint
from .model_card import load_json, render_model_card
from .safetensors_check import check_safetensors

RELEASED_QWEN_MASK_TOKEN_ID = 151665  # what the authors' engine and training code use when the config gives none
# AutoModel answers with the causal LM too, so `AutoModel.from_pretrained(..., trust_remote_code=True)` can
# `generate(strategy="wedlm")`; the base model stays reachable as its `.model`.
AUTO_MAP = {
    "AutoConfig": "configuration_wedlm.WeDLMConfig",
    "AutoModel": "modeling_wedlm.WeDLMForCausalLM",
    "AutoModelForCausalLM": "modeling_wedlm.WeDLMForCausalLM",
}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "tokenizer.model",
)
MODELING_DIR = Path(modeling.__file__).parent
RECORDS = ("training_info.json", "eval_results.json")  # what model cards quote


def remote_code_files() -> list[Path]:
    """The files that travel as remote code: every module of `wedlm_hf/modeling/` (the package's `__init__.py`
    aside). That folder holds exactly the remote code, so the folder is the list."""
    return sorted(p for p in MODELING_DIR.glob("*.py") if p.name != "__init__.py")


def decoding_code_files() -> list[Path]:
    """The decoding strategy alone (what a `custom_generate` folder needs): the generate front and its imports."""
    front = MODELING_DIR / "generation_wedlm.py"
    return sorted({front} | {Path(f) for f in get_relative_import_files(str(front))})


def weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (folder / s).exists()]
        if missing:
            raise FileNotFoundError(
                f"{folder} is missing weight shards {missing} named in model.safetensors.index.json."
            )
        return [index] + [check_safetensors(folder / s) for s in shards]
    if (folder / "model.safetensors").exists():
        return [check_safetensors(folder / "model.safetensors")]
    raise FileNotFoundError(
        f"{folder} has no safetensors weights (model.safetensors or model.safetensors.index.json): load the model and "
        "save it with save_pretrained(..., safe_serialization=True) first."
    )


def resolve_mask_token_id(config: dict, explicit: int | None, source: Path) -> int:
    """Argument, then config, then the tokenizer's mask token, then the released Qwen-based default."""
    if explicit is not None:
        return int(explicit)
    if config.get("mask_token_id") is not None:
        return int(config["mask_token_id"])
    tokenizer_config = load_json(source / "tokenizer_config.json") or {}
    mask = tokenizer_config.get("mask_token")
    if isinstance(mask, dict):
        mask = mask.get("content")
    if mask and (source / "tokenizer.json").exists():
        from transformers import AutoTokenizer

        mask_id = AutoTokenizer.from_pretrained(source).convert_tokens_to_ids(mask)
        if mask_id is not None:
            return int(mask_id)
    if config.get("vocab_size", 0) > RELEASED_QWEN_MASK_TOKEN_ID:
        return RELEASED_QWEN_MASK_TOKEN_ID
    raise ValueError(
        f"{source}/config.json gives no mask_token_id and none can be inferred (no tokenizer mask token; the "
        "vocabulary "
        f"is too small for the released default {RELEASED_QWEN_MASK_TOKEN_ID}): pass --mask-token-id N."
    )


def hub_config(config: dict) -> dict:
    """`config` as a Hub checkpoint carries it: our `auto_map`, and `use_cache` on. A checkpoint saved by the stock
    Trainer says `use_cache: false` (Trainer's training default); a model published for decoding keeps its KV cache
    on, and exporters such as `TorchExportableModuleForDecoderOnlyLM` refuse one without."""
    return {**config, "auto_map": dict(AUTO_MAP), "use_cache": True}


def generation_defaults(source: Path) -> dict:
    """The source's generation config with `strategy` checked and every missing `wedlm_*` default added."""
    values = load_json(source / "generation_config.json") or {}
    strategy = values.get("strategy")
    if strategy is not None and strategy not in STRATEGIES:
        raise ValueError(
            f'{source}/generation_config.json has an unknown strategy {strategy!r}: set "strategy" to one of '
            f"{', '.join(STRATEGIES)} (or remove it)."
        )
    for key, value in WEDLM_GENERATION_DEFAULTS.items():
        values.setdefault(key, value)
    values["_from_model_config"] = False  # otherwise transformers drops the custom keys on reload
    return values


def write_card(
    model_dir,
    output,
    repo_id: str,
    summary: str,
    recipe: str | None = None,
    base_model: str | None = None,
    tags: list[str] | None = None,
) -> Path:
    """Renders the card of a checkpoint folder from its generation config and records into `output`."""
    src, out = Path(model_dir), Path(output)
    card = render_model_card(
        model_name=repo_id.split("/")[-1],
        summary=summary,
        repo_id=repo_id,
        generation_defaults=load_json(src / "generation_config.json"),
        eval_results=load_json(src / "eval_results.json"),
        training_info=load_json(src / "training_info.json"),
        recipe=recipe,
        base_model=base_model,
        extra_tags=tags,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    card.save(out)
    return out


def export_checkpoint(
    source: str,
    destination: str,
    mask_token_id: int | None = None,
    repo_id: str | None = None,
    base_model: str | None = None,
    summary: str | None = None,
    recipe: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Writes a Hub-ready copy of a WeDLM checkpoint: weights, this package's remote code, generation config, card.

    `source`: a WeDLM checkpoint folder with safetensors weights, also a released one (`mask_token_id: null`, the
    authors' remote code). `destination`: the folder to write, whole or not at all; one that already holds files
    is refused unless `overwrite=True`, which removes the earlier checkpoint's weights. `mask_token_id`: used
    when the config gives none (else the tokenizer's mask token, else 151665 for the released Qwen-based models).
    `repo_id`, `base_model`, `summary`, `recipe`: what the model card shows. Returns the destination.
    `wedlm-hf export` runs it; docs/hub.md describes the folder.
    """
    src, dst = Path(source), Path(destination)
    if not (src / "config.json").exists():
        raise FileNotFoundError(f"{src} has no config.json: point `wedlm-hf export` at a checkpoint folder.")
    config = json.loads((src / "config.json").read_text())
    if config.get("model_type") != "wedlm":
        raise ValueError(
            f"{src} is a {config.get('model_type')!r} checkpoint, not a WeDLM one: turn AR checkpoints into WeDLM "
            "checkpoints with `wedlm-hf convert` (and train them) first."
        )
    weights = weight_files(src)
    config["mask_token_id"] = resolve_mask_token_id(config, mask_token_id, src)
    config["architectures"] = ["WeDLMForCausalLM"]
    config = hub_config(config)
    WeDLMConfig.from_dict(config)  # refuse configs our classes cannot load before writing anything
    generation = generation_defaults(src)

    with staged_checkpoint(src, dst, "export", overwrite=overwrite) as staging:
        for path in weights:
            shutil.copyfile(path, staging / path.name)
        for path in remote_code_files():
            shutil.copyfile(path, staging / path.name)
        for name in TOKENIZER_FILES + RECORDS:
            if (src / name).exists():
                shutil.copyfile(src / name, staging / name)
        (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        (staging / "generation_config.json").write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n")
        write_card(
            staging,
            staging / "README.md",
            repo_id=repo_id or dst.name,
            base_model=base_model,
            recipe=recipe,
            summary=summary or "A WeDLM checkpoint packaged by wedlm-hf with its remote code.",
        )
    return dst


def export_command(args) -> None:
    """`wedlm-hf export SOURCE DESTINATION`."""
    recipe = Path(args.recipe).read_text() if args.recipe else None
    out = export_checkpoint(
        args.source,
        args.destination,
        mask_token_id=args.mask_token_id,
        repo_id=args.repo_id,
        base_model=args.base_model,
        summary=args.summary,
        recipe=recipe,
        overwrite=args.overwrite,
    )
    print(f"Hub-ready checkpoint written to {out}")


def card_command(args) -> None:
    """`wedlm-hf card MODEL OUTPUT`."""
    recipe = Path(args.recipe).read_text() if args.recipe else None
    out = write_card(
        args.model, args.output, repo_id=args.repo_id, summary=args.summary, recipe=recipe, base_model=args.base_model
    )
    print(f"model card written to {out}")
