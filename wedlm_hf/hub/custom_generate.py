"""A Hub `custom_generate` repository for WeDLM decoding, for checkpoints that ship their own model code.

`model.generate(custom_generate=DIR_OR_REPO, trust_remote_code=True, mask_token_id=..., wedlm_window_size=...)`
then runs this project's streaming decoder on any causal LM that takes `position_ids` and a `DynamicCache`
(the authors' released classes, a stock Qwen3 fine-tuned as WeDLM, ...). Do not put this folder inside a model
repo whose own code overrides `generate()`: transformers would replace that `generate` on trusted load.
"""

import shutil
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

from .export import decoding_code_files

ENTRY = '''"""WeDLM streaming parallel decoding as a `custom_generate` method (written by wedlm-hf)."""

from .generation_wedlm import generate_wedlm


def generate(model, *args, **kwargs):
    """`model.generate(custom_generate=..., trust_remote_code=True, ...)` with `generate`'s arguments plus
    mask_token_id and the wedlm_* options (window size, threshold, penalty, lossless, context drafts)."""
    return generate_wedlm(model, *args, **kwargs)
'''

README = """
# WeDLM decoding (`custom_generate`)

Streaming parallel decoding of [WeDLM](https://arxiv.org/abs/2512.22737) for any transformers causal LM that takes
`position_ids` and a `DynamicCache`, packaged by wedlm-hf.

```python
out = model.generate(
    input_ids, custom_generate="{repo}", trust_remote_code=True,
    mask_token_id=151665, wedlm_window_size=16, wedlm_entropy_threshold=0.4, wedlm_pos_penalty_factor=0.02,
    max_new_tokens=256, return_dict_in_generate=True,
)
print(out.wedlm_stats)
```

Arguments: those of `generate` (sampling with `do_sample`, `temperature`, `top_k`, `top_p`; stops with
`eos_token_id`, `max_new_tokens`, `stop_strings` + `tokenizer`, `stopping_criteria`; `streamer`), plus
`mask_token_id` (else `config.mask_token_id`, the generation config, or the tokenizer's mask token) and the
`wedlm_*` parameters (`wedlm_window_size`, `wedlm_entropy_threshold`, `wedlm_pos_penalty_factor`, `wedlm_lossless`,
`wedlm_context_drafts`, `wedlm_context_ngram`). Options it cannot honour (beam search, repetition penalty, ...) raise
an error.
"""


def export_custom_generate(destination: str, repo_id: str = "wedlm-hf/wedlm-decoding") -> Path:
    dst = Path(destination)
    code = dst / "custom_generate"
    code.mkdir(parents=True, exist_ok=True)
    for path in decoding_code_files():
        shutil.copyfile(path, code / path.name)
    (code / "generate.py").write_text(ENTRY)
    data = ModelCardData(library_name="transformers", tags=["custom_generate", "wedlm", "diffusion"])
    ModelCard(f"---\n{data.to_yaml()}\n---\n" + README.format(repo=repo_id)).save(dst / "README.md")
    return dst


def custom_generate_command(args) -> None:
    """`wedlm-hf custom-generate DESTINATION`."""
    print(f"custom_generate repository written to {export_custom_generate(args.destination, args.repo_id)}")
