"""The switch itself: what it replaces and where, what it leaves alone, what it refuses; and a decoder layer's other
operations, which give a row the same bits at any batch size as they are."""

import threading

import pytest
import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AutoModelForCausalLM
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, Qwen3RotaryEmbedding

from wedlm_hf import WeDLMConfig, batch_invariant, default_model_path
from wedlm_hf.modeling.batch_invariant import is_active, refusal

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def row_alone_differs(dtype=torch.float32) -> bool:
    """Whether a linear layer rounds a row differently alone and among 16 rows (torch's own kernels do in float32)."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn((16, 256), generator=g).to(dtype), torch.randn((768, 256), generator=g).to(dtype)
    return not torch.equal(F.linear(x[:1], w)[0], F.linear(x, w)[0])


def test_inside_the_switch_a_row_is_the_same_and_outside_torch_is_untouched():
    before = {name: AttentionInterface()[name] for name in AttentionInterface()}
    assert row_alone_differs()
    with batch_invariant():
        assert is_active() and not row_alone_differs()
        assert AttentionInterface()["sdpa"] is not before["sdpa"]
    assert not is_active() and row_alone_differs()
    assert {name: AttentionInterface()[name] for name in AttentionInterface()} == before


def test_the_switch_holds_in_the_thread_that_entered_it_only():
    g = torch.Generator().manual_seed(1)
    x, w, bias = torch.randn((5, 256), generator=g), torch.randn((128, 256), generator=g), torch.randn(128, generator=g)
    torch_own = (F.linear(x, w), F.linear(x, w, bias), torch.addmm(bias, x, w.t(), beta=0.5, alpha=2))
    seen = {}

    def other_thread():  # torch's own kernels, bit for bit, while this thread is inside
        seen["other"] = row_alone_differs()
        again = (F.linear(x, w), F.linear(x, w, bias), torch.addmm(bias, x, w.t(), beta=0.5, alpha=2))
        seen["torch's own"] = all(torch.equal(a, b) for a, b in zip(again, torch_own))

    with batch_invariant():
        other = threading.Thread(target=other_thread)
        other.start()
        other.join()
        seen["this"] = row_alone_differs()
    assert seen == {"other": True, "torch's own": True, "this": False}


def test_the_switch_nests_and_decorates():
    @batch_invariant()
    def inside():
        return is_active()

    with batch_invariant():
        with batch_invariant():
            pass
        assert is_active()
    assert not is_active() and inside() and not is_active()


@pytest.fixture(scope="module")
def eager_model():
    return AutoModelForCausalLM.from_pretrained(default_model_path(), attn_implementation="eager").eval()


def test_what_it_does_not_cover_is_refused_in_one_line(eager_model):
    ids = torch.tensor([[5, 6, 7]])
    with batch_invariant(), pytest.raises(ValueError, match=r"attention 'eager' is not covered.*sdpa") as error:
        eager_model(ids)
    with batch_invariant(), pytest.raises(ValueError, match=r"attention 'eager' is not covered"):
        eager_model.generate(ids, strategy="wedlm", max_new_tokens=2)
    eager_model(ids)  # outside the switch it runs as ever
    messages = [str(error.value)]
    with batch_invariant(), pytest.raises(ValueError, match=r"'flash_attention_2' is not covered") as error:
        AttentionInterface()["flash_attention_2"](None, None, None, None, None)
    messages.append(str(error.value))
    query = torch.zeros((1, 4, 2, 64))
    with batch_invariant(), pytest.raises(ValueError, match=r"attention dropout is not covered") as error:
        AttentionInterface()["sdpa"](eager_model.model.layers[0].self_attn, query, query, query, None, dropout=0.1)
    messages.append(str(error.value))
    config = WeDLMConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1)
    config.quantization_config = {"quant_method": "torchao"}
    messages.append(refusal(_Fake(config, "cpu")))
    messages.append(refusal(_Fake(WeDLMConfig(), "meta")))
    assert "quantized weights" in messages[-2] and "CPU forwards only: on meta" in messages[-1]
    assert all(message.startswith("batch_invariant()") and "\n" not in message for message in messages)


class _Fake(torch.nn.Module):
    """A model's config and device, as `refusal` reads them."""

    def __init__(self, config, device):
        super().__init__()
        self.config = config
        self.weight = torch.nn.Parameter(torch.zeros(1, device=device))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_rest_of_a_layer_gives_a_row_the_same_bits_at_any_batch_size(dtype):
    """RMSNorm (hidden and per head), the rotary embedding and SiLU, at the shipped model's sizes, untouched by
    the switch: each reduces within one row or is elementwise on rows of whole SIMD vectors."""
    config = AutoModelForCausalLM.from_pretrained(default_model_path()).config
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn((40, 256), generator=g).to(dtype)
    norm, head_norm = Qwen3RMSNorm(256).to(dtype), Qwen3RMSNorm(64).to(dtype)
    rotary = Qwen3RotaryEmbedding(config=config)
    positions = torch.randint(0, 1000, (1, 40), generator=g)
    for rows in (1, 3, 17, 40):
        assert torch.equal(norm(hidden[:rows]), norm(hidden)[:rows])
        assert torch.equal(head_norm(hidden[:rows].view(rows, 4, 64)), head_norm(hidden.view(40, 4, 64))[:rows])
        assert torch.equal(F.silu(hidden[:rows]), F.silu(hidden)[:rows])
        cos, sin = rotary(hidden[None], positions[:, :rows])
        full_cos, full_sin = rotary(hidden[None], positions)
        assert torch.equal(cos, full_cos[:, :rows]) and torch.equal(sin, full_sin[:, :rows])
