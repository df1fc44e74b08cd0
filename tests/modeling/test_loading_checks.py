"""Loading a WeDLM checkpoint: weights that contradict the config, and damaged files, fail with the fix to apply.

A config that omits `qk_norm` (or has the wrong `attention_bias`) builds a different attention: transformers would
drop the checkpoint's q/k norms or biases (or leave them random) with only a load report. Truncated weights would
fail inside safetensors without the file's name. A broken generation_config.json would be replaced by the defaults,
and a config.json without the model's sizes would build a model of the default size. Pickle weights that torch
refuses would end in torch's multi-line message.
"""

import argparse
import json

import pytest
import torch
from conftest import run_without_wedlm_hf, tiny_config
from transformers import AutoModelForCausalLM

from wedlm_hf import WeDLMForCausalLM
from wedlm_hf.modeling.modeling_wedlm import WeDLMModel

QWEN3 = {"qk_norm": True, "attention_bias": False}
QWEN25 = {"qk_norm": False, "attention_bias": True}


def save(folder, flavour, edit=None, **save_kwargs):
    """A random checkpoint of the given flavour, its config.json then edited ({field: value}, None deletes)."""
    torch.manual_seed(0)
    model = WeDLMForCausalLM(tiny_config(**flavour))
    model.save_pretrained(folder, **save_kwargs)
    config = json.loads((folder / "config.json").read_text())
    for key, value in (edit or {}).items():
        config.pop(key) if value is None else config.__setitem__(key, value)
    (folder / "config.json").write_text(json.dumps(config))
    return model


def test_output_loading_info_returns_the_model_and_its_report(tmp_path):
    saved = save(tmp_path, QWEN3)
    model, info = WeDLMForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert isinstance(model, WeDLMForCausalLM) and model.generation_config.wedlm_window_size == 16
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), saved.state_dict().values()))


@pytest.mark.parametrize(
    "flavour,edit,message",
    [
        (QWEN3, {"qk_norm": None}, 'has q_norm/k_norm weights but config.qk_norm is false: set "qk_norm": true'),
        (QWEN25, {"qk_norm": True}, 'has no q_norm/k_norm weights but config.qk_norm is true: set "qk_norm": false'),
        (QWEN25, {"attention_bias": False}, 'has q/k/v biases but config.attention_bias is false: set "attention_b'),
        (QWEN3, {"attention_bias": None}, 'has no q/k/v biases but config.attention_bias is true: set "attention_bi'),
    ],
)
def test_weights_that_contradict_the_attention_switches_are_refused(tmp_path, flavour, edit, message):
    save(tmp_path, flavour, edit)
    for load in (WeDLMForCausalLM.from_pretrained, AutoModelForCausalLM.from_pretrained, WeDLMModel.from_pretrained):
        with pytest.raises(ValueError, match=f"{tmp_path}.*{message}.*config.json"):
            load(tmp_path)


def test_both_switches_wrong_names_both_fields(tmp_path):
    save(tmp_path, QWEN3, {"qk_norm": None, "attention_bias": None})  # a Qwen3 checkpoint read with the defaults
    with pytest.raises(ValueError, match='set "qk_norm": true; .* set "attention_bias": false'):
        WeDLMForCausalLM.from_pretrained(tmp_path)


def test_other_missing_weights_keep_transformers_behaviour(tmp_path):
    """A base-model checkpoint lacks only the LM head: loaded, reported missing, no error."""
    torch.manual_seed(0)
    WeDLMModel(tiny_config(**QWEN3)).save_pretrained(tmp_path)
    model, info = WeDLMForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert set(info["missing_keys"]) == {"lm_head.weight"} and not info["unexpected_keys"]
    assert isinstance(model, WeDLMForCausalLM)


def test_truncated_weights_name_the_file(tmp_path):
    save(tmp_path, QWEN3)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # cut inside the header
    with pytest.raises(OSError, match=f"{weights} is damaged or incomplete.*download .* again, or re-save"):
        WeDLMForCausalLM.from_pretrained(tmp_path)


def test_truncated_shard_is_the_one_named(tmp_path):
    save(tmp_path, QWEN3, max_shard_size="100KB")
    shards = sorted(tmp_path.glob("*.safetensors"))
    assert len(shards) > 1
    shards[-1].write_bytes(shards[-1].read_bytes()[:-64])  # data cut short, header intact
    with pytest.raises(OSError, match="damaged or incomplete") as error:
        WeDLMForCausalLM.from_pretrained(tmp_path)
    assert str(shards[-1]) in str(error.value) and all(str(s) not in str(error.value) for s in shards[:-1])


def save_pickle(folder, **extra):
    """A checkpoint whose weights are a pickle (pytorch_model.bin) instead of safetensors, with `extra` entries."""
    model = save(folder, QWEN3)
    (folder / "model.safetensors").unlink()
    torch.save({**model.state_dict(), **extra}, folder / "pytorch_model.bin")
    return model


def test_pickle_weights_torch_refuses_name_the_file_and_the_fix(tmp_path):
    """Before: torch's multi-line UnpicklingError, naming no file."""
    saved = save_pickle(tmp_path, training_args=argparse.Namespace(lr=1e-3))  # what a training script may pickle
    weights = tmp_path / "pytorch_model.bin"
    for load in (WeDLMForCausalLM.from_pretrained, AutoModelForCausalLM.from_pretrained):
        with pytest.raises(OSError) as refused:
            load(tmp_path)
        message = str(refused.value)
        assert message.startswith(f"{weights} is pickle weights that torch.load(weights_only=True) refuses (Unsupp")
        assert "argparse.Namespace" in message and "\n" not in message
    # The fix it names works: allowed once, saved as safetensors, the checkpoint then loads as it is.
    assert "with torch.serialization.safe_globals([argparse.Namespace]):` and save it with save_pretrained" in message
    with torch.serialization.safe_globals([argparse.Namespace]):
        WeDLMForCausalLM.from_pretrained(tmp_path).save_pretrained(tmp_path / "fixed")
    fixed = WeDLMForCausalLM.from_pretrained(tmp_path / "fixed")
    assert all(torch.equal(a, b) for a, b in zip(fixed.state_dict().values(), saved.state_dict().values()))


def test_truncated_pickle_weights_name_the_file(tmp_path):
    save_pickle(tmp_path)
    WeDLMForCausalLM.from_pretrained(tmp_path)  # plain tensors: torch.load(weights_only=True) takes them
    torch.save({"args": argparse.Namespace()}, tmp_path / "training_args.bin")  # Trainer's pickle, never loaded
    weights = tmp_path / "pytorch_model.bin"
    weights.write_bytes(weights.read_bytes()[:5000])
    with pytest.raises(OSError, match=f"^{weights} is damaged or incomplete .*download the checkpoint again"):
        WeDLMForCausalLM.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "text,message",
    [
        (
            '{\n  "strategy": "wedlm",\n  "wedlm_window_size": 4,\n}',  # a trailing comma
            r"is not valid JSON \(Expecting property name enclosed in double quotes at line 4, column 1\): fix it",
        ),
        ("[16]", "holds an array, not a JSON object of generation settings"),
        ('{"strategy": "fast"}', "strategy must be one of ar, wedlm, got 'fast'"),
        ('{"strategy": "wedlm", "wedlm_window_size": 0}', r"wedlm_window_size must be an integer >= 1 .*got 0\."),
        ('{"wedlm_lossless": "yes"}', "wedlm_lossless must be a boolean"),
        ('{"max_new_tokens": -3}', "`max_new_tokens` must be greater than 0, but is -3"),  # GenerationConfig's own
    ],
    ids=["not-json", "array", "strategy", "window-size", "lossless", "max-new-tokens"],
)
def test_an_invalid_generation_config_is_named_not_replaced_by_defaults(tmp_path, text, message):
    """Before: a file that is not JSON loaded as the defaults (strategy "ar", W 16), invalid wedlm values loaded as
    they were, and transformers' own refusals did not name the file."""
    save(tmp_path, QWEN3)
    path = tmp_path / "generation_config.json"
    path.write_text(text)
    for load in (WeDLMForCausalLM.from_pretrained, AutoModelForCausalLM.from_pretrained):
        with pytest.raises(ValueError, match=f"^{path} .*{message}"):
            load(tmp_path)
    path.write_text('{"strategy": "wedlm", "wedlm_window_size": 4, "top_k": 1}')  # valid: read as written
    config = AutoModelForCausalLM.from_pretrained(tmp_path).generation_config
    assert (config.strategy, config.wedlm_window_size, config.top_k, config.wedlm_pos_penalty_factor) == (
        "wedlm",
        4,
        1,
        0.02,
    )
    path.unlink()  # no generation_config.json at all: the defaults
    config = WeDLMForCausalLM.from_pretrained(tmp_path).generation_config
    assert (config.strategy, config.wedlm_window_size) == ("ar", 16)


@pytest.mark.parametrize(
    "field",
    [
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
    ],
)
def test_a_config_without_a_model_size_names_it(tmp_path, field):
    """Before: the defaults (4096 wide, 32 layers) built another model, and loading ended in transformers' long
    report of mismatched weights (or, through AutoConfig, a layer_types validation error)."""
    save(tmp_path, QWEN3, {field: None})
    for load in (WeDLMForCausalLM.from_pretrained, AutoModelForCausalLM.from_pretrained, WeDLMModel.from_pretrained):
        with pytest.raises(ValueError, match=f"^{tmp_path / 'config.json'} lacks the model size {field}: add it"):
            load(tmp_path)


def test_a_config_without_several_sizes_names_them_all(tmp_path):
    save(tmp_path, QWEN3, {"hidden_size": None, "vocab_size": None})
    with pytest.raises(ValueError, match="lacks the model sizes vocab_size, hidden_size: add them"):
        AutoModelForCausalLM.from_pretrained(tmp_path)


# Loads each folder as remote code (run where wedlm_hf cannot be imported) and reports how each load failed.
REMOTE = """
    import json, sys

    from transformers import AutoModelForCausalLM

    errors = []
    for folder in sys.argv[1:]:
        try:
            AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
            errors.append(None)
        except Exception as error:
            errors.append([type(error).__name__, str(error)])
    print("RESULT " + json.dumps(errors))
    """


def test_remote_code_names_the_files_too(tmp_path):
    save(tmp_path / "sizes", QWEN3, {"num_hidden_layers": None})
    save(tmp_path / "generation", QWEN3)
    (tmp_path / "generation" / "generation_config.json").write_text('{"wedlm_window_size": 0}')
    sizes, generation = run_without_wedlm_hf(REMOTE, [str(tmp_path / "sizes"), str(tmp_path / "generation")], tmp_path)
    assert sizes[0] == "ValueError" and sizes[1].startswith(f"{tmp_path / 'sizes' / 'config.json'} lacks the model")
    assert generation[0] == "ValueError" and "generation_config.json has a setting" in generation[1]
