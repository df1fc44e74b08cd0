"""transformers' own model tests against WeDLMModel / WeDLMForCausalLM, laid out as a built-in model's test file.

Both WeDLM flavours run: Qwen3-like (qk_norm=True, attention_bias=False) and Qwen2.5-like (qk_norm=False,
attention_bias=True).

Run for real, from the sdist of the INSTALLED transformers (scripts/fetch_transformers_testers.py downloads it with
pip into build/transformers-testers/<version>/ on first use and imports it as `hf_sdist_tests`; nothing of it is
in this repository):
- ModelTesterMixin (tests/test_modeling_common.py): about 160 tests per flavour (save/load, loading reports,
  tied weights, resizing embeddings, attention/hidden-state outputs, eager vs sdpa, training and gradient
  checkpointing, torch.export, ...). The ones it skips itself say why (no GPU, no flash-attn, no MoE, ...).
- ConfigTester (tests/test_configuration_common.py), via `test_config`.

Our own equivalents, because transformers keeps these only in its GitHub test tree, which no registry carries:
- CausalLMModelTester / CausalLMModelTest (tests/causal_lm_tester.py): `WeDLMModelTester` below (the tiny config
  and inputs) and `test_model`.
- GenerationTesterMixin (tests/generation/test_utils.py): `ARGenerationChecks` in ar_generation_checks.py, which
  tests plain `generate` (strategy "ar"). The sdist's import of the mixin is served by a shim class that our
  checks subclass, so ModelTesterMixin's test that a generative model's tests include generation tests holds.
"""

import importlib
import sys
import unittest
import unittest.mock
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from fetch_transformers_testers import PACKAGE, ensure_testers  # noqa: E402

try:
    sys.path.insert(0, str(ensure_testers()))
except RuntimeError as error:  # offline; .ci/run fetches them first, so CI fails instead
    pytest.skip(f"transformers' common testers are not available: {error}", allow_module_level=True)
modeling_common = importlib.import_module(f"{PACKAGE}.test_modeling_common")
configuration_common = importlib.import_module(f"{PACKAGE}.test_configuration_common")
GenerationTesterMixin = importlib.import_module(f"{PACKAGE}.generation.test_utils").GenerationTesterMixin

from ar_generation_checks import ARGenerationChecks  # noqa: E402

from wedlm_hf import WeDLMConfig, WeDLMForCausalLM  # noqa: E402
from wedlm_hf.modeling.modeling_wedlm import WeDLMModel  # noqa: E402


class WeDLMModelTester:
    """The tiny model and inputs (the role of transformers' CausalLMModelTester), kept small for CPU runtime."""

    flavour: dict = {}
    batch_size = 3
    seq_length = 7
    vocab_size = 99
    hidden_size = 32
    num_hidden_layers = 2
    num_attention_heads = 2
    num_key_value_heads = 1  # grouped-query attention, as in the released checkpoints
    intermediate_size = 37
    is_training = True

    def __init__(self, parent):
        self.parent = parent

    def get_config(self) -> WeDLMConfig:
        return WeDLMConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            intermediate_size=self.intermediate_size,
            max_position_embeddings=512,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            mask_token_id=98,
            **self.flavour,
        )

    def prepare_config_and_inputs(self):
        input_ids = modeling_common.ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        attention_mask = torch.tril(torch.ones_like(input_ids))  # left-to-right ragged rows, as transformers uses
        return self.get_config(), input_ids, attention_mask

    def prepare_config_and_inputs_for_common(self):
        config, input_ids, attention_mask = self.prepare_config_and_inputs()
        return config, {"input_ids": input_ids, "attention_mask": attention_mask}


class WeDLMGenerationTests(ARGenerationChecks, GenerationTesterMixin):
    """Our generation tests, standing where GenerationTesterMixin would (see the module docstring)."""


class _WeDLMModelTest(modeling_common.ModelTesterMixin, WeDLMGenerationTests):
    all_model_classes = (WeDLMModel, WeDLMForCausalLM)
    model_tester_class = WeDLMModelTester
    # Run the weight-initialisation check too (it skips models it dates before 2023 from a copyright line we lack).
    test_can_init_all_missing_weights_before_2023 = True

    def setUp(self):
        self.model_tester = self.model_tester_class(self)
        self.config_tester = configuration_common.ConfigTester(self, config_class=WeDLMConfig, hidden_size=37)
        # The common tests find the base model and the causal-LM head (labels, base-model loading) by name in
        # transformers' built-in mappings, which `AutoModel.register` does not touch.
        for names, model_class in (
            (modeling_common.MODEL_MAPPING_NAMES, WeDLMModel),
            (modeling_common.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, WeDLMForCausalLM),
        ):
            patcher = unittest.mock.patch.dict(names, {"wedlm": model_class.__name__})
            patcher.start()
            self.addCleanup(patcher.stop)

    if hasattr(modeling_common.ModelTesterMixin, "test_bc_cache_name_forward"):  # transformers >= 5.24
        # It records the deprecation warning for `past_key_values` that our filters would turn into an error.
        @pytest.mark.filterwarnings("always:`past_key_values` is deprecated:FutureWarning")
        def test_bc_cache_name_forward(self):
            super().test_bc_cache_name_forward()

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_model(self):
        config, input_ids, attention_mask = self.model_tester.prepare_config_and_inputs()
        model = WeDLMModel(config).eval()
        with torch.no_grad():
            hidden = model(input_ids, attention_mask=attention_mask).last_hidden_state
        tester = self.model_tester
        self.assertEqual(hidden.shape, (tester.batch_size, tester.seq_length, tester.hidden_size))


class Qwen3FlavourTester(WeDLMModelTester):
    flavour = {"qk_norm": True, "attention_bias": False}


class Qwen25FlavourTester(WeDLMModelTester):
    flavour = {"qk_norm": False, "attention_bias": True}


class WeDLMQwen3FlavourModelTest(_WeDLMModelTest, unittest.TestCase):
    model_tester_class = Qwen3FlavourTester


class WeDLMQwen25FlavourModelTest(_WeDLMModelTest, unittest.TestCase):
    model_tester_class = Qwen25FlavourTester
