"""What building a model from its load message needs in every module
that builds one (nets, decoder, usermodel): the error a bad message
raises, the tensor lookup, and the compiled bodies' own code objects.
It imports no module of the worker's, so that the modules that build
models import each other without a cycle (nets -> decoder, usermodel ->
loading)."""

from __future__ import annotations

import types
from typing import Any, Callable

import torch


class LoadError(ValueError):
    """The model cannot be built; the message names the key or tensor."""


def take(tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The tensor name, which must have shape."""
    t = tensors.get(name)
    if t is None:
        raise LoadError(f"tensor {name!r} is missing (want shape {list(shape)})")
    if tuple(t.shape) != shape:
        raise LoadError(f"tensor {name!r} has shape {list(t.shape)}, want {list(shape)}")
    return t


def own_code(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """fn, with a fresh code object named name (same body, same closure)."""
    code = fn.__code__.replace(co_name=name)
    if hasattr(code, "co_qualname"):  # Python 3.11+
        code = code.replace(co_qualname=name)
    out = types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    out.__doc__ = fn.__doc__
    return out
