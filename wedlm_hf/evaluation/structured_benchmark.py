"""`wedlm-hf bench-structured`: WeDLM decoding under a JSON schema against AR `generate()` with the same grammar's
logits processor, on records with fixed keys and short values (docs/structured-output.md).

Each (schema, prompt) pair goes through every decoder in one process, interleaved (the order rotates each repeat)
and timed best of `repeats`. Before any timing, lossless + grammar is checked against AR + processor token for
token, and every output against its grammar (it must parse as JSON and be complete). The table says where the
committed tokens came from: forced by the grammar, chosen among its allowed tokens, or the model's own fills.
"""

import json

import torch
from transformers import AutoTokenizer

from ..data import default_model_path
from ..modeling import WeDLMForCausalLM
from ..structured import GrammarLogitsProcessor, compile_grammar
from .bench_report import (
    Column,
    best_of,
    plural,
    ratio_column,
    ratio_line,
    shipped_or_path,
    table_head,
    table_row,
    write_json,
)
from .compiled_forward import compiled_forward, swapped_in
from .interleaved_runs import interleave


def _record(properties: dict) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


SCHEMAS = {
    "person": _record(
        {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "email": {"type": "string", "maxLength": 24},
            "active": {"type": "boolean"},
        }
    ),
    "symbol": _record(
        {
            "module": {"enum": ["os", "sys", "json", "re", "collections"]},
            "function": {"type": "string", "maxLength": 16},
            "line": {"type": "integer", "minimum": 1, "maximum": 9999},
            "deprecated": {"type": "boolean"},
        }
    ),
    "point": _record(
        {
            "position": _record({"x": {"type": "integer", "maximum": 999}, "y": {"type": "integer", "maximum": 999}}),
            "label": {"type": "string", "maxLength": 8},
            "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        }
    ),
    "response": _record(
        {
            "status": {"enum": ["ok", "error"]},
            "code": {"type": "integer", "minimum": 100, "maximum": 599},
            "message": {"type": "string", "maxLength": 24},
        }
    ),
}
PROMPTS = ["record = ", "def load(path):\n    data = ", "# one entry per line\nentry = "]
# name -> generate() arguments beside the grammar; W = 4 as well as the default 16: under a grammar most tokens are
# forced, and on a CPU every mask fed costs (docs/benchmarks.md says how much).
DECODERS = {
    "AR + processor": {},
    "WeDLM + grammar": dict(strategy="wedlm"),
    "WeDLM + grammar W=4": dict(strategy="wedlm", wedlm_window_size=4),
    "lossless + grammar": dict(strategy="wedlm", wedlm_lossless=True),
}
# With `compiled` (the default): the fastest AR a user has, on the static cache under torch.compile(model.forward),
# and WeDLM the same way.
COMPILED_DECODERS = {
    "AR + processor, compiled": dict(cache_implementation="static"),
    "WeDLM W=4, compiled": dict(strategy="wedlm", wedlm_window_size=4, cache_implementation="static"),
}


class _GrammarDecoders:
    """The decoders of one run: `decode(name, schema_name, prompt)` runs one under that schema's grammar (AR with
    the grammar's logits processor, WeDLM with `grammar=`), a compiled one with the compiled forward swapped in."""

    def __init__(self, model, tokenizer, new_tokens: int, compiled: bool, backend: str):
        self.model, self.tokenizer, self.new_tokens = model, tokenizer, new_tokens
        self.decoders = {**DECODERS, **(COMPILED_DECODERS if compiled else {})}
        self.compiled = compiled
        self.compiled_call = compiled_forward(model, backend) if compiled else None

    def decode(self, name: str, schema_name: str, prompt: str):
        """The generated tokens and the WeDLM stats (None for AR)."""
        schema = SCHEMAS[schema_name]
        ids = self.tokenizer(prompt, return_tensors="pt").input_ids
        common = dict(max_new_tokens=self.new_tokens, return_dict_in_generate=True)
        fast = name in COMPILED_DECODERS
        with swapped_in(self.model, self.compiled_call, fast):
            extra = dict(disable_compile=True) if fast else {}
            if name.startswith("AR"):
                processor = GrammarLogitsProcessor(schema, self.tokenizer, vocab_size=self.model.config.vocab_size)
                extra.update(do_sample=False, logits_processor=[processor])
            else:
                extra.update(grammar=schema, tokenizer=self.tokenizer)
            out = self.model.generate(ids, **self.decoders[name], **extra, **common)
        stats = getattr(out, "wedlm_stats", None)
        return out.sequences[0, ids.shape[1] :].tolist(), stats[0] if stats else None


def run_structured_benchmark(
    model_path: str,
    new_tokens: int = 96,
    repeats: int = 3,
    threads: int = 1,
    compiled: bool = True,
    compile_backend: str = "inductor",
    log=print,
):
    """`compiled`: also the COMPILED_DECODERS, with torch.compile's `compile_backend` ("eager": the plumbing only);
    the untimed check pass is their warm-up, so compilation is never timed."""
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = WeDLMForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    items = [(name, prompt) for name in SCHEMAS for prompt in PROMPTS]
    decoders = _GrammarDecoders(model, tokenizer, new_tokens, compiled, compile_backend)
    outputs, mismatches, invalid = _check(decoders, items, log)

    def timed_run(name: str):
        return lambda item: decoders.decode(name, *item)

    timings = interleave({name: timed_run(name) for name in decoders.decoders}, repeats, cases=items)
    rows = _rows(list(decoders.decoders), items, outputs, timings)
    used = torch.get_num_threads()
    log(
        f"model: {shipped_or_path(model_path)}, cpu float32, {plural(used, 'thread')}; {len(SCHEMAS)} schemas x "
        f"{len(PROMPTS)} prompts, at most {new_tokens} new tokens (eos stops), {best_of(repeats)}; grammar: llguidance"
    )
    _log_report(log, rows, compile_backend if compiled else None, len(mismatches), len(invalid))
    return dict(
        settings=dict(
            new_tokens=new_tokens, repeats=repeats, threads=used, compiled=compile_backend if compiled else None
        ),
        decoders=rows,
        mismatches=[list(m) for m in mismatches],
        invalid=[list(i) for i in invalid],
    )


def _check(decoders: _GrammarDecoders, items: list, log) -> tuple[dict, list, list]:
    """Every decoder on every item once, untimed (the compiled ones' warm-up): (item, decoder) -> (tokens, stats);
    the outputs that should be AR + processor's and are not; the outputs that are no complete match of the schema."""
    tokenizer, vocab = decoders.tokenizer, decoders.model.config.vocab_size
    outputs, mismatches, invalid = {}, [], []
    for item in items:
        for decoder in decoders.decoders:
            outputs[item, decoder] = decoders.decode(decoder, *item)
            tokens = outputs[item, decoder][0]
            if not _complete(tokens, tokenizer, SCHEMAS[item[0]], vocab):
                invalid.append((decoder, *item))
                log(f"!!! {decoder} on {item}: not a complete match of the schema: {tokenizer.decode(tokens)!r}")
        for name in ("lossless + grammar", *(["AR + processor, compiled"] if decoders.compiled else [])):
            if outputs[item, name][0] != outputs[item, "AR + processor"][0]:
                mismatches.append((name, *item))
                log(f"!!! MISMATCH: {name} differs from AR + processor on {item}")
    return outputs, mismatches, invalid


def _rows(names: list, items: list, outputs: dict, timings) -> dict:
    """decoder -> its tokens, forwards and best tokens/s over every item, its tokens by source (WeDLM decoders),
    and its speed against AR + processor (and against it compiled, where that ran)."""
    rows = {}
    for decoder in names:
        tokens = sum(len(outputs[item, decoder][0]) for item in items)
        seconds = sum(timings.best((item, decoder)) for item in items)
        stats = [outputs[item, decoder][1] for item in items]
        row = dict(tokens=tokens, seconds=seconds, tokens_per_s=tokens / seconds, forwards=tokens)
        if stats[0] is not None:
            forced = sum(s.forced_tokens for s in stats)
            constrained = sum(s.constrained_tokens for s in stats)
            row.update(forwards=sum(s.forwards for s in stats), forced=forced, constrained=constrained)
            row["model"] = tokens - forced - constrained
        row["tokens_per_forward"] = tokens / row["forwards"]
        rows[decoder] = row
    ar = rows["AR + processor"]["tokens_per_s"]
    fastest = rows["AR + processor, compiled"]["tokens_per_s"] if "AR + processor, compiled" in rows else None
    for decoder in names:
        rows[decoder]["vs_ar"] = rows[decoder]["tokens_per_s"] / ar
        if fastest:
            rows[decoder]["vs_ar_compiled"] = rows[decoder]["tokens_per_s"] / fastest
    return rows


def _log_report(log, rows: dict, backend: str | None, mismatches: int, invalid: int) -> None:
    """The table, the ratio and the legend, then the verdict of the check pass; `backend`: torch.compile's, where the
    compiled decoders ran."""
    log(format_table(rows))
    if backend is not None:
        log(
            "compiled: cache_implementation='static' with torch.compile(model.forward) (backend "
            f"{backend!r}); vs ARc = tokens/s against AR + processor, compiled"
        )
    both = f"; both compiled: {rows['WeDLM W=4, compiled']['vs_ar_compiled']:.2f}x" if backend is not None else ""
    log(ratio_line("WeDLM + grammar W=4 / AR + processor tokens/s", rows["WeDLM + grammar W=4"]["vs_ar"], both))
    log(
        "tokens by source: forced = filled by the grammar without the model, constrained = the model's choice among "
        "the grammar's allowed tokens (default mode: the slot after the committed text, and confident slots after "
        "it), model = the model's own fills (lossless: every AR token, each verified draft included)"
    )
    if mismatches or invalid:
        log(f"!!! {mismatches} mismatch(es) with AR + processor, {invalid} incomplete output(s)")
    else:
        same = "lossless + grammar" + (" and AR + processor, compiled," if backend is not None else "")
        log(f"{same} identical to AR + processor on every prompt; every output a complete match")


def _complete(tokens: list[int], tokenizer, schema: dict, vocab: int) -> bool:
    """The output ends with the stop token where its grammar is complete, and parses as JSON."""
    if tokenizer.eos_token_id not in tokens:
        return False
    body = tokens[: tokens.index(tokenizer.eos_token_id)]
    state = compile_grammar(schema, tokenizer, vocab).matcher()
    if state.accepted(body) != len(body):
        return False
    state.advance(body)
    try:
        json.loads(tokenizer.decode(body))
    except ValueError:
        return False
    return state.accepting()


def _columns(compiled: bool) -> list[Column]:
    """The table's columns; "vs ARc" where the compiled AR ran. Rows of AR decoders end before the token sources."""
    columns = [Column("decoder", 26, align="<"), Column("tokens", 7), Column("forwards", 9)]
    columns += [Column("tok/fwd", 8, ".2f"), Column("tok/s", 8, ".0f"), ratio_column("vs AR", 7)]
    columns += [ratio_column("vs ARc", 8)] if compiled else []
    return columns + [Column("forced", 8), Column("constr.", 8), Column("model", 7)]


def format_table(rows: dict) -> str:
    compiled = "vs_ar_compiled" in next(iter(rows.values()))
    columns = _columns(compiled)
    lines = [table_head(columns)]
    for decoder, r in rows.items():
        values = [decoder, r["tokens"], r["forwards"], r["tokens_per_forward"], r["tokens_per_s"], r["vs_ar"]]
        values += [r["vs_ar_compiled"]] if compiled else []
        values += [r["forced"], r["constrained"], r["model"]] if "forced" in r else []
        lines.append(table_row(columns, values))
    return "\n".join(lines)


def bench_structured_command(args) -> None:
    """`wedlm-hf bench-structured`."""
    report = run_structured_benchmark(
        args.model or default_model_path(),
        new_tokens=args.new_tokens,
        repeats=args.repeats,
        threads=args.threads,
        compiled=not args.no_compile,
    )
    write_json(args.json, report)
    if report["mismatches"] or report["invalid"]:
        raise SystemExit("structured output check failed (see the lines marked !!!)")
