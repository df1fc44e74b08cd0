"""The checkpoint shipped in the package: loads offline (also as remote code, without wedlm_hf), decodes the README
prompt in parallel, its card matches its records and those records name no path of the machine that made them."""

import json
import os
import re
from pathlib import Path

import pytest
import torch
from conftest import absolute_paths, build_model, run_without_wedlm_hf
from transformers import AutoModelForCausalLM, AutoTokenizer

from wedlm_hf import WeDLMForCausalLM, default_model_path
from wedlm_hf.cli import main as cli
from wedlm_hf.data.shipped_model import DEFAULT_MODEL_DIR, MAX_BYTES, MODELING_DIR, ship_default_model
from wedlm_hf.hub.export import AUTO_MAP, remote_code_files

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


def test_shipped_folder_is_a_hub_checkpoint_whose_code_is_the_core():
    """Remote code beside the weights, each file a relative link into wedlm_hf/modeling (one source of truth)."""
    code = sorted(DEFAULT_MODEL_DIR.glob("*.py"))
    assert {p.name for p in code} == {p.name for p in remote_code_files()}, (
        "wedlm_hf/default_model must link every core module: run `python -c 'from wedlm_hf.data.shipped_model "
        "import link_remote_code; link_remote_code()'` (and remove links to modules that are gone)"
    )
    for link in code:
        assert link.is_symlink() and not os.path.isabs(os.readlink(link))
        assert link.resolve() == (MODELING_DIR / link.name).resolve()
    assert json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())["auto_map"] == AUTO_MAP


# Loads the shipped folder as remote code, as lm-eval or the `transformers` CLI do without this package.
REMOTE = """
    import json, sys

    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True, dtype=torch.float32).eval()
    ids = torch.tensor([json.loads(sys.argv[2])])
    with torch.no_grad():
        logits = model(ids).logits[0].tolist()
    tokens = model.generate(ids, strategy="wedlm", max_new_tokens=16)[0].tolist()
    print("RESULT " + json.dumps({"module": type(model).__module__, "logits": logits, "tokens": tokens}))
    """


def test_shipped_model_loads_as_remote_code_where_wedlm_hf_is_not_importable(shipped, tmp_path):
    model, tokenizer = shipped
    ids = tokenizer("count from 7 by 2, 6 numbers:", add_special_tokens=False)["input_ids"]
    remote = run_without_wedlm_hf(REMOTE, [default_model_path(), json.dumps(ids)], tmp_path)
    assert remote["module"].startswith("transformers_modules.")
    with torch.no_grad():
        local = model(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(torch.tensor(remote["logits"]), local, rtol=0, atol=0)
    assert remote["tokens"] == model.generate(torch.tensor([ids]), strategy="wedlm", max_new_tokens=16)[0].tolist()


def test_shipped_records_name_no_machine_path():
    for name in ("eval_results.json", "training_info.json"):
        assert not absolute_paths(json.loads((DEFAULT_MODEL_DIR / name).read_text())), name


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


@pytest.fixture
def shipping_target(tmp_path, monkeypatch):
    """ship-default writes into a scratch folder instead of the package's own."""
    target = tmp_path / "default_model"
    monkeypatch.setattr("wedlm_hf.data.shipped_model.DEFAULT_MODEL_DIR", target)
    return target


def test_ship_default_makes_a_hub_style_folder(tmp_path, char_tokenizer, shipping_target):
    model = build_model(dtype=torch.float32)
    model.save_pretrained(tmp_path / "final", tokenizer=char_tokenizer)  # what `wedlm-hf train` leaves
    shipping_target.mkdir()
    (shipping_target / "eval_results.json").write_text("{}")  # measured the previous weights
    cli(["ship-default", str(tmp_path / "final")])
    assert json.loads((shipping_target / "config.json").read_text())["auto_map"] == AUTO_MAP
    assert {p.name for p in shipping_target.glob("*.py")} == {p.name for p in remote_code_files()}
    for link in shipping_target.glob("*.py"):
        assert link.is_symlink() and link.resolve() == (MODELING_DIR / link.name).resolve()
    assert not (shipping_target / "eval_results.json").exists()
    loaded = AutoModelForCausalLM.from_pretrained(shipping_target).state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())


def test_ship_default_names_a_truncated_weight_file(tmp_path, char_tokenizer, shipping_target):
    build_model(dtype=torch.float32).save_pretrained(tmp_path / "final", tokenizer=char_tokenizer)
    weights = tmp_path / "final" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"final/model\.safetensors is not a readable safetensors file"):
        ship_default_model(tmp_path / "final")
    assert not shipping_target.exists()
