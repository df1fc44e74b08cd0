"""The checkpoint shipped in the package: loads offline, decodes the README prompt in parallel, card matches records."""

import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from wedlm_hf import WeDLMForCausalLM, default_model_path
from wedlm_hf.cli import main as cli
from wedlm_hf.data.shipped_model import DEFAULT_MODEL_DIR, MAX_BYTES, ship_default_model

ROOT = Path(__file__).resolve().parents[2]
CARD = ROOT / "model_cards" / "wedlm-tiny-stdlib" / "README.md"
RECIPE = ROOT / "examples" / "train_default_model.sh"


@pytest.fixture(scope="module")
def shipped():
    path = default_model_path()
    return WeDLMForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def test_weights_are_small_safetensors():
    weights = DEFAULT_MODEL_DIR / "model.safetensors"
    assert weights.exists() and weights.stat().st_size <= MAX_BYTES


def readme_prompt() -> str:
    """The prompt of the README's main-job command, so the test follows the README."""
    return re.search(r'wedlm-hf generate "([^"]+)"', (ROOT / "README.md").read_text()).group(1)


def test_readme_prompt_decodes_with_several_tokens_per_forward(shipped):
    model, tokenizer = shipped
    ids = tokenizer(readme_prompt(), return_tensors="pt").input_ids
    out = model.generate(ids, strategy="wedlm", max_new_tokens=64, return_dict_in_generate=True)
    stats = out.wedlm_stats[0]
    assert stats.tokens > 8 and stats.tokens_per_forward > 1.0
    assert tokenizer.mask_token_id == model.config.mask_token_id
    assert tokenizer.mask_token_id not in out.sequences[0].tolist()


def test_low_entropy_task_decodes_in_parallel(shipped):
    model, tokenizer = shipped
    ids = tokenizer("count from 40 by 1, 16 numbers:", return_tensors="pt").input_ids
    out = model.generate(ids, strategy="wedlm", max_new_tokens=64, return_dict_in_generate=True)
    assert out.wedlm_stats[0].tokens_per_forward > 2.0
    text = tokenizer.decode(out.sequences[0, ids.shape[1] :], skip_special_tokens=True)
    assert text.split()[:3] == ["40", "41", "42"]


def test_auto_classes_load_it_without_remote_code():
    model = AutoModelForCausalLM.from_pretrained(default_model_path())
    assert isinstance(model, WeDLMForCausalLM)


def test_card_is_rendered_from_the_records(tmp_path):
    """Every number in the card comes from training_info.json / eval_results.json: re-rendering reproduces it."""
    out = tmp_path / "README.md"
    summary = re.search(r'--summary "([^"]+)"', RECIPE.read_text()).group(1)
    cli(
        [
            "card",
            str(DEFAULT_MODEL_DIR),
            str(out),
            "--repo-id",
            "wedlm-hf/wedlm-tiny-stdlib",
            "--recipe",
            str(RECIPE),
            "--summary",
            summary,
        ]
    )
    assert out.read_text() == CARD.read_text()
    assert "Not measured yet" not in CARD.read_text() and "No training record" not in CARD.read_text()


def test_ship_default_refuses_oversized_or_missing_weights(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        ship_default_model(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"0" * 64)
    monkeypatch.setattr("wedlm_hf.data.shipped_model.MAX_BYTES", 32)
    with pytest.raises(ValueError, match="under 25 MiB"):
        ship_default_model(tmp_path)
