"""`wedlm-hf ship-default`: its options; `wedlm_hf.data.shipped_model` runs it."""

from .argument_types import existing_folder

NAME = "ship-default"
HELP = "copy a trained checkpoint into the package as the shipped model"
RUNS = "data.shipped_model:ship_default_command"


def add_arguments(parser) -> None:
    parser.add_argument("source", type=existing_folder, help="the `final` folder of a `wedlm-hf train` run")
