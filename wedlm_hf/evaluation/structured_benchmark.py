"""`wedlm-hf bench-structured`: WeDLM decoding under a JSON schema against AR `generate()` with the same grammar's
logits processor, on records with fixed keys and short values (docs/structured-output.md).

Each (schema, prompt) pair goes through every decoder in one process, interleaved (the order rotates each repeat)
and timed best of `repeats`. Before any timing, lossless + grammar is checked against AR + processor token for
token, and every output against its grammar (it must parse as JSON and be complete). The table says where the
committed tokens came from: forced by the grammar, chosen among its allowed tokens, or the model's own fills.
"""

import contextlib
import json
import time

import torch
from transformers import AutoTokenizer

from ..data import default_model_path
from ..modeling import WeDLMForCausalLM
from ..structured import GrammarLogitsProcessor, compile_grammar
from .benchmark import compiled_forward, swapped_forward


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
    vocab = model.config.vocab_size
    items = [(name, prompt) for name in SCHEMAS for prompt in PROMPTS]
    decoders = {**DECODERS, **(COMPILED_DECODERS if compiled else {})}
    compiled_call = compiled_forward(model, compile_backend) if compiled else None

    def decode(decoder: str, schema_name: str, prompt: str):
        schema = SCHEMAS[schema_name]
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        common = dict(max_new_tokens=new_tokens, return_dict_in_generate=True)
        fast = decoder in COMPILED_DECODERS
        with swapped_forward(model, compiled_call) if fast else contextlib.nullcontext():
            extra = dict(disable_compile=True) if fast else {}
            if decoder.startswith("AR"):
                processor = GrammarLogitsProcessor(schema, tokenizer, vocab_size=vocab)
                extra.update(do_sample=False, logits_processor=[processor])
            else:
                extra.update(grammar=schema, tokenizer=tokenizer)
            out = model.generate(ids, **decoders[decoder], **extra, **common)
        stats = getattr(out, "wedlm_stats", None)
        return out.sequences[0, ids.shape[1] :].tolist(), stats[0] if stats else None

    outputs, mismatches, invalid = {}, [], []
    for item in items:
        for decoder in decoders:
            outputs[item, decoder] = decode(decoder, *item)
            tokens = outputs[item, decoder][0]
            if not _complete(tokens, tokenizer, SCHEMAS[item[0]], vocab):
                invalid.append((decoder, *item))
                log(f"!!! {decoder} on {item}: not a complete match of the schema: {tokenizer.decode(tokens)!r}")
        for name in ("lossless + grammar", *(["AR + processor, compiled"] if compiled else [])):
            if outputs[item, name][0] != outputs[item, "AR + processor"][0]:
                mismatches.append((name, *item))
                log(f"!!! MISMATCH: {name} differs from AR + processor on {item}")

    best = {}
    for r in range(repeats):
        names = list(decoders)
        order = names[r % len(names) :] + names[: r % len(names)]
        for item in items:
            for decoder in order:
                start = time.perf_counter()
                decode(decoder, *item)
                best[item, decoder] = min(time.perf_counter() - start, best.get((item, decoder), float("inf")))

    rows = {}
    for decoder in decoders:
        tokens = sum(len(outputs[item, decoder][0]) for item in items)
        seconds = sum(best[item, decoder] for item in items)
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
    fastest = rows["AR + processor, compiled"]["tokens_per_s"] if compiled else None
    for decoder in decoders:
        rows[decoder]["vs_ar"] = rows[decoder]["tokens_per_s"] / ar
        if fastest:
            rows[decoder]["vs_ar_compiled"] = rows[decoder]["tokens_per_s"] / fastest

    used = torch.get_num_threads()
    log(
        f"model: {'the shipped model' if model_path == default_model_path() else model_path}, cpu float32, {used} "
        f"thread{'s' * (used != 1)}; {len(SCHEMAS)} schemas x {len(PROMPTS)} prompts, at most {new_tokens} new tokens "
        f"(eos stops), best of {repeats} interleaved run{'s' * (repeats != 1)}; grammar: llguidance"
    )
    log(format_table(rows))
    if compiled:
        log(
            "compiled: cache_implementation='static' with torch.compile(model.forward) (backend "
            f"{compile_backend!r}); vs ARc = tokens/s against AR + processor, compiled"
        )
    both = f"; both compiled: {rows['WeDLM W=4, compiled']['vs_ar_compiled']:.2f}x" if compiled else ""
    log(f"WeDLM + grammar W=4 / AR + processor tokens/s: {rows['WeDLM + grammar W=4']['vs_ar']:.2f}x{both}")
    log(
        "tokens by source: forced = filled by the grammar without the model, constrained = the model's choice among "
        "the grammar's allowed tokens (default mode: the slot after the committed text, and confident slots after "
        "it), model = the model's own fills (lossless: every AR token, each verified draft included)"
    )
    if mismatches or invalid:
        log(f"!!! {len(mismatches)} mismatch(es) with AR + processor, {len(invalid)} incomplete output(s)")
    else:
        same = "lossless + grammar" + (" and AR + processor, compiled," if compiled else "")
        log(f"{same} identical to AR + processor on every prompt; every output a complete match")
    return dict(
        settings=dict(
            new_tokens=new_tokens, repeats=repeats, threads=used, compiled=compile_backend if compiled else None
        ),
        decoders=rows,
        mismatches=[list(m) for m in mismatches],
        invalid=[list(i) for i in invalid],
    )


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


def format_table(rows: dict) -> str:
    compiled = "vs_ar_compiled" in next(iter(rows.values()))
    head = f"{'decoder':<26}{'tokens':>7}{'forwards':>9}{'tok/fwd':>8}{'tok/s':>8}{'vs AR':>7}"
    head += f"{'vs ARc':>8}" if compiled else ""
    lines = [head + f"{'forced':>8}{'constr.':>8}{'model':>7}"]
    for decoder, r in rows.items():
        line = f"{decoder:<26}{r['tokens']:>7}{r['forwards']:>9}{r['tokens_per_forward']:>8.2f}"
        line += f"{r['tokens_per_s']:>8.0f}{r['vs_ar']:>6.2f}x"
        line += f"{r['vs_ar_compiled']:>7.2f}x" if compiled else ""
        if "forced" in r:
            line += f"{r['forced']:>8}{r['constrained']:>8}{r['model']:>7}"
        lines.append(line)
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if report["mismatches"] or report["invalid"]:
        raise SystemExit("structured output check failed (see the lines marked !!!)")
