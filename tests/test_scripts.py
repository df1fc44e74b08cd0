"""The shell scripts: setup.sh installs only when something changed; gpu_check.sh's CPU dry run goes end to end."""

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Stands in for .venv/bin/python: records every call; `-c` checks (is a package importable?) answer FAKE_MISSING.
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$(dirname "$0")/../../calls.log"
if [ "$1" = "-c" ]; then exit "${FAKE_MISSING:-0}"; fi
exit 0
"""


@pytest.fixture
def repo(tmp_path):
    """A copy of what setup.sh reads, with a recording fake interpreter in .venv."""
    for name in ("scripts/setup.sh", "scripts/constraints.txt", "pyproject.toml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tmp_path / name)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return tmp_path


def setup(repo: Path, **env) -> tuple[str, list[str]]:
    """Runs setup.sh; returns its output and the pip commands it ran."""
    (repo / "calls.log").unlink(missing_ok=True)
    path = "/usr/bin:/bin"  # no nvidia-smi: the CPU branch
    result = subprocess.run(
        ["bash", "scripts/setup.sh"],
        cwd=repo,
        env={**os.environ, "PATH": path, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    calls = (repo / "calls.log").read_text().splitlines() if (repo / "calls.log").exists() else []
    return result.stdout, [c for c in calls if c.startswith("-m pip")]


def test_setup_installs_once_then_only_checks(repo):
    out, pips = setup(repo)
    assert "installing wedlm-hf" in out and len(pips) == 1 and "-e .[test]" in pips[0]
    out, pips = setup(repo)
    assert out == "setup: .venv is up to date (nothing to install)\n" and pips == []


def test_setup_reinstalls_when_its_inputs_change_or_packages_are_gone(repo):
    setup(repo)
    with open(repo / "pyproject.toml", "a") as f:
        f.write("\n# changed\n")
    _, pips = setup(repo)
    assert len(pips) == 1 and "-e .[test]" in pips[0]
    assert setup(repo)[1] == []
    _, pips = setup(repo, FAKE_MISSING="1")  # e.g. the venv was emptied: torch and the package again
    assert any("torch==2.13.0" in p for p in pips) and "-e .[test]" in pips[-1]


def dry_run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """gpu_check.sh --cpu with `args`, on this interpreter."""
    return subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--cpu", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.heavy  # a dry run of the GPU check
def test_gpu_check_cpu_dry_run():
    result = dry_run()
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    out = result.stdout
    assert "eager vs sdpa, batch 1: 4/4 prompts give identical tokens" in out
    assert "eager vs sdpa, batch 4: 4/4 prompts give identical tokens" in out
    assert "model: 15.7M parameters, cpu, float32, 1 thread;" in out and "WeDLM / AR generate tokens/s" in out
    assert "decoding forward / AR step:" in out and out.rstrip().endswith("RESULT: tokens equal")
    # (d): every path at both batch sizes, the compiled ones really compiled, the memory bound and the three targets
    assert "FAILED" not in out and "SKIPPED" not in out and "memory bound:" in out
    for path in ("AR static+compiled", "WeDLM static+compiled", "AR eager", "WeDLM eager"):
        for batch in (1, 16):
            assert re.search(rf"^{re.escape(path)} +{batch} +\d+\.\d+ +\d", out, re.M), (path, batch)
            if "compiled" in path:
                assert re.search(rf"^{re.escape(path)}, batch {batch}: warm-up \S+, [1-9]\d* graph", out, re.M)
    assert len(re.findall(r"^target: .*: \d+\.\d+x (PASS|FAIL)$", out, re.M)) == 3
    # (f): sampled steps of both modes read the device once (on the CPU, counted at the Python level)
    assert len(re.findall(r"^sampled (default|lossless) mode, .*: host reads per step \[(1, )*1\]", out, re.M)) == 2


@pytest.mark.heavy  # a dry run of the GPU check
def test_gpu_check_runs_only_the_parts_asked_for(tmp_path):
    """--parts e: bench-lossless alone (its dry run: one prompt a family), its JSON kept in --json-dir."""
    result = dry_run("--parts", "e", "--json-dir", str(tmp_path))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    out = result.stdout
    assert re.findall(r"^== \((\w)\)", out, re.M) == ["e"] and "FAILED" not in out
    assert "wedlm-hf bench-lossless --device cpu --threads 2 --prompts-per-family 1" in out
    assert "identical to AR generate on every prompt: prompt lookup, lossless" in out
    assert out.rstrip().endswith("RESULT: parts e measured (above)")
    assert (tmp_path / "bench_lossless.json").is_file()


@pytest.mark.heavy  # a dry run of the GPU check
def test_gpu_check_profiles_the_step_at_batch_64():
    """--parts g: compiled AR and WeDLM at batch 64, then a profile of decoding steps split into the host's time
    outside torch's operators and the operators that took the most time."""
    result = dry_run("--parts", "g")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    out = result.stdout
    assert re.findall(r"^== \((\w)\)", out, re.M) == ["g"] and "FAILED" not in out and "SKIPPED" not in out
    for path in ("AR static+compiled", "WeDLM static+compiled"):
        assert re.search(rf"^{re.escape(path)} +64 +\d+\.\d+ +\d", out, re.M), path
    assert "target:" not in out  # the targets are batch 1's, part (d)'s
    line = re.search(r"^batch 64, 5 decoding steps: wall (\S+) ms/step, of which (\S+) ms outside torch's", out, re.M)
    assert line and 0 < float(line[2]) < float(line[1]), out[-3000:]
    assert "aten::mm" in out and out.rstrip().endswith("RESULT: parts g measured (above)")


def test_gpu_check_refuses_unknown_parts():
    result = dry_run("--parts", "ax", timeout=120)
    assert result.returncode == 2 and "--parts ax: give letters among a to g" in result.stderr


def test_gpu_check_without_wheels_says_what_to_do(tmp_path):
    for name in ("scripts/gpu_check.sh", "scripts/gpu_check.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tmp_path / name)
    result = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "run scripts/gpu_wheels.sh" in result.stderr


def test_wheel_folder_is_ignored_by_git():
    result = subprocess.run(
        ["git", "check-ignore", "-q", ".whl/transformers-5.23.0-py3-none-any.whl"], cwd=ROOT, timeout=30
    )
    assert result.returncode == 0
