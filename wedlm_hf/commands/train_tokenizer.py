"""`wedlm-hf train-tokenizer`: its options; `wedlm_hf.data.tokenizer_training` runs it."""

from .argument_types import positive_int

NAME = "train-tokenizer"
HELP = "train the byte-level BPE tokenizer of the shipped model"
RUNS = "data.tokenizer_training:train_tokenizer_command"


def add_arguments(parser) -> None:
    parser.add_argument("--data", default="offline-mix", choices=("offline-mix",), help="the tokenizer's corpus")
    parser.add_argument("--vocab-size", type=positive_int, default=4096, help="tokens in the vocabulary")
    parser.add_argument("--output", required=True, help="folder to save the tokenizer to")
