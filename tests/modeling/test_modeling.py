"""WeDLMConfig / WeDLMForCausalLM: released config fields, Qwen weight compatibility, Auto registration, plain AR."""

import json

import pytest
import torch
from conftest import tiny_config
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GenerationConfig,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from wedlm_hf import WEDLM_GENERATION_DEFAULTS, WeDLMConfig, WeDLMForCausalLM

SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=96,
)


def test_config_defaults_follow_the_released_configs():
    config = WeDLMConfig(**SHAPE)
    assert config.model_type == "wedlm"
    assert config.head_dim == 64 // 4
    assert (config.attention_bias, config.qk_norm, config.mask_token_id) == (True, False, None)
    assert WeDLMConfig(**SHAPE, head_dim=32).head_dim == 32


def test_released_style_config_json_loads(tmp_path):
    released = {
        "architectures": ["WeDLMForCausalLM"],
        "auto_map": {
            "AutoConfig": "configuration_wedlm.WeDLMConfig",
            "AutoModelForCausalLM": "modeling_wedlm.WeDLMForCausalLM",
        },
        "model_type": "wedlm",
        "attention_bias": False,
        "qk_norm": True,
        "head_dim": None,
        "mask_token_id": None,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 36,
        "torch_dtype": "bfloat16",
        **SHAPE,
    }
    (tmp_path / "config.json").write_text(json.dumps(released))
    config = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(config, WeDLMConfig)
    assert config.rope_parameters["rope_theta"] == 1000000.0 and config.head_dim == 16 and config.qk_norm


def test_qwen3_flavour_has_qwen3_weights_and_logits():
    torch.manual_seed(0)
    ours = WeDLMForCausalLM(WeDLMConfig(**SHAPE, qk_norm=True, attention_bias=False)).eval()
    theirs = Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=16)).eval()
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randint(0, 96, (2, 12))
    assert torch.equal(ours(x).logits, theirs(x).logits)


def test_qwen25_flavour_has_qwen2_weights_and_logits():
    torch.manual_seed(0)
    ours = WeDLMForCausalLM(WeDLMConfig(**SHAPE, qk_norm=False, attention_bias=True)).eval()
    theirs = Qwen2ForCausalLM(Qwen2Config(**SHAPE)).eval()
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    assert "model.layers.0.self_attn.q_proj.bias" in ours.state_dict()
    assert "model.layers.0.self_attn.o_proj.bias" not in ours.state_dict()
    assert "model.layers.0.self_attn.q_norm.weight" not in ours.state_dict()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randint(0, 96, (2, 12))
    assert torch.equal(ours(x).logits, theirs(x).logits)


def test_auto_classes_know_wedlm():
    config = AutoConfig.for_model("wedlm", **SHAPE)
    assert isinstance(AutoModelForCausalLM.from_config(config), WeDLMForCausalLM)


def test_plain_generate_is_ordinary_ar_and_bit_identical_to_qwen3():
    torch.manual_seed(0)
    ours = WeDLMForCausalLM(tiny_config()).eval()
    theirs = Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=16, max_position_embeddings=512)).eval()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randint(0, 90, (2, 7))
    for kwargs in ({}, {"strategy": "ar"}):
        a = ours.generate(x, max_new_tokens=12, do_sample=False, **kwargs)
        b = theirs.generate(x, max_new_tokens=12, do_sample=False)
        assert torch.equal(a, b)
    torch.manual_seed(3)
    a = ours.generate(x, max_new_tokens=12, do_sample=True, return_dict_in_generate=True, output_scores=True)
    torch.manual_seed(3)
    b = theirs.generate(x, max_new_tokens=12, do_sample=True, return_dict_in_generate=True, output_scores=True)
    assert torch.equal(a.sequences, b.sequences) and all(torch.equal(s, t) for s, t in zip(a.scores, b.scores))


def test_generation_defaults_exist_and_survive_save_reload(tmp_path):
    model = WeDLMForCausalLM(tiny_config())
    for key, value in WEDLM_GENERATION_DEFAULTS.items():
        assert getattr(model.generation_config, key) == value
    model.generation_config.wedlm_window_size = 8
    model.generation_config.wedlm_entropy_threshold = None
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "generation_config.json").read_text())
    assert saved["wedlm_window_size"] == 8 and saved["strategy"] == "ar" and saved["wedlm_entropy_threshold"] is None
    reloaded = WeDLMForCausalLM.from_pretrained(tmp_path)
    assert reloaded.generation_config.wedlm_window_size == 8
    assert reloaded.generation_config.wedlm_entropy_threshold is None
    assert reloaded.generation_config.wedlm_pos_penalty_factor == 0.02
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert again.generation_config.wedlm_window_size == 8


def test_generation_config_defaults_drive_decoding(tmp_path):
    model = WeDLMForCausalLM(tiny_config()).eval()
    x = torch.randint(0, 90, (1, 6))
    explicit = model.generate(x, strategy="wedlm", max_new_tokens=10, wedlm_window_size=3, return_dict_in_generate=True)
    model.generation_config.wedlm_window_size = 3
    model.generation_config.strategy = "wedlm"
    implicit = model.generate(x, max_new_tokens=10, return_dict_in_generate=True)
    assert torch.equal(explicit.sequences, implicit.sequences) and explicit.wedlm_stats == implicit.wedlm_stats
    config = GenerationConfig(max_new_tokens=10, wedlm_window_size=3)
    assert torch.equal(model.generate(x, generation_config=config, strategy="wedlm"), explicit.sequences)


def test_dual_stream_forward_needs_its_mask():
    model = WeDLMForCausalLM(tiny_config())
    x = torch.randint(0, 90, (1, 8))
    with pytest.raises(ValueError, match="4D `attention_mask`"):
        model(x, labels=x, label_weights=torch.ones(1, 8))
    with pytest.raises(ValueError, match="needs `labels`"):
        model(x, label_weights=torch.ones(1, 8))
