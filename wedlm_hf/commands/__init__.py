"""The `wedlm-hf` commands as the parser sees them: one module per command, each with its NAME, its HELP line, what
RUNS it (`module:function` under `wedlm_hf`, imported only when the command runs) and `add_arguments(parser)`, its
flags; `check(parser, args)`, where a command has one, refuses combinations of options after parsing.

These modules import only argparse-level code (no wing, no torch), so `wedlm-hf --help` answers at once; the
command's work lives in its wing. `argument_types` refuses bad values while parsing; `shared_options` holds the
flags several commands take alike.
"""

from . import (
    bench,
    bench_lossless,
    bench_serve,
    bench_step,
    bench_structured,
    card,
    convert,
    custom_generate,
    evaluate,
    export,
    generate,
    push,
    serve,
    ship_default,
    train,
    train_tokenizer,
)

# In the order `wedlm-hf --help` lists them.
COMMAND_MODULES = (
    generate,
    bench,
    bench_step,
    bench_lossless,
    bench_structured,
    train_tokenizer,
    train,
    evaluate,
    convert,
    export,
    card,
    ship_default,
    push,
    custom_generate,
    serve,
    bench_serve,
)

__all__ = ["COMMAND_MODULES"]
