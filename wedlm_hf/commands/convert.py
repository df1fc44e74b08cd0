"""`wedlm-hf convert`: its options; `wedlm_hf.training.conversion` runs it."""

from .argument_types import existing_folder
from .shared_options import add_overwrite

NAME = "convert"
HELP = "turn a local AR checkpoint (Qwen2, Qwen3, Llama) into a WeDLM checkpoint"
RUNS = "training.conversion:convert_command"


def add_arguments(parser) -> None:
    parser.add_argument("source", type=existing_folder, help="the AR checkpoint folder")
    parser.add_argument("destination", help="folder to write the WeDLM checkpoint to")
    parser.add_argument("--mask-token", default="<|mask|>", help="added to the tokenizer when it has no mask token")
    add_overwrite(parser)
