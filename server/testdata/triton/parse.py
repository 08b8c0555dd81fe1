"""Parse JSON documents as Triton protocol messages, strictly.

Usage: parse.py PROTO_OUT_DIR MESSAGE=FILE ...

PROTO_OUT_DIR holds inference_pb2.py (protoc --python_out of the
repository's proto/inference.proto). Each FILE is parsed as inference.MESSAGE with
google.protobuf.json_format.Parse, which refuses an unknown field, an
unknown enum name and a value of the wrong type. Prints one JSON line per
file: the message as json_format reads it back, so the caller can check
the values arrived. Exits 1 at the first document that does not parse.
"""

import json
import sys

sys.path.insert(0, sys.argv[1])

from google.protobuf import json_format  # noqa: E402

import inference_pb2  # noqa: E402

for arg in sys.argv[2:]:
    name, path = arg.split("=", 1)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        msg = json_format.Parse(text, getattr(inference_pb2, name)())
    except json_format.ParseError as e:
        print(f"{path}: not a valid {name}: {e}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"file": path, "message": json_format.MessageToDict(msg, preserving_proto_field_name=True)}))
