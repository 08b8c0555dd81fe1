"""A reader and writer for the safetensors format (the library is not in
Debian): an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the data."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}
_SIZES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
_NAMES = {v: k for k, v in _DTYPES.items()}
_MAX_HEADER = 100 << 20


class SafetensorsError(ValueError):
    """The file is malformed; the message names the file and the tensor."""


def load(path: Path, keep_dtype: bool = False, skip: frozenset[str] | set[str] = frozenset()) -> dict[str, torch.Tensor]:
    """Every tensor of the file but those in skip, as CPU tensors: floating
    ones as float32 unless keep_dtype, integer and boolean ones as stored.
    Each tensor's bytes are read on their own, so that a skipped one (a
    masked LM's lm_head, say) is never read and the file is never held
    whole."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        head = f.read(8)
        if len(head) < 8:
            raise SafetensorsError(f"{path}: {size} bytes, shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or n > size - 8:
            raise SafetensorsError(f"{path}: header length {n} runs past the end of the {size}-byte file")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SafetensorsError(f"{path}: header is not JSON: {e}") from None
        if not isinstance(header, dict):
            raise SafetensorsError(f"{path}: header is not a JSON object")
        start, data_len = 8 + n, size - 8 - n
        out: dict[str, torch.Tensor] = {}
        for name, entry in header.items():
            if name == "__metadata__" or name in skip:
                continue
            try:
                dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise SafetensorsError(f"{path}: tensor {name!r}: bad header entry") from None
            if dtype not in _DTYPES:
                raise SafetensorsError(f"{path}: tensor {name!r}: dtype {dtype!r} is not supported; want one of {', '.join(_DTYPES)}")
            count = 1
            for d in shape:
                count *= d
            if not (0 <= begin <= end <= data_len) or end - begin != count * _SIZES[dtype]:
                raise SafetensorsError(f"{path}: tensor {name!r}: data_offsets [{begin}, {end}] do not hold {dtype}{shape}")
            if count:
                f.seek(start + begin)
                t = torch.frombuffer(bytearray(f.read(end - begin)), dtype=_DTYPES[dtype])
            else:
                t = torch.empty(0, dtype=_DTYPES[dtype])
            t = t.reshape(shape)
            out[name] = t.float() if t.is_floating_point() and not keep_dtype else t
    return out


def load_all(paths: list[Path], skip: frozenset[str] | set[str] = frozenset()) -> dict[str, torch.Tensor]:
    """The tensors of weights sharded over several files (one file is one
    shard), one shard read at a time; a tensor in two shards is an error."""
    out: dict[str, torch.Tensor] = {}
    for path in paths:
        for name, t in load(path, skip=skip).items():
            if name in out:
                raise SafetensorsError(f"{path}: tensor {name!r} is in two shards")
            out[name] = t
    return out


def save(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """Write tensors (a state_dict) as safetensors, names sorted, the same
    bytes for the same tensors every time."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    blobs: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        if t.dtype not in _NAMES:
            raise SafetensorsError(f"tensor {name!r}: dtype {t.dtype} cannot be written")
        blob = bytes(t.view(-1).view(torch.uint8)) if t.dtype != torch.bool else bytes(t.view(-1).to(torch.uint8).tolist())
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)
