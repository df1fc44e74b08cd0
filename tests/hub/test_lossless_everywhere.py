"""`wedlm_lossless` wherever decoding runs: generation_config.json, remote code, custom_generate, the pipeline."""

import json

import torch
from conftest import EOS_ID, MASK_ID, REMOTE_GENERATE, build_model, peaky, prompts, run_without_wedlm_hf, tiny_config
from transformers import Qwen3Config, Qwen3ForCausalLM, pipeline

from wedlm_hf import WeDLMForCausalLM
from wedlm_hf.hub.custom_generate import export_custom_generate

SETTINGS = dict(max_new_tokens=14, eos_token_id=EOS_ID, pad_token_id=EOS_ID)


def test_generation_config_turns_it_on_and_survives_save(tmp_path):
    model = build_model()
    ids, mask = prompts(2)
    ar = model.generate(ids, attention_mask=mask, do_sample=False, **SETTINGS)
    model.generation_config.strategy = "wedlm"
    model.generation_config.wedlm_lossless = True
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "generation_config.json").read_text())["wedlm_lossless"] is True
    reloaded = WeDLMForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    out = reloaded.generate(ids, attention_mask=mask, return_dict_in_generate=True, **SETTINGS)
    assert torch.equal(out.sequences, ar) and sum(s.accepted_drafts + s.rejected_drafts for s in out.wedlm_stats)


def test_remote_code_without_the_package(tmp_path):
    model = build_model()
    model.save_pretrained(tmp_path / "ckpt")
    ids, mask = prompts(2)
    request = {"ids": ids.tolist(), "mask": mask.tolist(), "settings": {**SETTINGS, "wedlm_lossless": True}}
    remote = run_without_wedlm_hf(REMOTE_GENERATE, [str(tmp_path / "ckpt"), json.dumps(request)], tmp_path)
    assert remote == model.generate(ids, attention_mask=mask, do_sample=False, **SETTINGS).tolist()


def test_custom_generate_on_a_stock_qwen3(tmp_path):
    folder = export_custom_generate(tmp_path / "wedlm-decoding")
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
    config = {k: v for k, v in tiny_config().to_dict().items() if k in keys + ("vocab_size", "head_dim")}
    torch.manual_seed(0)
    stock = peaky(Qwen3ForCausalLM(Qwen3Config(**config))).to(torch.float64).eval()
    ids, mask = prompts(2)
    out = stock.generate(
        ids,
        attention_mask=mask,
        custom_generate=str(folder),
        trust_remote_code=True,
        mask_token_id=MASK_ID,
        wedlm_lossless=True,
        **SETTINGS,
    )
    assert torch.equal(out, stock.generate(ids, attention_mask=mask, do_sample=False, **SETTINGS))


def test_pipeline(tmp_path, char_tokenizer):
    model = build_model(dtype=torch.float32)
    model.save_pretrained(tmp_path, tokenizer=char_tokenizer)
    pipe = pipeline("text-generation", model=str(tmp_path), trust_remote_code=True)
    options = dict(max_new_tokens=12, eos_token_id=None, do_sample=False, return_full_text=False)
    lossless = pipe("hello", strategy="wedlm", wedlm_lossless=True, **options)[0]["generated_text"]
    assert lossless == pipe("hello", **options)[0]["generated_text"]


def test_model_card_reports_the_lossless_mode_next_to_the_default_one():
    from wedlm_hf.hub.model_card import stats_section

    family = dict(
        items=10,
        ar_exact_match=0.9,
        wedlm_exact_match=0.8,
        tokens_per_forward=4.25,
        tokens_per_forward_ceiling=6.5,
        ar_tokens_per_s=100.0,
        wedlm_tokens_per_s=310.0,
        speedup=3.1,
    )
    settings = dict(
        window_size=16, entropy_threshold=0.4, pos_penalty_factor=0.02, threads=2, torch="t", transformers="x"
    )
    lossless = dict(identical_to_ar=True, tokens_per_forward=3.5, tokens_per_s=280.0, speedup=2.8, acceptance_rate=0.9)
    text = stats_section({"settings": settings, "families": {"counting": {**family, "lossless": lossless}}})
    assert "| counting | 3.50 | 90.0% | 280 | 2.80x |" in text and "identical to plain AR" in text
    assert "Lossless mode" not in stats_section({"settings": settings, "families": {"counting": family}})
