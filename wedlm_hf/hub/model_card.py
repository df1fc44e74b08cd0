"""Model cards rendered with `huggingface_hub.ModelCard` from `model_cards/template.md`.

Every number a card states comes from a file a command wrote: the evaluation JSON (`wedlm-hf evaluate`) and the
training record (`training_info.json` from `wedlm-hf train`). Without them the card says the numbers are missing.
"""

import json
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

from ..modeling import WEDLM_GENERATION_DEFAULTS as _DECODING_DEFAULTS

TEMPLATE = Path(__file__).resolve().parents[2] / "model_cards" / "template.md"
TAGS = ["wedlm", "diffusion", "custom_code", "text-generation"]


def template_path() -> Path:
    """The card template of the source checkout (the package is installed editable from it)."""
    if not TEMPLATE.exists():
        raise FileNotFoundError(
            f"Model card template not found at {TEMPLATE}: render cards from a source checkout of wedlm-hf "
            "(`pip install -e .`)."
        )
    return TEMPLATE


def stats_section(eval_results: dict | None) -> str:
    if not eval_results:
        return (
            "Not measured yet: run `wedlm-hf evaluate --model DIR --output DIR/eval_results.json` and render the "
            "card again."
        )
    s = eval_results["settings"]
    lines = [
        f"Measured by `wedlm-hf evaluate` (W={s['window_size']}, tau={s['entropy_threshold']}, "
        f"lambda={s['pos_penalty_factor']}; {s['threads']} CPU threads, torch {s['torch']}, transformers "
        f"{s['transformers']}) on held-out items never seen in training, each decoded by plain AR `generate()` and "
        "by WeDLM in the same process.",
        "",
        "| task | items | exact match AR | exact match WeDLM | tokens / forward | ceiling | tokens/s AR "
        "| tokens/s WeDLM | speed-up |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for family, r in eval_results["families"].items():
        lines.append(
            f"| {family} | {r['items']} | {r['ar_exact_match']:.1%} | {r['wedlm_exact_match']:.1%} | "
            f"{r['tokens_per_forward']:.2f} | {_ceiling(r)} | {r['ar_tokens_per_s']:.0f} | "
            f"{r['wedlm_tokens_per_s']:.0f} | {r['speedup']:.2f}x |"
        )
    c = eval_results.get("code")
    if c:
        lines += [
            "",
            f"Code continuation ({c['items']} held-out stdlib snippets): WeDLM output identical to AR greedy on "
            f"{c['identical_to_ar']:.1%} of snippets, token agreement {c['token_agreement_with_ar']:.1%}, "
            f"{c['tokens_per_forward']:.2f} tokens / forward (ceiling {_ceiling(c)}), {c['speedup']:.2f}x AR tokens/s.",
        ]
    lossless = [
        (name, r["lossless"])
        for name, r in [*eval_results["families"].items(), ("code continuation", c)]
        if r and r.get("lossless")
    ]
    if lossless:
        lines += [
            "",
            "Lossless mode (`wedlm_lossless=True`) on the same items: its output was checked identical to plain AR "
            "`generate()` on every item, so its exact match is AR's.",
            "",
            "| task | tokens / forward | drafts accepted | tokens/s | speed-up over AR |",
            "|---|---|---|---|---|",
        ]
        for name, r in lossless:
            rate = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.1%}"
            lines.append(
                f"| {name} | {r['tokens_per_forward']:.2f} | {rate} | {r['tokens_per_s']:.0f} | {r['speedup']:.2f}x |"
            )
    lines += [
        "",
        "The ceiling is the most tokens per forward WeDLM decoding can reach on the same outputs: a forward fills at "
        "most W masks, so n tokens take at least ceil(n / W) forwards.",
    ]
    return "\n".join(lines)


def _ceiling(r: dict) -> str:
    """Results written before the ceiling was measured render a dash."""
    ceiling = r.get("tokens_per_forward_ceiling")
    return "-" if ceiling is None else f"{ceiling:.2f}"


def training_stages(training_info: dict) -> list[dict]:
    """The records of every training stage, first stage first (a stage started from a checkpoint links its record)."""
    stages = []
    while training_info:
        stages.insert(0, training_info)
        training_info = training_info.get("continued_from")
    return stages


def training_section(training_info: dict | None, recipe: str | None) -> str:
    if not training_info:
        return "No training record (`training_info.json`) was found for this checkpoint."
    stages = training_stages(training_info)
    lines = []
    for number, stage in enumerate(stages, 1):
        a = stage["arguments"]
        start = f"from scratch ({a['config']})" if a.get("config") else f"from {a['model']}"
        lines.append(
            f"{number}. `wedlm-hf train` {start} on {', '.join(a['data'])}: {a['max_steps']} steps of batch "
            f"{a['batch_size']} x {a['seq_len']} tokens, dual-stream block size {a['block_size']}, lr "
            f"{a['learning_rate']} cosine (warmup {a['warmup_ratio']}), seed {a['seed']}, {stage['processes']} "
            f"process(es), wall time {stage['train_runtime_s'] / 60:.1f} min"
            + (" (resumed run: this part only)" if stage.get("resumed") else "")
            + "."
        )
    last = {k: round(v, 3) if isinstance(v, float) else v for k, v in (training_info.get("last_logged") or {}).items()}
    total = sum(stage["train_runtime_s"] for stage in stages) / 60
    lines += [
        "",
        f"{training_info['parameters'] / 1e6:.1f}M parameters; total training wall time {total:.1f} min "
        f"(torch {training_info['torch']}, transformers {training_info['transformers']}). Last logged loss "
        f"{last.get('loss')} (next-token {last.get('ar_loss')}, masked {last.get('mlm_loss')}).",
    ]
    if recipe:
        lines += ["", "Exact commands (`examples/train_default_model.sh`):", "", "```bash", recipe.strip(), "```"]
    return "\n".join(lines)


def render_model_card(
    model_name: str,
    summary: str,
    repo_id: str,
    generation_defaults: dict | None = None,
    eval_results: dict | None = None,
    training_info: dict | None = None,
    recipe: str | None = None,
    license: str = "apache-2.0",
    base_model: str | None = None,
    example_prompt: str = "def fibonacci(n):",
    extra_tags: list[str] | None = None,
) -> ModelCard:
    data = ModelCardData(
        library_name="transformers",
        pipeline_tag="text-generation",
        license=license,
        base_model=base_model,
        tags=TAGS + [t for t in extra_tags or [] if t not in TAGS],
    )
    gc = {**_DECODING_DEFAULTS, **(generation_defaults or {})}
    return ModelCard.from_template(
        data,
        template_path=str(template_path()),
        model_name=model_name,
        summary=summary,
        repo_id=repo_id,
        example_prompt=example_prompt,
        window_size=gc["wedlm_window_size"],
        entropy_threshold=gc["wedlm_entropy_threshold"],
        pos_penalty_factor=gc["wedlm_pos_penalty_factor"],
        stats_section=stats_section(eval_results),
        training_section=training_section(training_info, recipe),
    )


def load_json(path) -> dict | None:
    path = Path(path) if path else None
    return json.loads(path.read_text()) if path and path.exists() else None
