"""Fetches transformers' common model testers for the INSTALLED transformers and prints where they are.

The PyPI sdist of transformers carries its top-level tests/*.py (test_modeling_common.py with ModelTesterMixin,
test_configuration_common.py with ConfigTester, ...), not the wheel. This downloads the sdist of the installed
version with pip (PyPI is the only network it needs), extracts those files into
build/transformers-testers/<version>/hf_sdist_tests/ (a package name that cannot clash with our tests/), and adds
shims for the three modules they import that the sdist does not carry. Nothing of it is committed; a second run
only prints the path. tests/modeling/test_transformers_common.py runs this when the folder is missing.

Usage: .venv/bin/python scripts/fetch_transformers_testers.py
"""

import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import version
from pathlib import Path

PACKAGE = "hf_sdist_tests"
ROOT = Path(__file__).resolve().parent.parent / "build" / "transformers-testers"
NEEDED = ("test_modeling_common.py", "test_configuration_common.py")

# Shims, written here (not transformers' code), for modules of transformers' GitHub test tree that the sdist lacks.
SHIMS = {
    "exporters/__init__.py": "",
    "exporters/test_export.py": (
        '"""Shim: tests/exporters/test_export.py is not in the sdist; the export tests are not run."""\n\n\n'
        "class ExportTesterMixin:\n    pass\n"
    ),
    "generation/__init__.py": "",
    "generation/test_utils.py": (
        '"""Shim: tests/generation/test_utils.py is not in the sdist. wedlm-hf\'s own generation tests subclass this\n'
        'marker class (ModelTesterMixin checks that a generative model\'s tests include generation tests)."""\n\n\n'
        "class GenerationTesterMixin:\n    pass\n"
    ),
    "utils/__init__.py": "",
    "utils/test_configuration_utils.py": (
        '"""Shim: tests/utils/test_configuration_utils.py is not in the sdist. ConfigTester checks that these common\n'
        'PreTrainedConfig arguments (non-default values chosen by wedlm-hf) survive the config\'s __init__."""\n\n'
        "config_common_kwargs = {\n"
        '    "return_dict": False,\n'
        '    "output_hidden_states": True,\n'
        '    "dtype": "float16",\n'
        '    "architectures": ["WeDLMForCausalLM"],\n'
        '    "id2label": {0: "no", 1: "yes"},\n'
        '    "label2id": {"no": 0, "yes": 1},\n'
        '    "problem_type": "single_label_classification",\n'
        '    "tie_word_embeddings": True,\n'
        "}\n"
    ),
}


def ensure_testers(transformers_version: str | None = None) -> Path:
    """The folder to put on sys.path to import `hf_sdist_tests`, fetched first if missing."""
    transformers_version = transformers_version or version("transformers")
    root = ROOT / transformers_version
    if _complete(root):
        return root
    ROOT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
        download = Path(tmp, "sdist")
        command = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet", "--no-deps"]
        command += ["--no-binary", ":all:", "--dest", str(download), f"transformers=={transformers_version}"]
        done = subprocess.run(command, capture_output=True, text=True)
        sdists = sorted(download.glob("transformers-*.tar.gz"))
        if done.returncode != 0 or not sdists:
            raise RuntimeError(
                f"Could not download the transformers {transformers_version} sdist from PyPI with pip "
                f"({' '.join(command)}):\n{done.stderr.strip()[-2000:]}"
            )
        staging = Path(tmp, "staged")
        package = staging / PACKAGE
        package.mkdir(parents=True)
        with tarfile.open(sdists[0]) as sdist:
            for member in sdist.getmembers():
                folder, _, name = member.name.partition("/tests/")
                if member.isfile() and folder.startswith("transformers-") and "/" not in name and name.endswith(".py"):
                    (package / name).write_bytes(sdist.extractfile(member).read())
        missing = [name for name in NEEDED if not (package / name).is_file()]
        if missing:
            raise RuntimeError(f"The transformers {transformers_version} sdist has no tests/{', tests/'.join(missing)}")
        (package / "__init__.py").write_text(
            '"""transformers\' tests/*.py from its sdist (fetched, not committed)."""\n'
        )
        for relative, text in SHIMS.items():
            (package / relative).parent.mkdir(parents=True, exist_ok=True)
            (package / relative).write_text(text)
        shutil.rmtree(root, ignore_errors=True)  # an incomplete leftover
        try:
            staging.rename(root)  # whole folder at once: an interrupted run leaves nothing half-written
        except OSError:
            if not _complete(root):  # else a concurrent run got there first
                raise
    return root


def _complete(root: Path) -> bool:
    return all((root / PACKAGE / name).is_file() for name in NEEDED)


if __name__ == "__main__":
    print(ensure_testers())
