"""The `wedlm-hf` command: argument parsing and dispatch only; each sub-command's work lives in its wing.

Parsing imports neither torch nor transformers, so `--help` answers at once; a sub-command's module is imported
only when that command runs.

Error policy (`console`, the installed `wedlm-hf` script): a mistake in what the user typed or pointed at
(ValueError, OSError such as FileNotFoundError, an ImportError of a missing optional extra, an argparse error) is
ONE line on stderr, `wedlm-hf CMD: error: what is wrong and what to do`, and exit status 2 (arguments) or 1
(everything else); Ctrl-C is `wedlm-hf CMD: interrupted` and status 130. Any other exception is a bug and keeps its
traceback. `--debug` (or WEDLM_HF_DEBUG=1) shows the traceback of every error. `main(argv)`, for Python callers and
tests, raises as usual.
"""

import argparse
import importlib
import logging
import os
import sys

from .commands import COMMAND_MODULES
from .commands.serve import QUANTIZATIONS
from .commands.shared_options import DTYPES

DEBUG_ENV = "WEDLM_HF_DEBUG"

# Each sub-command's work lives in its wing; the module is imported only when its command runs.
COMMANDS = {command.NAME: command.RUNS for command in COMMAND_MODULES}
__all__ = ["COMMANDS", "DTYPES", "QUANTIZATIONS", "build_parser", "console", "main"]


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to every option, except where the help text already says what happens by default."""

    def _get_help_string(self, action):
        text = action.help or ""
        unstated = action.default is None or action.default is False or action.default is argparse.SUPPRESS
        if "default" in text or unstated or action.required:
            return text
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse errors as one line that points at --help, instead of the usage block. `check(parser, args)`, when
    set, refuses combinations of options after parsing, as argparse errors (one line, status 2)."""

    check = None

    def parse_known_args(self, args=None, namespace=None):
        namespace, rest = super().parse_known_args(args, namespace)
        if self.check is not None:
            self.check(self, namespace)
        return namespace, rest

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    """The `wedlm-hf` parser: one sub-parser per command, its flags added by the command's own module."""
    parser = _Parser(
        prog="wedlm-hf",
        description="WeDLM streaming parallel decoding for transformers",
        epilog=f"Errors are one line; --debug (or {DEBUG_ENV}=1) shows their traceback.",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help="show the full traceback of any error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMAND_MODULES:
        cmd = sub.add_parser(command.NAME, help=command.HELP, description=command.HELP, formatter_class=_HelpFormatter)
        # SUPPRESS: the sub-command leaves `args.debug` as the main parser set it unless --debug comes after it.
        cmd.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show error tracebacks")
        command.add_arguments(cmd)
        cmd.check = getattr(command, "check", None)
    return parser


# Loggers whose import-time warnings say nothing to a wedlm-hf user: transformers imports torchao whenever it is
# installed (the quantization extra), and torchao then reports each CUDA kernel library it cannot load on this
# machine and a torch deprecation of its own. Errors still show.
IMPORT_NOISE = ("torchao", "torch.utils._pytree")


def _run(command: str, args) -> None:
    for name in IMPORT_NOISE:
        logging.getLogger(name).setLevel(logging.ERROR)
    module, function = COMMANDS[command].split(":")
    getattr(importlib.import_module(f"{__package__}.{module}"), function)(args)


def main(argv: list[str] | None = None) -> None:
    """Parses `argv` and runs the command; errors raise (the `console` script turns them into one line)."""
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what a command that starts more processes passes on
    _run(args.command, args)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def console(argv: list[str] | None = None) -> int:
    """The installed `wedlm-hf` script: `main` with the error policy of this module's docstring."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    args.argv = list(argv)
    prog = f"wedlm-hf {args.command}"
    if args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        _run(args.command, args)
        return 0
    try:
        _run(args.command, args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, ImportError) as error:  # ImportError: an optional extra is not installed
        print(f"{prog}: error: {_one_line(error)}", file=sys.stderr)
        return 1
    except SystemExit as exit_:
        if isinstance(exit_.code, str):  # a wing's `raise SystemExit("message")`
            print(f"{prog}: error: {_one_line(exit_)}", file=sys.stderr)
            return 1
        raise
    return 0


if __name__ == "__main__":
    sys.exit(console())
