"""The Hub's lines on an exported folder, run as a user runs them: `AutoModel` then `generate(strategy="wedlm")`
without wedlm_hf, the model card's usage block without a prompt, and `use_cache` on wherever a checkpoint is
written (exporters refuse a model without its cache)."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import WITHOUT_WEDLM_HF, build_model, run_without_wedlm_hf
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

from wedlm_hf import WeDLMForCausalLM, default_model_path
from wedlm_hf.data.shipped_model import DEFAULT_MODEL_DIR, ship_default_model
from wedlm_hf.hub.export import AUTO_MAP, export_checkpoint
from wedlm_hf.modeling.modeling_wedlm import WeDLMModel
from wedlm_hf.training.trainer import train

PROMPT = "count from 7 by 2, 6 numbers:"
PROMPT_TEXT = "Do you wish to run the custom code?"  # transformers' question before running a folder's code
TYPELESS_CONFIG = "to instantiate a model of type ``"  # its warning when it falls back to a bare config instead


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The shipped checkpoint exported as for the Hub; the card names the folder itself, so its lines run as written."""
    folder = tmp_path_factory.mktemp("hub") / "wedlm-export"
    return export_checkpoint(default_model_path(), folder, repo_id=str(folder))


@pytest.fixture
def one_thread(monkeypatch):
    """Subprocesses run a tiny model: more threads only contend (minutes instead of seconds on a busy CPU)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def wedlm_tokens(model, ids: list[int]) -> list[int]:
    return model.generate(torch.tensor([ids]), strategy="wedlm", max_new_tokens=16)[0].tolist()


# AutoModel, the mission's line, where wedlm_hf is not installed; AutoModelForCausalLM beside it.
AUTO_MODEL = """
    import json, sys

    import torch
    from transformers import AutoModel, AutoModelForCausalLM

    folder, ids = sys.argv[1], torch.tensor([json.loads(sys.argv[2])])
    model = AutoModel.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32)
    out = model.generate(ids, strategy="wedlm", max_new_tokens=16, return_dict_in_generate=True)
    causal = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32)
    print("RESULT " + json.dumps({
        "class": type(model).__name__, "module": type(model).__module__, "base": type(model.model).__name__,
        "tokens": out.sequences[0].tolist(), "tokens_per_forward": out.wedlm_stats[0].tokens_per_forward,
        "causal": causal.generate(ids, strategy="wedlm", max_new_tokens=16)[0].tolist(),
    }))
    """


def test_auto_model_decodes_wedlm_without_the_package(exported, tmp_path, one_thread):
    assert json.loads((exported / "config.json").read_text())["auto_map"] == AUTO_MAP
    tokenizer = AutoTokenizer.from_pretrained(exported)
    ids = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    remote = run_without_wedlm_hf(AUTO_MODEL, [str(exported), json.dumps(ids)], tmp_path)
    assert remote["module"].startswith("transformers_modules.")
    assert (remote["class"], remote["base"]) == ("WeDLMForCausalLM", "WeDLMModel")
    expected = wedlm_tokens(WeDLMForCausalLM.from_pretrained(exported, dtype=torch.float32), ids)
    assert remote["tokens"] == remote["causal"] == expected
    assert remote["tokens_per_forward"] > 1.0


def test_auto_model_is_the_causal_lm_with_the_package_too(exported):
    """With wedlm_hf imported, AutoModel answers as the export's auto_map does, with or without remote code."""
    ids = AutoTokenizer.from_pretrained(exported)(PROMPT, add_special_tokens=False)["input_ids"]
    expected = wedlm_tokens(AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32), ids)
    for trust in (False, True):
        model = AutoModel.from_pretrained(exported, trust_remote_code=trust, dtype=torch.float32)
        assert type(model) is WeDLMForCausalLM and type(model.model) is WeDLMModel
        assert wedlm_tokens(model, ids) == expected


def card_usage(card: str) -> str:
    """The Python block of the card's Usage section."""
    return re.search(r"## Usage\n\n```python\n(.*?)```", card, flags=re.S).group(1)


def test_card_usage_runs_without_a_prompt_or_the_package(exported, tmp_path, one_thread):
    """The card's lines as written, in a fresh process with nothing on stdin: no question about running code, no
    fallback to a typeless config, and its tokenizer is the fast one the package loads."""
    usage = card_usage((exported / "README.md").read_text())
    assert f'AutoTokenizer.from_pretrained("{exported}"' in usage
    report = 'import json\nprint("RESULT " + json.dumps({"fast": tokenizer.is_fast, "ids": tokenizer(P).input_ids}))'
    script = WITHOUT_WEDLM_HF + usage + f"P = {PROMPT!r}\n" + report
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")},
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert PROMPT_TEXT not in output and TYPELESS_CONFIG not in output, output[-3000:]
    remote = json.loads(result.stdout.split("RESULT ", 1)[1])
    assert remote["fast"] and remote["ids"] == AutoTokenizer.from_pretrained(exported)(PROMPT).input_ids


def config_of(folder) -> dict:
    return json.loads((folder / "config.json").read_text())


def test_shipped_and_exported_configs_keep_the_cache_on(tmp_path, char_tokenizer, monkeypatch):
    assert config_of(DEFAULT_MODEL_DIR)["use_cache"] is True
    source = tmp_path / "trained"
    build_model(dtype=torch.float32).save_pretrained(source, tokenizer=char_tokenizer)
    (source / "config.json").write_text(json.dumps({**config_of(source), "use_cache": False}))  # as Trainer saves
    assert config_of(export_checkpoint(source, tmp_path / "export"))["use_cache"] is True
    monkeypatch.setattr("wedlm_hf.data.shipped_model.DEFAULT_MODEL_DIR", tmp_path / "shipped")
    assert config_of(ship_default_model(source))["use_cache"] is True


def test_training_saves_checkpoints_with_the_cache_on(tmp_path, char_tokenizer):
    """Trainer writes `TrainingArguments.use_cache` into the config; `wedlm-hf train` keeps it on."""
    build_model(dtype=torch.float32).save_pretrained(tmp_path / "start", tokenizer=char_tokenizer)
    records = [{"prompt": f"count {i}:", "completion": " " + " ".join(str(i + k) for k in range(4))} for i in range(8)]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    final = train(
        str(tmp_path / "run"),
        [str(tmp_path / "data.jsonl")],
        model=str(tmp_path / "start"),
        seq_len=24,
        block_size=8,
        batch_size=2,
        max_steps=2,
        logging_steps=1,
        save_steps=2,
    )
    assert config_of(final)["use_cache"] is True
    assert config_of(tmp_path / "run" / "checkpoint-2")["use_cache"] is True


def test_executorch_wrapper_accepts_the_shipped_model():
    """transformers' ExecuTorch recipe refuses a model whose config turns the cache off."""
    try:
        from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM
    except ImportError:
        pytest.skip("this transformers has no TorchExportableModuleForDecoderOnlyLM")
    model = WeDLMForCausalLM.from_pretrained(default_model_path(), dtype=torch.float32).eval()
    model.generation_config.cache_implementation = "static"  # the recipe exports on a static cache
    TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=32)
