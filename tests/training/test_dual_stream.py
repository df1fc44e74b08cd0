"""Dual-stream masking: layout, attention pattern, loss, and that a tiny model learns from it."""

import pytest
import torch
from conftest import MASK_ID, tiny_config

from wedlm_hf import WeDLMForCausalLM
from wedlm_hf.modeling.dual_stream_loss import dual_stream_loss
from wedlm_hf.training.dual_stream_collator import DualStreamCollator

PAD = 94


def features(seed=0, lengths=(40, 27)):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        ids = torch.randint(0, 90, (n,), generator=g).tolist()
        prompt = [1] * 5 + [0] * (n - 5)
        out.append({"input_ids": ids, "prompt_mask": prompt})
    return out


def collate(block_size=8, seed=0, feats=None):
    return DualStreamCollator(MASK_ID, PAD, block_size, generator=torch.Generator().manual_seed(seed))(
        feats or features()
    )


def test_layout_positions_labels_and_prompt():
    feats = features()
    batch = collate()
    width = 40
    assert batch["input_ids"].shape == (2, 80) and batch["attention_mask"].shape == (2, 1, 80, 80)
    for b, f in enumerate(feats):
        n = len(f["input_ids"])
        x0, xt = batch["input_ids"][b, :width], batch["input_ids"][b, width:]
        pos_xt = batch["position_ids"][b, width:]
        assert x0[:n].tolist() == f["input_ids"]
        assert batch["position_ids"][b, :width].tolist() == list(range(width))
        # Reordering keeps logical positions: xt is a permutation of 0..L-1 within each block.
        for start in range(0, width, 8):
            assert sorted(pos_xt[start : start + 8].tolist()) == list(range(start, min(start + 8, width)))
        masked = xt == MASK_ID
        real = pos_xt < n
        # Observed tokens keep their value at their logical position; masks carry the original token as label.
        assert torch.equal(xt[~masked & real], torch.tensor(f["input_ids"])[pos_xt[~masked & real]])
        labels = batch["labels"][b, width:]
        assert torch.equal(labels[masked], torch.tensor(f["input_ids"])[pos_xt[masked]])
        assert (labels[~masked] == -100).all()
        # Prompt tokens are never masked, and never an AR target.
        assert (pos_xt[masked] >= 5).all()
        assert (batch["labels"][b, :4] == -100).all() and batch["labels"][b, 4] == f["input_ids"][5]
        # Within a block: observed first (ascending), then masks (ascending).
        for start in range(0, width, 8):
            block_mask = masked[start : start + 8][real[start : start + 8]]
            assert block_mask.tolist() == sorted(block_mask.tolist())
        weights = batch["label_weights"][b]
        assert (weights[:width] == 0).all() and (weights[width:][masked] >= 1).all()
        assert (weights[width:][~masked] == 0).all()


def test_masking_ratio_varies_per_block():
    ratios = set()
    for seed in range(5):
        batch = collate(seed=seed)
        xt = batch["input_ids"][0, 40:]
        for start in range(8, 40, 8):
            ratios.add(int((xt[start : start + 8] == MASK_ID).sum()))
    assert len(ratios) >= 4


def reachable(mask: torch.Tensor) -> torch.Tensor:
    """Transitive closure of 'row i attends to row j' (what a multi-layer model lets a token influence)."""
    reach = mask.clone()
    while True:
        nxt = reach | (reach.float() @ reach.float() > 0)
        if torch.equal(nxt, reach):
            return reach
        reach = nxt


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("row", [3, 17, 45, 60])
def test_perturbing_a_token_changes_only_what_may_reach_it(attn, row):
    torch.manual_seed(0)
    model = WeDLMForCausalLM(tiny_config()).double().eval()
    model.set_attn_implementation(attn)
    batch = collate()
    logits = model(**batch).logits
    changed_batch = {k: v.clone() for k, v in batch.items()}
    changed_batch["input_ids"][0, row] = (changed_batch["input_ids"][0, row] + 1) % 90
    changed = (model(**changed_batch).logits[0] - logits[0]).abs().amax(-1) > 1e-9
    expected = reachable(batch["attention_mask"][0, 0])[:, row]
    assert torch.equal(changed, expected)
    if row < 40:  # a clean token: never its own block's prediction rows (that would leak the answer) ...
        block = row // 8
        assert not changed[40 + block * 8 : 40 + block * 8 + 8].any()
        assert changed[40 + (block + 1) * 8 :].all()  # ... but every prediction row of later blocks


def test_loss_halves_and_normalised_weights():
    torch.manual_seed(0)
    batch = collate()
    logits = torch.randn(2, 80, 96)
    total, ar, mlm = dual_stream_loss(logits, batch["labels"], batch["label_weights"])
    assert total == pytest.approx(float((ar + mlm) / 2))
    ce = torch.nn.functional.cross_entropy(
        logits.reshape(-1, 96), batch["labels"].reshape(-1), reduction="none", ignore_index=-100
    ).view(2, 80)
    x0 = batch["labels"][:, :40] != -100
    assert ar == pytest.approx(float(ce[:, :40][x0].mean()))
    w = batch["label_weights"][:, 40:]
    assert mlm == pytest.approx(float((ce[:, 40:] * w).sum() / w.sum()))
    # Normalised: scaling every weight leaves the masked loss unchanged.
    _, _, scaled = dual_stream_loss(logits, batch["labels"], batch["label_weights"] * 7.5)
    assert scaled == pytest.approx(float(mlm))


def test_model_returns_the_loss_and_learns_a_fixed_batch():
    torch.manual_seed(0)
    model = WeDLMForCausalLM(tiny_config())
    batch = collate()
    out = model(**batch)
    assert out.loss is not None and out.ar_loss is not None and out.mlm_loss is not None
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = out.loss.item()
    for _ in range(40):
        loss = model(**batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first


def test_collator_rejects_bad_input():
    with pytest.raises(ValueError, match="block_size"):
        DualStreamCollator(MASK_ID, PAD, block_size=0)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        DualStreamCollator(MASK_ID, PAD)([{"input_ids": [5]}])


def test_stock_trainer_trains_it_with_no_custom_loop(tmp_path):
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    model = WeDLMForCausalLM(tiny_config())
    collator = DualStreamCollator(MASK_ID, PAD, block_size=8, seed=0)
    data = [{"input_ids": f["input_ids"], "sample_index": i} for i, f in enumerate(features(lengths=(40,) * 8))]
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=30,
        per_device_train_batch_size=4,
        learning_rate=3e-3,
        logging_steps=5,
        report_to=[],
        remove_unused_columns=False,
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=collator)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 6 and losses[-1] < 0.7 * losses[0] and losses == sorted(losses, reverse=True)
