"""`wedlm-hf export`: its options; `wedlm_hf.hub.export` runs it."""

from .argument_types import existing_folder, non_negative_int
from .shared_options import add_card_recipe, add_overwrite

NAME = "export"
HELP = "a Hub-ready folder (remote code, card) from a WeDLM checkpoint"
RUNS = "hub.export:export_command"


def add_arguments(parser) -> None:
    parser.add_argument("source", type=existing_folder, help="the WeDLM checkpoint folder")
    parser.add_argument("destination", help="folder to write the Hub-ready copy to")
    parser.add_argument(
        "--mask-token-id", type=non_negative_int, default=None, help="when the config gives none (default: from it)"
    )
    parser.add_argument("--repo-id", default=None, help="Hub name used in the card's usage example (default: none)")
    parser.add_argument("--base-model", default=None, help="base_model in the card metadata (default: none)")
    parser.add_argument("--summary", default=None, help="one paragraph for the card (default: a generic one)")
    add_card_recipe(parser)
    add_overwrite(parser)
