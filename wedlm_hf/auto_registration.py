"""Registers WeDLM with transformers' Auto classes as soon as both wedlm-hf and transformers are imported.

`import wedlm_hf` stays light (no torch, no transformers) so that `wedlm-hf --help` answers at once; the Auto
classes still learn model_type "wedlm" whichever of the two is imported first:

- transformers already imported: `register()` runs at `import wedlm_hf`;
- otherwise a one-shot import hook runs it right after transformers (or the core `wedlm_hf.modeling`, whichever
  finishes last) has been executed.

`register()` also imports the Hub wing, which gives `WeDLMForCausalLM` its `push_to_hub`.
"""

import importlib
import importlib.abc
import importlib.util
import sys

WATCHED = ("transformers", "wedlm_hf.modeling")
_executing: set[str] = set()  # watched modules whose code is running right now


def register() -> None:
    """Model type "wedlm" for AutoConfig / AutoModel / AutoModelForCausalLM, and remote code on save.

    AutoModel gives the causal LM, as a Hub export's `auto_map` does (`wedlm_hf.hub.AUTO_MAP`): with or without
    wedlm_hf, `AutoModel.from_pretrained(...)` can `generate(strategy="wedlm")`; its `.model` is the base model. A
    bare `WeDLMModel` still saves its own code under "AutoModel"."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    from . import hub  # noqa: F401  (attaches WeDLMForCausalLM.push_to_hub)
    from .modeling import WeDLMConfig, WeDLMForCausalLM, WeDLMModel

    AutoConfig.register("wedlm", WeDLMConfig, exist_ok=True)
    AutoModel.register(WeDLMConfig, WeDLMForCausalLM, exist_ok=True)
    AutoModelForCausalLM.register(WeDLMConfig, WeDLMForCausalLM, exist_ok=True)
    WeDLMConfig.register_for_auto_class()
    WeDLMModel.register_for_auto_class("AutoModel")
    WeDLMForCausalLM.register_for_auto_class("AutoModelForCausalLM")


def _ready() -> bool:
    """transformers is loaded and neither it nor the core is half-way through its own import."""
    return "transformers" in sys.modules and not _executing


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the watched modules' loaders so that `register()` follows their execution."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in WATCHED or fullname in _executing:
            return None
        sys.meta_path.remove(self)  # let the real finders answer, without coming back here
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_then_register(module):
            del loader.exec_module  # one shot: the loader's own method again
            _executing.add(fullname)
            try:
                run(module)
            finally:
                _executing.discard(fullname)
            if _ready():
                _uninstall()
                register()

        loader.exec_module = exec_then_register
        return spec


_HOOK = _RegisterAfterImport()


def _uninstall() -> None:
    if _HOOK in sys.meta_path:
        sys.meta_path.remove(_HOOK)


def register_when_transformers_is_imported() -> None:
    """Called by `import wedlm_hf`."""
    if _ready():
        register()
    elif _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)
