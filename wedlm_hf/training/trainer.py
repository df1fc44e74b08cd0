"""`wedlm-hf train`: dual-stream training with the stock transformers Trainer.

The model computes the WeDLM loss itself from a `DualStreamCollator` batch, so Trainer needs no custom loop; the
small subclass here adds the two halves of the loss (ar_loss, mlm_loss) to the periodic logs and makes checkpoints
appear whole (`checkpoints.py`), so `--resume` after a crash continues from the newest complete one. Progress bar,
seeding and multi-process runs (`accelerate launch`) are Trainer's own. Options that make no sense (0 steps, a
negative learning rate, ...) and malformed data files are refused before anything is loaded, naming what to fix.
"""

import json
import math
import os
import shutil
from pathlib import Path

import torch
import transformers
from torch.utils.data import Dataset
from transformers import AutoTokenizer, Trainer, TrainerCallback, TrainingArguments, set_seed
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..data import offline_mix, portable_path
from ..modeling import WeDLMConfig, WeDLMForCausalLM
from .checkpoints import FINAL_STAGING, STAGING, last_complete_checkpoint, publish, remove_crash_leftovers, rotate
from .dual_stream_collator import DualStreamCollator

RECORD_KEYS = ({"text"}, {"prompt", "completion"})  # the two shapes of a .jsonl training record


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
        self._staging = False
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

    def _get_output_dir(self, trial) -> str:
        run_dir = super()._get_output_dir(trial)
        return os.path.join(run_dir, STAGING) if self._staging else run_dir

    def _save_checkpoint(self, model, trial) -> None:
        """Trainer's own save, redirected into the staging folder; then one rename publishes `checkpoint-N`."""
        run_dir = Path(self._get_output_dir(trial))
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        self._staging = True
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._staging = False
        self.accelerator.wait_for_everyone()  # every process has written its RNG state into the staged folder
        if self.args.should_save:
            publish(run_dir / STAGING / name, run_dir / name)
            rotate(run_dir, self.args.save_total_limit)
            shutil.rmtree(run_dir / STAGING, ignore_errors=True)
        self.accelerator.wait_for_everyone()


def check_options(
    max_steps: int,
    batch_size: int,
    grad_accum: int,
    seq_len: int,
    block_size: int,
    save_steps: int,
    logging_steps: int,
    items_per_family: int,
    learning_rate: float,
    warmup_ratio: float,
    weight_decay: float,
) -> None:
    """Refuses option values Trainer would silently reinterpret (`max_steps` 0 trains one step, -1 three epochs)
    or that cannot train at all; the message names every bad option."""
    problems = [
        f"{option} must be at least 1 (got {value})"
        for option, value in (
            ("--max-steps", max_steps),
            ("--batch-size", batch_size),
            ("--grad-accum", grad_accum),
            ("--block-size", block_size),
            ("--save-steps", save_steps),
            ("--logging-steps", logging_steps),
            ("--items-per-family", items_per_family),
        )
        if value < 1
    ]
    if seq_len < 2:
        problems.append(f"--seq-len must be at least 2 tokens (got {seq_len}): a sample predicts its next token")
    if not (learning_rate > 0 and math.isfinite(learning_rate)):
        problems.append(f"--lr must be a positive number (got {learning_rate})")
    if not 0 <= warmup_ratio < 1:
        problems.append(f"--warmup-ratio is a share of --max-steps in [0, 1) (got {warmup_ratio})")
    if not (weight_decay >= 0 and math.isfinite(weight_decay)):
        problems.append(f"--weight-decay must be 0 or more (got {weight_decay})")
    if problems:
        raise ValueError("wedlm-hf train: " + "; ".join(problems) + ".")


def _local(option: str, path: str, what: str) -> str:
    if not Path(path).exists():
        raise FileNotFoundError(f"{option} {path}: no such {what}; give the path of a local {what}.")
    return path


def load_model_and_tokenizer(model: str | None, config: str | None, tokenizer: str | None):
    """A WeDLM checkpoint (`model`), or a new model from a config JSON (`config`) sized to `tokenizer`."""
    if (model is None) == (config is None):
        raise ValueError("Pass exactly one of --model (a WeDLM checkpoint) or --config (a config JSON, from scratch).")
    if model is not None:
        _local("--model", model, "checkpoint folder")
    else:
        _local("--config", config, "config JSON file")
        if tokenizer is None:
            raise ValueError("--config trains from scratch and needs --tokenizer FOLDER (e.g. from train-tokenizer).")
    if tokenizer is not None:
        _local("--tokenizer", tokenizer, "tokenizer folder")
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


def check_data_paths(paths: list[str]) -> None:
    """`offline-mix` alone, or existing .txt / .jsonl files."""
    if "offline-mix" in paths and len(paths) > 1:
        raise ValueError("--data offline-mix is the whole built-in mix: do not combine it with files.")
    if paths == ["offline-mix"]:
        return
    for path in map(Path, paths):
        if path.suffix not in (".txt", ".jsonl"):
            raise ValueError(f"--data {path}: use .txt or .jsonl files (or 'offline-mix').")
        if not path.is_file():
            raise FileNotFoundError(f"--data {path}: no such file; give existing .txt or .jsonl files.")


def read_records(path: Path) -> list[tuple[int, dict]]:
    """(line number, record) of a .jsonl file; a malformed line or record is an error naming file and line."""
    records = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"{path}, line {number}, column {error.colno}: not valid JSON ({error.msg}); each line of a "
                    ".jsonl file must be one JSON object."
                ) from None
            where = f"{path}, line {number}"
            if not isinstance(record, dict):
                raise ValueError(f"{where}: a record is a JSON object, got {type(record).__name__}.")
            keys = set(record)
            if keys not in RECORD_KEYS:
                unknown = sorted(keys - set().union(*RECORD_KEYS))
                found = f"unknown key(s) {', '.join(unknown)}" if unknown else f"keys {', '.join(sorted(keys))}"
                raise ValueError(
                    f'{where}: {found}; a record is {{"text": ...}} or {{"prompt": ..., "completion": ...}}.'
                )
            for key, value in record.items():
                if not isinstance(value, str):
                    raise ValueError(f'{where}: "{key}" must be a string, got {type(value).__name__}.')
            records.append((number, record))
    return records


def load_texts(paths: list[str], tokenizer, seq_len: int, log=print) -> list[dict]:
    """Samples from .txt files (one document each) and .jsonl files ({"text"} or {"prompt", "completion"})."""
    check_data_paths(paths)
    samples, short = [], []
    for path in map(Path, paths):
        records = read_records(path) if path.suffix == ".jsonl" else [(None, {"text": path.read_text()})]
        for number, record in records:
            prompt = tokenizer(record.get("prompt", ""), add_special_tokens=False)["input_ids"]
            body = tokenizer(record.get("completion", record.get("text", "")), add_special_tokens=False)["input_ids"]
            ids = (prompt + body + [tokenizer.eos_token_id])[:seq_len]
            if len(ids) >= 2:
                samples.append({"input_ids": ids, "prompt_mask": ([1] * len(prompt) + [0] * len(ids))[: len(ids)]})
            else:
                short.append(f"{path}" + (f", line {number}" if number else ""))
    if short:
        log(f"skipped {len(short)} empty record(s) (under 2 tokens with the end token): {', '.join(short[:5])}")
    if not samples:
        raise ValueError(f"--data {' '.join(paths)}: no samples of at least 2 tokens.")
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
    options = dict(locals())
    arguments = _portable_arguments(dict(options))
    check_options(
        max_steps=max_steps,
        batch_size=batch_size,
        grad_accum=grad_accum,
        seq_len=seq_len,
        block_size=block_size,
        save_steps=save_steps,
        logging_steps=logging_steps,
        items_per_family=items_per_family,
        learning_rate=learning_rate,
        warmup_ratio=warmup_ratio,
        weight_decay=weight_decay,
    )
    check_data_paths(data)
    final = Path(output_dir) / "final"
    if resume and _finished(final, max_steps):
        print(f"{final} already holds the finished run of {max_steps} steps; nothing to resume.")
        return final
    set_seed(seed)
    net, tok = load_model_and_tokenizer(model, config, tokenizer)
    net.config._attn_implementation = attn_implementation
    if seq_len > net.config.max_position_embeddings:
        raise ValueError(
            f"--seq-len {seq_len} exceeds the model's max_position_embeddings ({net.config.max_position_embeddings}):"
            " use a shorter --seq-len."
        )
    dataset = offline_mix(tok, seq_len, items_per_family) if data == ["offline-mix"] else load_texts(data, tok, seq_len)
    collator = DualStreamCollator(
        mask_token_id=net.config.mask_token_id, pad_token_id=tok.pad_token_id, block_size=block_size, seed=seed
    )
    trainer = WeDLMTrainer(
        model=net,
        args=_training_arguments(options),
        train_dataset=IndexedSamples(dataset),
        data_collator=collator,
        callbacks=[MaskingEpoch(collator)],
    )
    checkpoint = last_complete_checkpoint(output_dir) if resume else None
    trainer.accelerator.wait_for_everyone()  # every process chose before leftovers are removed
    if trainer.is_world_process_zero():
        remove_crash_leftovers(output_dir, checkpoint)
    trainer.accelerator.wait_for_everyone()
    result = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    if trainer.is_world_process_zero():
        trainer.save_state()
        info = _training_info(trainer, arguments, len(dataset), result, checkpoint is not None, model)
        _save_final(trainer, tok, Path(output_dir), info)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        trainer.accelerator.wait_for_everyone()
    return final


def _portable_arguments(arguments: dict) -> dict:
    """`train()`'s arguments as the record keeps them: it travels with the model (into the package, onto the Hub),
    so paths are kept machine-independent."""
    for key in ("output_dir", "model", "config", "tokenizer"):
        arguments[key] = portable_path(arguments[key])
    data = arguments["data"]
    arguments["data"] = data if data == ["offline-mix"] else [portable_path(path) for path in data]
    return arguments


def _finished(final: Path, max_steps: int) -> bool:
    """`final` holds a finished run of `max_steps` steps (a resume has nothing left to do)."""
    record = final / "training_info.json"
    return record.exists() and json.loads(record.read_text())["arguments"]["max_steps"] == max_steps


def _training_arguments(options: dict) -> TrainingArguments:
    """Trainer's settings from `train()`'s `options`: AdamW with a cosine schedule, seeded, Trainer's own
    checkpoints every `save_steps` (two kept), on the CPU when there is no GPU."""
    return TrainingArguments(
        output_dir=options["output_dir"],
        max_steps=options["max_steps"],
        per_device_train_batch_size=options["batch_size"],
        gradient_accumulation_steps=options["grad_accum"],
        learning_rate=options["learning_rate"],
        lr_scheduler_type="cosine",
        warmup_steps=options["warmup_ratio"],  # a float below 1 is a ratio of max_steps
        weight_decay=options["weight_decay"],
        max_grad_norm=1.0,
        optim="adamw_torch",
        logging_steps=options["logging_steps"],
        save_steps=options["save_steps"],
        save_total_limit=2,
        seed=options["seed"],
        data_seed=options["seed"],
        report_to=[],
        remove_unused_columns=False,
        dataloader_num_workers=0,
        use_cpu=not torch.cuda.is_available(),
        ddp_find_unused_parameters=False,
        # Trainer copies this into the model's config, which every checkpoint saves; its default (False) would ship
        # checkpoints that exporters refuse. The dual-stream forward never builds a cache either way.
        use_cache=True,
    )


def _training_info(trainer, arguments: dict, samples: int, result, resumed: bool, model: str | None) -> dict:
    """`training_info.json`: how the model was trained, and the record of the checkpoint (`model`, a folder) it
    continued from."""
    losses = [entry for entry in trainer.state.log_history if "loss" in entry]
    info = {
        "arguments": arguments,
        "samples": samples,
        "parameters": sum(p.numel() for p in trainer.model.parameters()),
        "processes": trainer.args.world_size,
        "train_runtime_s": result.metrics.get("train_runtime"),
        "resumed": resumed,
        "last_logged": losses[-1] if losses else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    previous = Path(model) / "training_info.json" if model else None
    if previous is not None and previous.exists():
        info["continued_from"] = json.loads(previous.read_text())
    return info


def _save_final(trainer, tok, output_dir: Path, info: dict) -> None:
    """The final model, its tokenizer and `info`, written to a staging folder and published as `final` whole, like
    the checkpoints."""
    staged = output_dir / FINAL_STAGING
    shutil.rmtree(staged, ignore_errors=True)
    trainer.save_model(str(staged))
    tok.save_pretrained(staged)
    (staged / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")
    publish(staged, output_dir / "final")


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
