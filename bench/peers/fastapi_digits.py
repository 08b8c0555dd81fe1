#!/usr/bin/python3
"""The peer stepserve is measured against: a FastAPI + uvicorn server (Debian
packages) serving the same digits MLP in PyTorch, with the same Open
Inference Protocol JSON request and response, the way a hand-rolled Python
server would. Not part of stepserve.

    /usr/bin/python3 -m uvicorn --app-dir bench/peers fastapi_digits:app --workers 2 --port 9100
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

WEIGHTS = Path(os.environ.get("DIGITS_WEIGHTS", Path(__file__).resolve().parents[2] / "model_repository/digits/weights.safetensors"))


def load(path: Path) -> dict[str, torch.Tensor]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = torch.frombuffer(bytearray(raw[8 + n + b:8 + n + end]), dtype=torch.float32).reshape(e["shape"])
    return out


w = load(WEIGHTS)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10), torch.nn.Softmax(dim=-1))
with torch.no_grad():
    model[0].weight.copy_(w["layers.0.weight"])
    model[0].bias.copy_(w["layers.0.bias"])
    model[2].weight.copy_(w["layers.1.weight"])
    model[2].bias.copy_(w["layers.1.bias"])
model.eval()
torch.set_num_threads(1)

app = FastAPI()


class Input(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    data: list[float]


class Request(BaseModel):
    inputs: list[Input]


@app.post("/v2/models/digits/infer")
def infer(req: Request) -> dict:
    x = req.inputs[0]
    if x.name != "pixels" or x.datatype != "FP32" or len(x.shape) != 2 or x.shape[1] != 64:
        raise HTTPException(400, "want pixels FP32 [n, 64]")
    with torch.inference_mode():
        y = model(torch.tensor(x.data, dtype=torch.float32).reshape(x.shape))
    return {"model_name": "digits", "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": list(y.shape), "data": y.reshape(-1).tolist()}]}
