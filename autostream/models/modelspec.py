"""``MODEL_SPEC`` strings: ``module.path:function`` or ``path/to/file.py:function``.

The function takes no arguments and returns ``(model, example_inputs)``.

>>> model, inputs = load_model_spec("autostream.models.zoo:article_model")
>>> type(model).__name__, len(inputs)
('ArticleModel', 1)
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

import torch


def resolve_model_spec(spec: str) -> Any:
    """The callable named by ``spec`` (not called)."""
    if ":" not in spec:
        raise ValueError(f"model spec {spec!r} must be 'module.path:function' or "
                         "'path/to/file.py:function'")
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ValueError(f"model spec {spec!r} has an empty module or function part")
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where)
        if not path.is_file():
            raise FileNotFoundError(f"model spec {spec!r}: file {where} does not exist")
        mod_name = f"_autostream_spec_{abs(hash(str(path.resolve())))}"
        loader = importlib.util.spec_from_file_location(mod_name, path)
        if loader is None or loader.loader is None:
            raise ValueError(f"model spec {spec!r}: cannot import {where} as a Python file")
        module = importlib.util.module_from_spec(loader)
        sys.modules[mod_name] = module
        loader.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as exc:
            raise ValueError(f"model spec {spec!r}: cannot import module {where!r} ({exc})"
                             f"{_moved_hint(where, name)}") from None
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        known = spec_functions(module)
        listed = (f"; its functions that take no arguments: {', '.join(known)}" if known else
                  "; it defines no function that takes no arguments")
        raise ValueError(f"model spec {spec!r}: {where} has no callable {name!r}{listed}")
    return fn


def spec_functions(module: Any) -> list[str]:
    """The public functions ``module`` defines that can be called without arguments: the
    names a spec on it may give.

    >>> import autostream.models.zoo as zoo
    >>> {"moe_model", "article_model"} <= set(spec_functions(zoo))
    True
    """
    out = []
    for name, fn in vars(module).items():
        if (name.startswith("_") or not inspect.isfunction(fn)
                or fn.__module__ != module.__name__):
            continue
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            continue
        if all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in params):
            out.append(name)
    return sorted(out)


def _moved_hint(where: str, name: str) -> str:
    """Where a spec written before the models moved into ``autostream.models`` points now.

    >>> _moved_hint("autostream.zoo", "moe_model")
    "; the models moved: write 'autostream.models.zoo:moe_model'"
    """
    head, _, rest = where.partition(".")
    if head != "autostream" or not rest:
        return ""
    moved = f"autostream.models.{rest}"
    try:
        found = importlib.util.find_spec(moved) is not None
    except ModuleNotFoundError:
        found = False
    return f"; the models moved: write '{moved}:{name}'" if found else ""


def load_model_spec(spec: str) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """Call the function named by ``spec`` and check it returned ``(model, example_inputs)``."""
    result = resolve_model_spec(spec)()
    if not (isinstance(result, tuple) and len(result) == 2 and callable(result[0])):
        raise ValueError(f"model spec {spec!r} must return (model, example_inputs), got "
                         f"{type(result).__name__}")
    model, inputs = result
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    return model, tuple(inputs)
