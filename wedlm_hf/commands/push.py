"""`wedlm-hf push`: its options; `wedlm_hf.hub.push` runs it."""

from .argument_types import existing_folder

NAME = "push"
HELP = "upload an export folder to the Hugging Face Hub"
RUNS = "hub.push:push_command"


def add_arguments(parser) -> None:
    parser.add_argument("folder", type=existing_folder, help="a folder written by `wedlm-hf export`")
    parser.add_argument("repo", help="NAME or ORG/NAME")
    parser.add_argument("--token", default=None, help="default: HF_TOKEN or the `hf auth login` token")
    parser.add_argument("--private", action="store_true", help="create the repository as private")
