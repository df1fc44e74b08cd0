"""`step_cost`: a step's work in token rows, attention counted, and the prompt chunk that keeps a step within budget."""

import json
from pathlib import Path

import pytest
from transformers import PretrainedConfig

from wedlm_hf import default_model_path
from wedlm_hf.modeling.step_cost import keys_per_row, prompt_cap, step_cost


def test_keys_per_row_counts_the_shipped_models_multiply_adds():
    config = PretrainedConfig(**json.loads((Path(default_model_path()) / "config.json").read_text()))
    # Per layer and token row: q, o 256x256, k, v 256x128, MLP 3x256x768; per key: 4 heads x 64 x (q.k + v).
    assert keys_per_row(config) == (2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 768) // (2 * 4 * 64)


def test_keys_per_row_is_none_without_a_dense_decoders_sizes():
    assert keys_per_row(PretrainedConfig(hidden_size=64, num_attention_heads=4)) is None


@pytest.mark.parametrize("context, fed", [(20, 0), (300, 0), (50, 2000), (5000, 100)])
def test_prompt_cap_is_the_longest_chunk_within_the_budget(context, fed):
    budget, rows, width, keys = 2048, 3, 16, 1536
    cap = prompt_cap(budget, rows, width, context, fed, 10_000, keys)

    def cost(chunk):
        return step_cost(rows, max(chunk, width), max(context, fed + chunk), keys)

    assert cap == width or cost(cap) <= budget  # the floor: the decoding rows' own width
    assert cost(cap + 1) > budget


def test_prompt_cap_feeds_what_remains_when_it_fits_and_never_less_than_the_window():
    assert prompt_cap(2048, 2, 16, 100, 0, 40, 1536) == 40
    assert prompt_cap(64, 4, 16, 100_000, 0, 5_000, 1536) == 16  # over budget already: the window, soft
    assert prompt_cap(64, 1, 0, 1, 0, 5_000, 1536) >= 1
