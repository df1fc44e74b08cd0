"""Training a small byte-level BPE tokenizer with end-of-text and mask tokens, for models trained from scratch.

Digits are split one by one before BPE, so numbers tokenize the same way wherever they appear (counting and
arithmetic stay learnable for a small model).
"""

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|mask|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096) -> PreTrainedTokenizerFast:
    """A fast tokenizer whose eos (also used as pad) is `<|endoftext|>` and whose mask token is `<|mask|>`."""
    if vocab_size < 300:
        raise ValueError(f"vocab_size must leave room for the 256 byte tokens and merges, got {vocab_size}.")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, MASK_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        mask_token=MASK_TOKEN,
        padding_side="left",
    )


def train_tokenizer_command(args) -> None:
    """`wedlm-hf train-tokenizer`: the shipped model's tokenizer, trained on the offline mix."""
    from .offline_mix import tokenizer_corpus

    if args.data != "offline-mix":
        raise SystemExit("--data: only 'offline-mix' is built in; train other tokenizers with `tokenizers` directly.")
    train_tokenizer(tokenizer_corpus(), vocab_size=args.vocab_size).save_pretrained(args.output)
    print(f"tokenizer saved to {args.output}")
