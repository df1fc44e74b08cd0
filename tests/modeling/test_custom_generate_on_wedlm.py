"""`generate(custom_generate=...)` on a WeDLM model goes to transformers, which runs that generate function.

WeDLM's own `generate` chooses between "ar" and "wedlm"; a `custom_generate` call is neither, so it passes through
with every argument, whatever the strategy in the model's generation config.
"""

import torch
from conftest import MASK_ID, build_model, prompts

from wedlm_hf import generate_wedlm
from wedlm_hf.hub.custom_generate import export_custom_generate

RECORDER = '''
def generate(model, *args, **kwargs):
    """Returns what it was given, so the test can see what transformers passed through."""
    return {"model": model, "args": args, "kwargs": kwargs}
'''


def test_wedlm_decoding_repository_runs_on_a_wedlm_model(tmp_path):
    folder = export_custom_generate(tmp_path / "wedlm-decoding")
    model = build_model(dtype=torch.float32)
    ids, mask = prompts(2)
    kwargs = dict(attention_mask=mask, max_new_tokens=10, eos_token_id=None, wedlm_window_size=4)
    out = model.generate(ids, custom_generate=str(folder), trust_remote_code=True, **kwargs)
    assert torch.equal(out, generate_wedlm(model, ids, mask_token_id=MASK_ID, **kwargs))


def test_custom_generate_receives_every_argument(tmp_path):
    (tmp_path / "custom_generate").mkdir()
    (tmp_path / "custom_generate" / "generate.py").write_text(RECORDER)
    model = build_model(dtype=torch.float32)
    ids, _ = prompts(1)
    for default in ("ar", "wedlm"):
        model.generation_config.strategy = default
        got = model.generate(
            ids, custom_generate=str(tmp_path), trust_remote_code=True, wedlm_window_size=16, anything="kept"
        )
        assert got["model"] is model and torch.equal(got["kwargs"]["inputs"], ids)
        assert got["kwargs"]["wedlm_window_size"] == 16 and got["kwargs"]["anything"] == "kept"
        assert "strategy" not in got["kwargs"]
    got = model.generate(ids, custom_generate=str(tmp_path), trust_remote_code=True, strategy="wedlm")
    assert got["kwargs"]["strategy"] == "wedlm"  # an explicit strategy is the custom function's to read
