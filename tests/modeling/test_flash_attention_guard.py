"""The flash-attention-2 path: transformers' real dispatch, with flash kernels emulated in torch on the CPU.

transformers picks varlen / padded / packed flash calls in `_flash_attention_forward`. With batch 1, several
queries and non-monotonic positions (exactly a WeDLM window) it would treat the row as packed sequences and attend
to the wrong keys. The decoder passes explicit `cu_seq_lens` to avoid it; here the kernels are torch functions
with flash semantics (bottom-right causal alignment), so the dispatch and the guard are tested without a GPU.
"""

import pytest
import torch
import transformers.modeling_flash_attention_utils as fa_utils
from conftest import EOS_ID, MASK_ID, build_model, prompts
from reference_wedlm import reference_decode

from wedlm_hf.modeling import ragged_cache


def _attend(q, k, v, causal, scale):
    """q (Sq, H, D), k/v (Sk, Hkv, D); causal is aligned bottom-right, as flash attention does."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    if causal:
        sq, sk = q.shape[0], k.shape[0]
        allowed = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + (sk - sq)
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def flash_fn(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, **kwargs):
    return torch.stack([_attend(q[b], k[b], v[b], causal, softmax_scale) for b in range(q.shape[0])])


def flash_varlen_fn(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q=None,
    max_seqlen_k=None,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    **kwargs,
):
    out = torch.empty_like(q)
    for i in range(len(cu_seqlens_q) - 1):
        qs, qe, ks, ke = int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1]), int(cu_seqlens_k[i]), int(cu_seqlens_k[i + 1])
        out[qs:qe] = _attend(q[qs:qe], k[ks:ke], v[ks:ke], causal, softmax_scale)
    return out


@pytest.fixture
def emulated_flash(monkeypatch):
    process = fa_utils._lazy_define_process_function(flash_varlen_fn)
    monkeypatch.setattr(
        fa_utils,
        "lazy_import_flash_attention",
        lambda *a, **k: (
            (flash_fn, flash_varlen_fn, None, fa_utils._pad_input, fa_utils._unpad_input),
            (process, dict),
        ),
    )


def reference(prompt: list[int]) -> tuple[list[int], int]:
    """The reference decoder's tokens for `decode`'s settings (the default rule: context drafts on)."""
    return reference_decode(build_model(seed=5), prompt, MASK_ID, 6, 0.8, 0.02, 16, (EOS_ID,), context_drafts=True)


def flash_model():
    model = build_model(seed=5)
    model.config._attn_implementation = "flash_attention_2"  # kernels are emulated; skip the install check
    return model


def decode(model, ids, mask=None):
    return model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=16,
        strategy="wedlm",
        wedlm_window_size=6,
        wedlm_entropy_threshold=0.8,
        eos_token_id=EOS_ID,
        pad_token_id=EOS_ID,
    )


def test_flash_batch_one_equals_reference(emulated_flash):
    model = flash_model()
    ids, _ = prompts(1)
    expected, _ = reference(ids[0].tolist())
    assert decode(model, ids)[0, ids.shape[1] :].tolist()[: len(expected)] == expected


def test_flash_batched_with_holes_equals_sdpa(emulated_flash):
    ids, mask = prompts(3)
    assert torch.equal(decode(flash_model(), ids, mask), decode(build_model(seed=5), ids, mask))


def test_without_the_guard_flash_reads_a_packed_sequence(emulated_flash, monkeypatch):
    """The trap is real: with the guard switched off, batch-1 decoding diverges from the reference."""
    original = ragged_cache.RaggedCache.__init__

    def no_guard(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self._flash = False

    monkeypatch.setattr(ragged_cache.RaggedCache, "__init__", no_guard)
    ids, _ = prompts(1)
    expected, _ = reference(ids[0].tolist())
    assert decode(flash_model(), ids)[0, ids.shape[1] :].tolist()[: len(expected)] != expected
