"""TEST DOUBLE of the RBLN Compiler's Python API (rebel), beside the
torch_rbln double: RBLNCompiledModel loads a saved artifact by path, and
inspect() returns what the double's torch.compile wrote in it (the
scenario's "host_op_reason"). Never imported by production code outside a
test's PYTHONPATH."""

from __future__ import annotations

import json
import os
from typing import Any


class RBLNCompiledModel:
    def __init__(self, compiled_model: Any) -> None:
        if not isinstance(compiled_model, (str, os.PathLike)):
            raise TypeError("compiled_model must be a path to a .rbln file")
        with open(compiled_model) as f:
            self._info = json.load(f)

    def inspect(self) -> dict[str, Any]:
        return dict(self._info)
