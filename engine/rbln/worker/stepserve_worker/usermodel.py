"""Models of architecture `torch`: the user's own torch.nn.Module, built by a
factory in a file of the model's directory, served under the same step
structure as the built-in architectures.

The staging row of such a model is bytes: every input's row sits in it at an
offset aligned to ALIGN_BYTES, in its device type (floating inputs in the
compute dtype, integer and boolean ones as declared), and the step body
views each out of the one bound buffer inside the graph. The outputs come
back the same way: each output's row, in its device type, packed into one
byte row per batch row, so that one copy brings them all back."""

from __future__ import annotations

import importlib.util
import inspect
import sys
import traceback
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.nn import functional as F

from . import safetensors
from .loading import own_code

#: Every tensor's row starts at a multiple of this many bytes (the device's
#: 64-element alignment for one-byte types; a multiple of every element
#: size).
ALIGN_BYTES = 64

#: The device types of the protocol's datatypes; floating ones are replaced
#: by the compute dtype.
_DTYPES = {
    "FP32": torch.float32, "FP16": torch.float16, "BF16": torch.bfloat16,
    "INT64": torch.int64, "INT32": torch.int32, "INT16": torch.int16, "INT8": torch.int8,
    "UINT8": torch.uint8, "BOOL": torch.bool,
    # torch computes with no unsigned type wider than 8 bits: the next
    # wider signed one (the supervisor converts, saturating UINT64 at
    # 2**63-1; engine/rbln/boundary.go's deviceDtype).
    "UINT16": torch.int32, "UINT32": torch.int64, "UINT64": torch.int64,
}
_FLOATING = {"FP32", "FP16", "BF16", "FP64"}


class UserModelError(ValueError):
    """The model cannot be built or does not match its model.yaml; the
    message names the file, the key or the tensor."""


@dataclass
class Field:
    """One input or output as the step sees it: its per-row shape (the
    batch dimension left out, every other dimension at the bucket's size),
    its device dtype, and where its row sits in the staging row."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int  # bytes into the row
    nbytes: int  # the row's bytes, unpadded

    @property
    def count(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def device_dtype(datatype: str, compute: torch.dtype) -> torch.dtype:
    if datatype in _FLOATING:
        return compute
    dt = _DTYPES.get(datatype)
    if dt is None:
        raise UserModelError(f"datatype {datatype!r} is not supported by architecture torch")
    return dt


def fields(specs: list[dict[str, Any]], compute: torch.dtype) -> tuple[list[Field], int]:
    """The fields of a staging row described by the load request (name,
    datatype, shape per row), and the row's data length in bytes.

    Where every field has the same device dtype (every float in the
    compute dtype, say), the row is a row of that dtype: the fields side
    by side, each sliced out in the graph, no reinterpretation (step 3 of
    the recommended structure: one dtype at the boundary). Only a side
    that mixes dtypes is a byte row, each field at a multiple of 64 bytes
    and viewed out of it (Tensor.view(dtype), a bitcast in the graph),
    which the warm-up proves the frontend lowers (row_dtype)."""
    out: list[Field] = []
    dts = [device_dtype(s["datatype"], compute) for s in specs]
    typed = len(set(dts)) <= 1
    offset = 0
    for s, dt in zip(specs, dts):
        shape = tuple(int(d) for d in s["shape"])
        size = torch.empty(0, dtype=dt).element_size()
        f = Field(s["name"], shape, dt, offset, 0)
        f.nbytes = f.count * size
        if "offset" in s and int(s["offset"]) != offset:
            raise UserModelError(f"{s['name']}: the supervisor placed it at byte {s['offset']}, the worker at {offset}")
        out.append(f)
        offset += f.nbytes if typed else -(-f.nbytes // ALIGN_BYTES) * ALIGN_BYTES
    return out, offset


def row_dtype(fs: list[Field]) -> Optional[torch.dtype]:
    """The dtype of a side's staging row: the fields' own where they share
    one, else None (a byte row)."""
    dts = {f.dtype for f in fs}
    return dts.pop() if len(dts) == 1 else None


def row_cols(fs: list[Field]) -> tuple[torch.dtype, int]:
    """A side's row dtype and data columns: elements of the shared dtype,
    or bytes of a byte row."""
    dt = row_dtype(fs)
    end = fs[-1].offset + fs[-1].nbytes if fs else 0
    if dt is None:
        return torch.uint8, end
    return dt, end // torch.empty(0, dtype=dt).element_size()


def signature(msg: dict[str, Any], seq: int, compute: torch.dtype) -> tuple[list[Field], list[Field]]:
    """The input and output fields of the torch model msg loads, for a
    bucket whose variable dimension is seq."""
    spec = msg["torch"]

    def resolve(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [dict(s, shape=[seq if d == -1 else d for d in s["shape"]]) for s in specs]
    return fields(resolve(spec["inputs"]), compute)[0], fields(resolve(spec["outputs"]), compute)[0]


def import_file(path: Path, unique: str, shown: str = "") -> types.ModuleType:
    """Import path under a module name of its own, so that two models may
    both ship a model.py (and a reload gets the file's new contents).
    Errors name the file as shown (its path in the model repository)."""
    shown = shown or str(path)
    name = "stepserve_user_" + "".join(c if c.isalnum() else "_" for c in unique)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserModelError(f"{shown}: not importable as a Python module")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        sys.modules.pop(name, None)
        where = "" if isinstance(e, SyntaxError) else where_in(e, path)  # a SyntaxError says its line
        raise UserModelError(f"{shown}: import failed: {type(e).__name__}: {e}{where}") from e
    return mod


def where_in(e: BaseException, path: Path) -> str:
    """" (model.py, line N)": the innermost line of the user's file the
    exception passed through, or "" when it did not."""
    try:
        target = path.resolve()
    except OSError:
        return ""
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        try:
            if Path(frame.filename).resolve() == target:
                return f" ({path.name}, line {frame.lineno})"
        except OSError:
            continue
    return ""


def forget(unique: str) -> None:
    """Drop an imported model file's module."""
    sys.modules.pop("stepserve_user_" + "".join(c if c.isalnum() else "_" for c in unique), None)


def build(msg: dict[str, Any]) -> nn.Module:
    """The user's module: model file imported, factory called with the
    config, weights loaded strictly."""
    spec = msg.get("torch") or {}
    path = Path(spec.get("module", ""))
    shown = spec.get("name") or str(path)
    if not path.is_file():
        raise UserModelError(f"torch.module: {shown} is not a file")
    mod = import_file(path, msg["model"], shown)
    factory_name = spec.get("factory") or "build"
    factory = getattr(mod, factory_name, None)
    if not callable(factory):
        raise UserModelError(f"torch.factory: {shown} has no callable {factory_name!r}")
    try:
        module = factory(dict(spec.get("config") or {}))
    except Exception as e:
        raise UserModelError(f"{shown}: {factory_name}(config) failed: {type(e).__name__}: {e}{where_in(e, path)}") from e
    if not isinstance(module, nn.Module):
        raise UserModelError(f"torch.factory: {shown}: {factory_name}(config) returned {type(module).__name__}, not a torch.nn.Module")
    weights = spec.get("weights")
    if weights:
        load_weights(module, Path(weights))
    return module.eval()


def load_weights(module: nn.Module, path: Path) -> None:
    """load_state_dict(strict=True), its complaints named."""
    try:
        state = safetensors.load(path, keep_dtype=True)
    except safetensors.SafetensorsError as e:
        raise UserModelError(f"torch.weights: {e}") from e
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing from the file: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
        if unexpected:
            parts.append(f"not in the module: {', '.join(unexpected[:8])}{' ...' if len(unexpected) > 8 else ''}")
        raise UserModelError(f"torch.weights: {path.name} does not match the module's state_dict: {'; '.join(parts)}")
    for k, t in own.items():
        if tuple(state[k].shape) != tuple(t.shape):
            raise UserModelError(f"torch.weights: {path.name}: tensor {k!r} has shape {list(state[k].shape)}, "
                                 f"the module's has {list(t.shape)}")
    module.load_state_dict(state, strict=True)


def check_outputs(outs: Any, want: list[Field], batch: int) -> list[torch.Tensor]:
    """forward's result as a list of outputs, held to the declared count and
    per-row shapes."""
    if isinstance(outs, torch.Tensor):
        outs = [outs]
    elif isinstance(outs, (tuple, list)):
        outs = list(outs)
    else:
        raise UserModelError(f"forward returned {type(outs).__name__}; want a tensor or a tuple of {len(want)}")
    if len(outs) != len(want):
        raise UserModelError(f"forward returned {len(outs)} outputs; model.yaml declares {len(want)} "
                             f"({', '.join(f.name for f in want)})")
    for o, f in zip(outs, want):
        if not isinstance(o, torch.Tensor):
            raise UserModelError(f"output {f.name!r} is a {type(o).__name__}, not a tensor")
        if tuple(o.shape) != (batch, *f.shape):
            raise UserModelError(f"output {f.name!r} has shape {list(o.shape)}; model.yaml declares {[batch, *f.shape]}")
    return outs


def step_body(module: nn.Module, batch: int, ins: list[Field], in_row: int, outs: list[Field], out_row: int,
              name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The function compiled per bucket: the bound buffer [batch, in_row]
    in, each input sliced out of it; forward; every output packed into one
    [batch, out_row] tensor out. A row of one dtype (fields) is sliced and
    concatenated as it is; a byte row's fields are viewed in their device
    types and packed back as bytes."""
    in_dt, out_dt = row_dtype(ins), row_dtype(outs)

    def cut(x: torch.Tensor, f: Field) -> torch.Tensor:
        if in_dt is None:
            return x[:, f.offset:f.offset + f.nbytes].view(f.dtype).reshape(batch, *f.shape)
        at = f.offset // x.element_size()
        return x[:, at:at + f.count].reshape(batch, *f.shape)

    def user_body(x: torch.Tensor) -> torch.Tensor:
        ys = module(*[cut(x, f) for f in ins])
        if isinstance(ys, torch.Tensor):
            ys = (ys,)
        # The padding is put on by F.pad, never by a tensor made in the
        # step (the step structure's item 1).
        if out_dt is not None:
            parts = [y.to(out_dt).reshape(batch, -1) for y in ys]
            cols = sum(f.count for f in outs)
            packed = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
            return F.pad(packed, (0, out_row - cols)) if out_row > cols else packed
        parts = []
        end = 0
        for y, f in zip(ys, outs):
            part = y.to(f.dtype).reshape(batch, -1).contiguous().view(torch.uint8)
            parts.append(F.pad(part, (f.offset - end, 0)) if f.offset > end else part)
            end = f.offset + f.nbytes
        packed = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
        return F.pad(packed, (0, out_row - end)) if out_row > end else packed
    return own_code(user_body, name)


def probe(module: nn.Module, batch: int, ins: list[Field], outs: list[Field]) -> Optional[str]:
    """Run forward once on zeros, eagerly where the module's weights are
    (the host CPU: the worker probes before it moves them), to check the
    outputs' count, shapes and types before any graph is built; the error,
    or None."""
    args = [torch.zeros((batch, *f.shape), dtype=f.dtype, device=next(iter(module.parameters()), torch.empty(0)).device)
            for f in ins]
    with torch.inference_mode():
        try:
            ys = module(*args)
        except Exception as e:
            where = ""
            try:
                where = where_in(e, Path(inspect.getfile(type(module))))
            except (TypeError, OSError):
                pass
            return f"forward on zeros of the declared inputs failed: {type(e).__name__}: {e}{where}"
    try:
        check_outputs(ys, outs, batch)
    except UserModelError as e:
        return str(e)
    return None
