"""The documentation holds: the README is a landing page whose commands, examples and figures are the real ones, every
page's links and imports resolve, nothing is written twice, cited docs/algorithm.md sections exist, and the usage
claims of docs/usage.md are true."""

import ast
import inspect
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, pipeline

import wedlm_hf
from wedlm_hf import WeDLMForCausalLM, default_model_path
from wedlm_hf.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
ALGORITHM = ROOT / "docs" / "algorithm.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
CARDS = sorted((ROOT / "model_cards").glob("**/README.md"))
PAGES = [README, *DOCS, *CARDS]  # everything a reader reads as documentation
CITATION = re.compile(r"docs/algorithm\.md,? sections? (\d+(?:\.[a-z])?)\b")
LINK = re.compile(r"\(docs/algorithm\.md#([\w-]+)\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n?", flags=re.M | re.S)
MARKDOWN_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
MAX_README_LINES = 150
LONG_PARAGRAPH = 200  # characters: a paragraph this long is written in one page only


def headings() -> list[str]:
    return re.findall(r"^#{2,3} (.+)$", ALGORITHM.read_text(), flags=re.M)


def section_numbers() -> set[str]:
    return {m.group(1) for h in headings() if (m := re.match(r"(\d+(?:\.[a-z])?)\.? ", h))}


def github_anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def cited_text() -> dict[Path, str]:
    files = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("examples/*"), *ROOT.glob("scripts/*")]
    files += [*ROOT.glob("wedlm_hf/**/*.py"), *ROOT.glob("tests/**/*.py")]
    return {path: path.read_text() for path in files if path.is_file() and path.suffix != ".safetensors"}


def test_every_cited_section_exists():
    numbers, anchors = section_numbers(), {github_anchor(h) for h in headings()}
    assert {"1", "2", "3", "3.d", "3.g", "3.h", "3.i", "4", "5", "6"} <= numbers
    cited = 0
    for path, text in cited_text().items():
        for number in CITATION.findall(text):
            assert number in numbers, f"{path.relative_to(ROOT)} cites docs/algorithm.md section {number}"
            cited += 1
        for anchor in LINK.findall(text):
            assert anchor in anchors, f"{path.relative_to(ROOT)} links docs/algorithm.md#{anchor}"
            cited += 1
    assert cited >= 3


def test_readme_and_docs_explain_the_algorithm_here_not_in_a_missing_file():
    for path in PAGES:
        text = path.read_text()
        assert "WEDLM.md" not in text and "../shared" not in text, path
    lossless = ALGORITHM.read_text().split("## 6. Lossless decoding\n", 1)[1]
    for idea in ("final token", "min(1, p/q)", "max(0, p - q)", "verifiable", "adaptive window"):
        assert idea in lossless, idea


def test_quickstart_prints_no_special_tokens():
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tokens/forward" in result.stdout and "<|endoftext|>" not in result.stdout


def test_pipeline_samples_by_default_and_is_greedy_with_do_sample_false():
    """As docs/usage.md says: transformers' text-generation pipeline samples unless told do_sample=False."""
    path = default_model_path()
    pipe = pipeline("text-generation", model=path)
    prompt, options = "def fibonacci(n):", dict(strategy="wedlm", max_new_tokens=24, return_full_text=False)
    greedy = pipe(prompt, do_sample=False, **options)[0]["generated_text"]
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = WeDLMForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    direct = model.generate(ids, strategy="wedlm", max_new_tokens=24, do_sample=False)
    assert greedy == tokenizer.decode(direct[0, ids.shape[1] :], skip_special_tokens=True)
    sampled = set()
    for seed in range(3):
        torch.manual_seed(seed)
        sampled.add(pipe(prompt, **options)[0]["generated_text"])
    assert len(sampled) > 1  # the default samples: different seeds, different texts


def test_model_card_summary_makes_no_claim_about_the_hardware():
    """The training record's torch build says where it ran; the hand-written summary does not repeat it."""
    recipe = (ROOT / "examples" / "train_default_model.sh").read_text()
    summary = re.search(r'--summary "([^"]+)"', recipe).group(1)
    card = (ROOT / "model_cards" / "wedlm-tiny-stdlib" / "README.md").read_text()
    assert "CPU" not in summary and "trained from scratch on CPU" not in card


# The README: a landing page whose two commands, example and headline figures are the real ones.


def fenced_blocks(path: Path, language: str | None = None) -> list[str]:
    return [body for lang, body in FENCE.findall(path.read_text()) if language is None or lang == language]


def prose(text: str) -> str:
    """The text without its fenced code blocks."""
    return FENCE.sub("", text)


def section(path: Path, heading: str) -> str:
    """The text under the heading whose title (or GitHub anchor) is `heading`, up to the next heading of its level."""
    out, level, in_code = None, 0, False  # the section keeps its code blocks: figures live in command output
    for line in path.read_text().splitlines(keepends=True):
        if line.startswith("```"):
            in_code = not in_code
        found = None if in_code else re.match(r"^(#{1,6}) (.+?)\s*$", line)
        if found and out is not None and len(found.group(1)) <= level:
            break
        if found and heading in (found.group(2), github_anchor(found.group(2))):
            out, level = [], len(found.group(1))
        elif out is not None:
            out.append(line)
    assert out is not None, f"{path.relative_to(ROOT)} has no heading {heading!r}"
    return "".join(out)


def offline_env() -> dict[str, str]:
    """A subprocess's environment: offline, and this checkout's wedlm_hf first on the path."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}


def readme_commands() -> list[str]:
    block = fenced_blocks(README, "bash")[0]
    assert block in section(README, "Two commands")
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_readme_two_commands_are_what_ci_and_the_tests_run():
    main, tests = readme_commands()
    assert tests == "scripts/setup.sh && .venv/bin/python -m pytest"
    setup, command = main.split(" && ")
    assert setup == "scripts/setup.sh" and os.access(ROOT / setup, os.X_OK)
    assert "-m venv .venv" in (ROOT / setup).read_text()  # the .venv both commands then run from
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert ci.index("scripts/setup.sh") < ci.index(".venv/bin/python -m pytest")  # CI runs the README's test command
    argv = shlex.split(command)
    assert argv[0] == ".venv/bin/wedlm-hf"
    assert re.search(r'^wedlm-hf = "wedlm_hf\.cli:console"$', (ROOT / "pyproject.toml").read_text(), flags=re.M)
    args = build_parser().parse_args(argv[1:])
    assert args.command == "generate" and args.prompt and args.model is None  # the shipped model


def test_readme_is_a_landing_page_that_maps_every_docs_page():
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_README_LINES
    linked = {target.split("#")[0] for target in MARKDOWN_LINK.findall(prose(text))}
    for page in DOCS:
        assert f"docs/{page.name}" in linked, f"the README's map of the docs does not link docs/{page.name}"


def test_every_docs_page_starts_with_what_a_reader_does_with_it():
    for page in DOCS:
        title, intro = prose(page.read_text()).split("\n\n")[:2]
        assert title.startswith("# ") and intro.startswith("Use this page to "), page.name


def test_readme_example_with_the_shipped_model_runs_and_decodes_in_parallel():
    (block,) = [b for b in fenced_blocks(README, "python") if "default_model_path()" in b]
    result = subprocess.run(
        [sys.executable, "-c", block],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=offline_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(result.stdout.split()[-1]) > 2  # tokens per forward: the streamed counting, several a forward


def test_headline_figures_are_those_of_the_linked_output():
    """Every figure of the README's headline table appears in the section it links to, with the date given."""
    table = [line for line in section(README, "Headline numbers").splitlines() if line.startswith("| ")][1:]
    rows = [line for line in table if not set(line) <= set("|- ")]
    assert len(rows) >= 5
    for row in rows:
        figure, command, when, source = [cell.strip() for cell in row.strip("|").split(" | ")]
        assert command.startswith("`wedlm-hf ") and re.search(r"\b(CPU|GPU)\b", when), row
        linked = ""
        for target in MARKDOWN_LINK.findall(source):
            file, _, anchor = target.partition("#")
            linked += section(ROOT / file, anchor)
        for number in re.findall(r"\d+\.\d+x?", figure):
            assert number in linked, f"{number} of the README's headline table is not in {source}"
        for date in re.findall(r"\d{4}-\d\d-\d\d", when):
            assert date in linked or "model_cards/" in source, f"{date} is not in {source}"
    main_command = readme_commands()[0].split(" && ")[1].removeprefix(".venv/bin/")
    assert main_command in section(BENCHMARKS, "wedlm-hf-generate-the-main-command")


# Every page: code blocks that import, links that resolve, nothing written twice.


def test_every_python_block_imports_what_it_imports():
    """The imports of every ```python block run (offline); the rest of a block may need a GPU or a download."""
    imports = []
    for page in PAGES:
        for number, block in enumerate(fenced_blocks(page, "python"), 1):
            tree = ast.parse(block)  # every block is valid Python
            statements = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
            if statements:  # a block without imports continues the one before it
                imports.append((f"{page.relative_to(ROOT)} block {number}", "\n".join(statements)))
    assert len(imports) >= 6
    script = (
        "import json, sys\nfailed = {}\nfor label, source in json.load(sys.stdin):\n"
        "    try:\n        exec(source, {})\n    except Exception as error:\n        failed[label] = repr(error)\n"
        "print(json.dumps(failed))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(imports),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=offline_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == {}


def page_anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered -1, -2, ..."""
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", prose(path.read_text()), flags=re.M):
        anchor = github_anchor(heading)
        anchors.add(anchor if anchor not in seen else f"{anchor}-{seen[anchor]}")
        seen[anchor] = seen.get(anchor, 0) + 1
    return anchors


def test_every_relative_link_resolves_to_a_file_and_heading_of_the_repository():
    checked = 0
    for page in PAGES:
        text = re.sub(r"`[^`\n]*`", "", prose(page.read_text()))  # links in code are not links
        for target in MARKDOWN_LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            file, _, anchor = target.partition("#")
            resolved = (page.parent / file).resolve() if file else page
            where = f"{page.relative_to(ROOT)} links {target}"
            assert resolved.is_file() and resolved.is_relative_to(ROOT), where
            if anchor:
                assert resolved.suffix == ".md" and anchor in page_anchors(resolved), where
            checked += 1
    assert checked >= 40


def test_no_paragraph_or_table_row_is_written_twice():
    """A long paragraph, or a table row, lives in one place; other pages link to it."""
    seen: dict[str, str] = {}
    for page in PAGES:
        text = prose(page.read_text())
        rows = [line for line in text.splitlines() if line.startswith("|") and len(line) >= 40]
        paragraphs = [" ".join(p.split()) for p in text.split("\n\n")]
        for piece in rows + [p for p in paragraphs if len(p) >= LONG_PARAGRAPH and not p.startswith("|")]:
            where = f"{page.relative_to(ROOT)}"
            assert piece not in seen, f"written twice, in {seen[piece]} and {where}: {piece[:100]}"
            seen[piece] = where
    assert len(seen) >= 100


def test_public_names_say_what_they_are_for_in_their_first_line():
    """help() on each public name opens with its own one-line summary, not an inherited or missing one."""
    from wedlm_hf.hub.export import export_checkpoint
    from wedlm_hf.modeling.streaming_decoder import StreamingDecoder

    names = (wedlm_hf.WeDLMConfig, WeDLMForCausalLM, wedlm_hf.generate_wedlm, wedlm_hf.DualStreamCollator)
    for obj in (*names, export_checkpoint, StreamingDecoder):
        doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else obj.__doc__
        assert doc, f"{obj.__name__} has no docstring of its own"
        summary, _, rest = inspect.cleandoc(doc).partition("\n")
        assert summary.endswith(".") and len(summary) <= 116 and "WeDLM" in summary, obj.__name__
        assert rest.startswith("\n") and len(rest.split()) >= 20, f"{obj.__name__}: a summary line, then details"
