"""The expected answers of an architecture torch model, computed by torch
directly: `reference.py DIR init` writes DIR/weights.safetensors from the
module's seeded initialisation; `reference.py DIR CASES` reads a JSON list
of {input name: nested list} and prints, per case, {output name: nested
list}, with the model built and loaded as the worker does. DIR/spec.json gives
the module file, its config and the signature (the test writes it from
model.yaml)."""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "engine" / "rbln" / "worker"))
from stepserve_worker import safetensors, usermodel  # noqa: E402

DTYPES = {"FP32": torch.float32, "INT64": torch.int64, "INT32": torch.int32, "FP16": torch.float16,
          "BF16": torch.bfloat16, "UINT8": torch.uint8, "BOOL": torch.bool}


def main() -> int:
    d, what = Path(sys.argv[1]), sys.argv[2]
    cfg = json.loads((d / "spec.json").read_text())
    torch.manual_seed(1234)
    mod = usermodel.import_file(d / cfg["module"], "reference").build(cfg["config"]).eval()
    if what == "init":
        safetensors.save(mod.state_dict(), d / "weights.safetensors")
        return 0
    usermodel.load_weights(mod, d / "weights.safetensors")
    out = []
    with torch.inference_mode():
        for case in json.loads(Path(what).read_text()):
            args = [torch.tensor(case[i["name"]], dtype=DTYPES[i["datatype"]]) for i in cfg["inputs"]]
            ys = mod(*args)
            ys = (ys,) if isinstance(ys, torch.Tensor) else ys
            out.append({o["name"]: y.tolist() for o, y in zip(cfg["outputs"], ys)})
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
