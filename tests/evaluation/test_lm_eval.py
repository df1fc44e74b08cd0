"""lm-evaluation-harness runs the shipped model as a Hub checkpoint, with AR and with WeDLM decoding, alike.

The real `lm_eval` command (and lm-eval's Python entry point, for the other runs in one interpreter), in a
subprocess that never imports wedlm_hf, loads `default_model_path()` with `trust_remote_code=True` (the folder's own
remote code) and scores two small local `generate_until` tasks on counting prompts the shipped model answers
correctly: one that stops at the end token, one whose stop string fires mid-answer at a different place in each row
(lm-eval's stop criterion then decides, batch-wide). `--gen_kwargs strategy=wedlm` must change the decoder, not the
answers: at batch size 1 and 4, every run gives the same responses.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from wedlm_hf import default_model_path
from wedlm_hf.data import EVAL_TASK_SEED, task_items

LM_EVAL = shutil.which("lm_eval", path=str(Path(sys.executable).parent)) or shutil.which("lm_eval")
MID_ANSWER_STOP = "0 "  # " 99 100 101" stops as " 99 10"
TASKS = {"wedlm_counting": ("\\n", "answer"), "wedlm_counting_stop": (MID_ANSWER_STOP, "answer_to_stop")}


def short_counting_items(count: int) -> list[dict]:
    """Held-out counting items of at most 10 numbers (4 tokens each at most, digits are single tokens): answers fit
    the 48-token budget."""
    items = [
        {"question": q, "answer": a, "answer_to_stop": a.split(MID_ANSWER_STOP)[0]}
        for q, a in task_items("counting", 20 * count, EVAL_TASK_SEED)
        if int(q.split(", ")[1].split()[0]) <= 10
    ]
    return items[:count]


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    """Local lm-eval tasks: a JSON lines file and a YAML per task, nothing downloaded."""
    folder = tmp_path_factory.mktemp("lm_eval_task")
    data = folder / "counting.jsonl"
    items = short_counting_items(6)
    assert sum(MID_ANSWER_STOP in item["answer"] for item in items) >= 2  # the stop string fires in several rows
    data.write_text("".join(json.dumps(item) + "\n" for item in items))
    for task, (stop, target) in TASKS.items():
        (folder / f"{task}.yaml").write_text(
            f"""task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {json.dumps(str(data))}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{{target}}}}}"
generation_kwargs:
  until: ["{stop}"]
  do_sample: false
  max_gen_toks: 48
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""
        )
    return folder


def run_lm_eval(task_dir: Path, out: Path, batch_size: int, gen_kwargs: str | None) -> dict | str:
    """`lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True [--gen_kwargs ...] --batch_size N`:
    per task, the exact-match score and the responses by document; or the end of the error output."""
    assert LM_EVAL, "lm-eval is not installed: it is a test dependency (scripts/setup.sh, pip install -e '.[test]')"
    command = [
        LM_EVAL,
        "--model",
        "hf",
        "--model_args",
        f"pretrained={default_model_path()},trust_remote_code=True,dtype=float32",
        "--device",
        "cpu",
        "--include_path",
        str(task_dir),
        "--tasks",
        ",".join(TASKS),
        "--batch_size",
        str(batch_size),
        "--output_path",
        str(out),
        "--log_samples",
    ]
    if gen_kwargs:
        command += ["--gen_kwargs", gen_kwargs]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(out / "datasets"),
        "OMP_NUM_THREADS": "1",  # tiny model on a shared CPU: one thread is fastest
        "TOKENIZERS_PARALLELISM": "false",
    }
    result = subprocess.run(
        command, env=env, cwd=out.parent, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600
    )
    if result.returncode != 0:
        return result.stderr[-3000:]
    (report,) = out.rglob("results_*.json")
    found = {}
    for task in TASKS:
        (samples,) = [p for p in out.rglob("samples_*.jsonl") if p.name.rsplit("_", 1)[0] == f"samples_{task}"]
        responses = {}
        for line in samples.read_text().splitlines():
            sample = json.loads(line)
            responses[sample["doc_id"]] = sample["filtered_resps"]
        found[task] = (json.loads(report.read_text())["results"][task]["exact_match,none"], responses)
    return found


# The other runs, through lm-eval's own Python entry point in one fresh interpreter (where wedlm_hf cannot be
# imported, as for the command): lm-eval's start and the model's load once, not once per run.
IN_PROCESS = """
    import json, os, sys

    task_dir, model_dir, cache, runs = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    os.environ.update(HF_DATASETS_OFFLINE="1", HF_DATASETS_CACHE=cache, TOKENIZERS_PARALLELISM="false")
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    manager, found = TaskManager(include_path=task_dir), {}
    for name, (batch_size, gen_kwargs) in runs.items():
        out = simple_evaluate(
            model="hf", model_args=f"pretrained={model_dir},trust_remote_code=True,dtype=float32", device="cpu",
            tasks=list(TASKS), task_manager=manager, batch_size=batch_size, gen_kwargs=gen_kwargs, log_samples=True,
        )
        found[name] = {
            task: [out["results"][task]["exact_match,none"], {str(s["doc_id"]): s["filtered_resps"] for s in samples}]
            for task, samples in out["samples"].items()
        }
    print("RESULT " + json.dumps(found))
"""


def test_lm_eval_scores_ar_and_wedlm_decoding_alike(task_dir, tmp_path, monkeypatch):
    """The command (WeDLM at batch size 4, `--gen_kwargs strategy=wedlm` as users pass it) and lm-eval's Python
    entry point (AR at batch sizes 1 and 4, WeDLM at 1) give the same responses and scores."""
    from conftest import run_without_wedlm_hf

    command = run_lm_eval(task_dir, tmp_path / "wedlm-bs4", 4, "strategy=wedlm")
    assert not isinstance(command, str), f"lm_eval failed (strategy=wedlm, batch size 4):\n{command}"
    runs = {"ar, batch size 1": (1, None), "ar, batch size 4": (4, None), "wedlm, batch size 1": (1, "strategy=wedlm")}
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    script = "TASKS = " + repr(list(TASKS)) + "\n" + textwrap.dedent(IN_PROCESS)
    found = run_without_wedlm_hf(
        script, [str(task_dir), str(default_model_path()), str(tmp_path / "datasets"), json.dumps(runs)], tmp_path
    )
    found["wedlm, batch size 4 (the command)"] = {
        task: [score, {str(doc): responses for doc, responses in by_doc.items()}]
        for task, (score, by_doc) in command.items()
    }
    reference = found["ar, batch size 1"]
    for task, (score, responses) in reference.items():
        assert score > 0 and len(responses) == 6, (task, score)  # meaningful: the shipped model gets items right
    assert set(reference) == set(TASKS)
    for run, result in found.items():
        assert result == reference, f"{run} differs from AR at batch size 1"
