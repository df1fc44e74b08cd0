"""`wedlm-hf custom-generate`: its options; `wedlm_hf.hub.custom_generate` runs it."""

NAME = "custom-generate"
HELP = "write the decoding strategy as a Hub custom_generate repository"
RUNS = "hub.custom_generate:custom_generate_command"


def add_arguments(parser) -> None:
    parser.add_argument("destination", help="folder to write the repository to")
    parser.add_argument("--repo-id", default="wedlm-hf/wedlm-decoding", help="Hub name used in its README")
