"""A weight file is checked before anything copies it (`wedlm-hf export`, `ship-default`) or resumes from it.

A run killed while saving, or an interrupted download, leaves a truncated `model.safetensors`; copied on, it fails
only when someone loads it, far from the cause. Reading the header (safetensors also checks that the tensors it
lists cover the file exactly) catches that at the source, naming the file.
"""

from pathlib import Path

from safetensors import safe_open


def check_safetensors(path) -> Path:
    """`path` when it is a complete safetensors file, else a ValueError naming it and what to do."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as weights:
            weights.keys()
    except Exception as error:
        raise ValueError(
            f"{path} is not a readable safetensors file ({error}); it is probably truncated (a save or download "
            "that did not finish): write it again from the model, e.g. with save_pretrained, or copy it anew."
        ) from error
    return path
