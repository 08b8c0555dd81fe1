"""A reader for the safetensors format (the library is not in Debian)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_SIZES = {"F32": 4, "F16": 2, "BF16": 2}
_MAX_HEADER = 100 << 20


class SafetensorsError(ValueError):
    """The file is malformed; the message names the file and the tensor."""


def load(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the file, as float32 CPU tensors."""
    raw = Path(path).read_bytes()
    if len(raw) < 8:
        raise SafetensorsError(f"{path}: {len(raw)} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > _MAX_HEADER or n > len(raw) - 8:
        raise SafetensorsError(f"{path}: header length {n} runs past the end of the {len(raw)}-byte file")
    try:
        header = json.loads(raw[8:8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    data = raw[8 + n:]
    out: dict[str, torch.Tensor] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(f"{path}: tensor {name!r}: bad header entry") from None
        if dtype not in _DTYPES:
            raise SafetensorsError(f"{path}: tensor {name!r}: dtype {dtype!r} is not supported; want F32, F16 or BF16")
        count = 1
        for d in shape:
            count *= d
        if not (0 <= begin <= end <= len(data)) or end - begin != count * _SIZES[dtype]:
            raise SafetensorsError(f"{path}: tensor {name!r}: data_offsets [{begin}, {end}] do not hold {dtype}{shape}")
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=_DTYPES[dtype]) if count else torch.empty(0, dtype=_DTYPES[dtype])
        out[name] = t.reshape(shape).float()
    return out
