"""`wedlm-hf train`: dual-stream training with the stock transformers Trainer.

The model computes the WeDLM loss itself from a `DualStreamCollator` batch, so Trainer needs no custom loop; the
small subclass here only adds the two halves of the loss (ar_loss, mlm_loss) to the periodic logs. Progress bar,
checkpoints, resume, seeding and multi-process runs (`accelerate launch`) are Trainer's own.
"""

import json
import os
from pathlib import Path

import torch
import transformers
from torch.utils.data import Dataset
from transformers import AutoTokenizer, Trainer, TrainerCallback, TrainingArguments, set_seed

from ..data import offline_mix
from ..modeling import WeDLMConfig, WeDLMForCausalLM
from .dual_stream_collator import DualStreamCollator


class IndexedSamples(Dataset):
    """Samples that carry their index, so the collator can draw each sample's masking from its own seed."""

    def __init__(self, samples: list[dict]):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict:
        return {**self.samples[index], "sample_index": index}


class MaskingEpoch(TrainerCallback):
    """Tells the collator which epoch it is masking for (fresh masks each epoch, same ones after a resume)."""

    def __init__(self, collator: DualStreamCollator):
        self.collator = collator

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.collator.epoch = int(state.epoch or 0)


class WeDLMTrainer(Trainer):
    """Trainer that also logs the next-token (ar_loss) and masked (mlm_loss) halves of the WeDLM loss."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._parts: list[tuple[float, float]] = []

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        if outputs.get("ar_loss") is not None:
            self._parts.append((float(outputs["ar_loss"]), float(outputs["mlm_loss"])))
        return (outputs["loss"], outputs) if return_outputs else outputs["loss"]

    def log(self, logs: dict, *args, **kwargs) -> None:
        if "loss" in logs and self._parts:
            logs["ar_loss"] = round(sum(p[0] for p in self._parts) / len(self._parts), 4)
            logs["mlm_loss"] = round(sum(p[1] for p in self._parts) / len(self._parts), 4)
            self._parts.clear()
        super().log(logs, *args, **kwargs)


def load_model_and_tokenizer(model: str | None, config: str | None, tokenizer: str | None):
    """A WeDLM checkpoint (`model`), or a new model from a config JSON (`config`) sized to `tokenizer`."""
    if (model is None) == (config is None):
        raise ValueError("Pass exactly one of --model (a WeDLM checkpoint) or --config (a config JSON, from scratch).")
    tok = AutoTokenizer.from_pretrained(tokenizer or model)
    if tok.mask_token_id is None:
        raise ValueError(
            "The tokenizer has no mask token: convert the checkpoint first (`wedlm-hf convert`), which adds one."
        )
    if model is not None:
        return WeDLMForCausalLM.from_pretrained(model, dtype=torch.float32), tok
    values = json.loads(Path(config).read_text())
    values.update(
        vocab_size=len(tok),
        mask_token_id=tok.mask_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
    )
    return WeDLMForCausalLM(WeDLMConfig(**values)), tok


def load_texts(paths: list[str], tokenizer, seq_len: int) -> list[dict]:
    """Samples from .txt files (one document each) and .jsonl files ({"text"} or {"prompt", "completion"})."""
    samples = []
    for path in map(Path, paths):
        if path.suffix == ".jsonl":
            records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        elif path.suffix == ".txt":
            records = [{"text": path.read_text()}]
        else:
            raise ValueError(f"--data {path}: use .txt or .jsonl files (or 'offline-mix').")
        for record in records:
            prompt = tokenizer(record.get("prompt", ""), add_special_tokens=False)["input_ids"]
            body = tokenizer(record.get("completion", record.get("text", "")), add_special_tokens=False)["input_ids"]
            ids = (prompt + body + [tokenizer.eos_token_id])[:seq_len]
            if len(ids) >= 2:
                samples.append({"input_ids": ids, "prompt_mask": ([1] * len(prompt) + [0] * len(ids))[: len(ids)]})
    if not samples:
        raise ValueError(f"--data {paths}: no samples of at least 2 tokens.")
    return samples


def train(
    output_dir: str,
    data: list[str],
    model: str | None = None,
    config: str | None = None,
    tokenizer: str | None = None,
    seq_len: int = 128,
    block_size: int = 32,
    batch_size: int = 8,
    grad_accum: int = 1,
    max_steps: int = 1000,
    learning_rate: float = 3e-6,
    warmup_ratio: float = 0.1,
    weight_decay: float = 0.0,
    logging_steps: int = 10,
    save_steps: int = 200,
    seed: int = 0,
    items_per_family: int = 20000,
    resume: bool = False,
    attn_implementation: str = "sdpa",
) -> Path:
    """Runs training; returns the folder of the final model (with tokenizer and `training_info.json`)."""
    arguments = {k: v for k, v in locals().items()}
    final = Path(output_dir) / "final"
    if resume and (final / "training_info.json").exists():
        done = json.loads((final / "training_info.json").read_text())["arguments"]
        if done["max_steps"] == max_steps:
            print(f"{final} already holds the finished run of {max_steps} steps; nothing to resume.")
            return final
    set_seed(seed)
    net, tok = load_model_and_tokenizer(model, config, tokenizer)
    net.config._attn_implementation = attn_implementation
    if data == ["offline-mix"]:
        dataset = offline_mix(tok, seq_len, items_per_family)
    else:
        dataset = load_texts(data, tok, seq_len)
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=max_steps,
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=grad_accum,
        learning_rate=learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=warmup_ratio,  # a float below 1 is a ratio of max_steps
        weight_decay=weight_decay,
        max_grad_norm=1.0,
        optim="adamw_torch",
        logging_steps=logging_steps,
        save_steps=save_steps,
        save_total_limit=2,
        seed=seed,
        data_seed=seed,
        report_to=[],
        remove_unused_columns=False,
        dataloader_num_workers=0,
        use_cpu=not torch.cuda.is_available(),
        ddp_find_unused_parameters=False,
    )
    collator = DualStreamCollator(
        mask_token_id=net.config.mask_token_id, pad_token_id=tok.pad_token_id, block_size=block_size, seed=seed
    )
    trainer = WeDLMTrainer(
        model=net,
        args=args,
        train_dataset=IndexedSamples(dataset),
        data_collator=collator,
        callbacks=[MaskingEpoch(collator)],
    )
    has_checkpoint = resume and any(p.name.startswith("checkpoint-") for p in Path(output_dir).glob("checkpoint-*"))
    result = trainer.train(resume_from_checkpoint=True if has_checkpoint else None)
    if trainer.is_world_process_zero():
        trainer.save_state()
        trainer.save_model(str(final))
        tok.save_pretrained(final)
        losses = [entry for entry in trainer.state.log_history if "loss" in entry]
        info = {
            "arguments": arguments,
            "samples": len(dataset),
            "parameters": sum(p.numel() for p in net.parameters()),
            "processes": trainer.args.world_size,
            "train_runtime_s": result.metrics.get("train_runtime"),
            "resumed": bool(has_checkpoint),
            "last_logged": losses[-1] if losses else None,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        }
        previous = Path(model) / "training_info.json" if model else None
        if previous is not None and previous.exists():
            info["continued_from"] = json.loads(previous.read_text())
        (final / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        trainer.accelerator.wait_for_everyone()
    return final


def train_command(args) -> None:
    """`wedlm-hf train`: the command-line options map one to one onto `train()`."""
    final = train(
        output_dir=args.output_dir,
        data=args.data,
        model=args.model,
        config=args.config,
        tokenizer=args.tokenizer,
        seq_len=args.seq_len,
        block_size=args.block_size,
        batch_size=args.batch_size,
        grad_accum=args.grad_accum,
        max_steps=args.max_steps,
        learning_rate=args.lr,
        warmup_ratio=args.warmup_ratio,
        weight_decay=args.weight_decay,
        logging_steps=args.logging_steps,
        save_steps=args.save_steps,
        seed=args.seed,
        items_per_family=args.items_per_family,
        resume=args.resume,
        attn_implementation=args.attn_implementation,
    )
    if os.environ.get("RANK", "0") == "0":  # once, from the main process of an `accelerate launch` run
        print(f"final model: {final}")
