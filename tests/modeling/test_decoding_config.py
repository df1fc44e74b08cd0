"""`WeDLMDecodingConfig`: the WeDLM options defined once, and one error text per bad value whichever door it came
through (a `generate` argument, generation_config.json, a server request)."""

import json

import pytest
import torch
from conftest import build_model
from transformers import GenerationConfig

from wedlm_hf import WEDLM_GENERATION_DEFAULTS
from wedlm_hf.modeling import WeDLMDecodingConfig, WeDLMOptionError
from wedlm_hf.modeling.loading_checks import check_generation_config
from wedlm_hf.serving.openai_schema import APIError, parse_completion

BAD = [
    ("wedlm_window_size", 0),
    ("wedlm_window_size", True),
    ("wedlm_entropy_threshold", -1.0),
    ("wedlm_pos_penalty_factor", -0.5),
    ("wedlm_lossless", "yes"),
    ("wedlm_context_drafts", 1),
    ("wedlm_context_ngram", 0),
    ("wedlm_context_ngram", 17),  # each size up to it is indexed per row
]


def test_defaults_and_sources():
    assert WEDLM_GENERATION_DEFAULTS == {"strategy": "ar", **WeDLMDecodingConfig().as_kwargs()}
    config = GenerationConfig(wedlm_window_size=8, wedlm_lossless=True)
    options = WeDLMDecodingConfig.from_values(config, {"wedlm_window_size": 4}, wedlm_entropy_threshold=None)
    assert options == WeDLMDecodingConfig(window_size=4, entropy_threshold=None, lossless=True)  # later wins
    with pytest.raises(WeDLMOptionError, match="Unknown WeDLM option 'wedlm_windowsize'"):
        WeDLMDecodingConfig.from_values(wedlm_windowsize=4)


def test_json_integers_become_the_floats_they_mean():
    """A request's `"wedlm_pos_penalty_factor": 1` is the float 1.0; an integer no float holds is refused here,
    not left to overflow inside the decoding step the whole batch shares."""
    options = WeDLMDecodingConfig.from_values(wedlm_pos_penalty_factor=1, wedlm_entropy_threshold=0)
    assert (options.pos_penalty_factor, options.entropy_threshold) == (1.0, 0.0)
    assert isinstance(options.pos_penalty_factor, float) and isinstance(options.entropy_threshold, float)
    for key in ("wedlm_pos_penalty_factor", "wedlm_entropy_threshold"):
        with pytest.raises(WeDLMOptionError, match=f"{key} must be a number a float can hold"):
            WeDLMDecodingConfig.from_values(**{key: 10**400})


@pytest.mark.parametrize("key, value", BAD, ids=[f"{k}={v!r}" for k, v in BAD])
def test_one_error_text_through_every_door(tmp_path, key, value):
    with pytest.raises(WeDLMOptionError) as direct:
        WeDLMDecodingConfig.from_values(**{key: value})
    text = str(direct.value)
    assert direct.value.key == key and text.startswith(f"{key} must be ") and text.endswith(f"got {value!r}.")
    with pytest.raises(ValueError) as generated:  # a generate argument
        build_model().generate(torch.tensor([[1, 2, 3]]), strategy="wedlm", max_new_tokens=4, **{key: value})
    assert str(generated.value) == text
    path = tmp_path / "generation_config.json"  # the checkpoint's file, checked at load
    path.write_text(json.dumps({key: value}))
    with pytest.raises(ValueError) as loaded:
        check_generation_config(path)
    assert text in str(loaded.value)
    with pytest.raises(APIError) as requested:  # a server request
        parse_completion({"prompt": "x", key: value}, "m", WeDLMDecodingConfig())
    assert requested.value.message == text and requested.value.param == key
