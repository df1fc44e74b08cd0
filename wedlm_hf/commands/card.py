"""`wedlm-hf card`: its options; `wedlm_hf.hub.export` runs it."""

from .argument_types import existing_folder
from .shared_options import add_card_recipe

NAME = "card"
HELP = "render a model card from a checkpoint's training and evaluation records"
RUNS = "hub.export:card_command"


def add_arguments(parser) -> None:
    parser.add_argument(
        "model",
        type=existing_folder,
        help="checkpoint folder (generation_config.json, training_info.json, eval_results.json)",
    )
    parser.add_argument("output", help="README.md to write")
    parser.add_argument("--repo-id", required=True, help="Hub name used in the usage example")
    parser.add_argument("--summary", default="A WeDLM model packaged by wedlm-hf.", help="one paragraph for the card")
    add_card_recipe(parser)
    parser.add_argument("--base-model", default=None, help="base_model in the card metadata (default: none)")
