"""A Python gRPC client of stepserve, for TestPythonGRPCClients.

    grpc_client.py MODE PROTO_DIR OUT_DIR ADDR

Generates the stubs with grpc_tools (Debian's python3-grpc-tools) from the
repository's proto/inference.proto into OUT_DIR, then talks to the server
at ADDR with Debian's python3-grpcio:

    raw         raw contents in and out, as tritonclient sends and reads
                them; BYTES in Triton's serialization; an error's code and
                message; the repository index and log settings
    typed       typed contents in, as KServe's clients and Triton's
                explicit-content examples send them; raw contents out,
                as Triton answers them
    stream      ModelStreamInfer with a language model, as tritonclient's
                streaming clients use it
    compressed  calls compressed with gzip (on the channel) and deflate
                (on the call), as tritonclient's compression_algorithm
                makes them

Prints one line ending in "ok"; any failure raises.
"""

import importlib
import struct
import sys

import grpc
from grpc_tools import protoc

# A held-out 7 (README, "Try it").
SEVEN = [0, 0, 2, 13, 16, 14, 1, 0, 0, 0, 11, 12, 7, 16, 3, 0, 0, 0, 9, 3, 2, 16, 3, 0, 0, 0, 0, 0, 9, 11, 0, 0,
         0, 0, 2, 11, 15, 13, 3, 0, 0, 0, 4, 15, 16, 13, 3, 0, 0, 0, 0, 14, 8, 0, 0, 0, 0, 0, 5, 15, 4, 0, 0, 0]


def generate(proto_dir, out_dir, files, descriptor=None):
    args = ["protoc", "-I" + proto_dir, "--python_out=" + out_dir, "--grpc_python_out=" + out_dir] + files
    if descriptor:
        args = ["protoc", "-I" + proto_dir, "--descriptor_set_out=" + descriptor] + files
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed for %s" % files)
    sys.path.insert(0, out_dir)


def argmax(values):
    return max(range(len(values)), key=lambda i: values[i])


def stubs(proto_dir, out_dir, addr, compression=None):
    generate(proto_dir, out_dir, ["inference.proto"])
    pb = importlib.import_module("inference_pb2")
    channel = grpc.insecure_channel(addr, compression=compression)
    return pb, importlib.import_module("inference_pb2_grpc").GRPCInferenceServiceStub(channel)


def fp32(raw):
    return struct.unpack("<%df" % (len(raw) // 4), raw)


def raw(proto_dir, out_dir, addr):
    pb, stub = stubs(proto_dir, out_dir, addr)

    assert stub.ServerLive(pb.ServerLiveRequest()).live
    assert stub.ServerReady(pb.ServerReadyRequest()).ready
    assert stub.ModelReady(pb.ModelReadyRequest(name="digits")).ready
    md = stub.ModelMetadata(pb.ModelMetadataRequest(name="digits"))
    assert md.inputs[0].name == "pixels" and list(md.inputs[0].shape) == [-1, 64], md

    req = pb.ModelInferRequest(model_name="digits", id="py")
    inp = req.inputs.add(name="pixels", datatype="FP32", shape=[1, 64])
    req.raw_input_contents.append(struct.pack("<64f", *SEVEN))
    req.parameters["priority"].uint64_param = 1
    resp = stub.ModelInfer(req)
    assert resp.id == "py" and resp.model_name == "digits", resp
    assert list(resp.outputs[0].shape) == [1, 10], resp.outputs
    probs = struct.unpack("<10f", resp.raw_output_contents[0])
    assert argmax(probs) == 7, probs

    texts = [b"The water is warm.", b"Children play near the river."]
    req = pb.ModelInferRequest(model_name="tiny-encoder")
    req.inputs.add(name="text", datatype="BYTES", shape=[2])
    req.raw_input_contents.append(b"".join(struct.pack("<I", len(t)) + t for t in texts))
    resp = stub.ModelInfer(req)
    assert list(resp.outputs[0].shape) == [2, 128], resp.outputs
    emb = struct.unpack("<256f", resp.raw_output_contents[0])
    norm = sum(v * v for v in emb[:128])
    assert abs(norm - 1) < 1e-4, norm  # normalize: true

    req = pb.ModelInferRequest(model_name="digits")
    req.inputs.add(name="image", datatype="FP32", shape=[1, 64])
    req.raw_input_contents.append(struct.pack("<64f", *SEVEN))
    try:
        stub.ModelInfer(req)
        raise AssertionError("an unknown input was accepted")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
        assert 'unknown input "image"' in e.details(), e.details()
    try:
        stub.ModelConfig(pb.ModelConfigRequest(name="nope"))
        raise AssertionError("an unknown model has a config")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, e

    # Read-only administration, with model control off.
    index = stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True))
    assert "digits" in [m.name for m in index.models], index
    logs = stub.LogSettings(pb.LogSettingsRequest()).settings
    assert logs["log_info"].WhichOneof("parameter_choice") == "bool_param", logs
    assert logs["log_verbose_level"].WhichOneof("parameter_choice") == "uint32_param", logs
    print("raw contents: live, ready, metadata, FP32 and BYTES inference, errors, index, log settings: ok")


def typed(proto_dir, out_dir, addr):
    pb, stub = stubs(proto_dir, out_dir, addr)

    assert stub.ServerLive(pb.ServerLiveRequest()).live
    assert stub.ModelReady(pb.ModelReadyRequest(name="digits")).ready
    meta = stub.ServerMetadata(pb.ServerMetadataRequest())
    assert meta.name == "stepserve", meta
    req = pb.ModelInferRequest(model_name="digits")
    inp = req.inputs.add(name="pixels", datatype="FP32", shape=[2, 64])
    inp.contents.fp32_contents.extend(SEVEN + SEVEN)
    resp = stub.ModelInfer(req)
    assert not resp.outputs[0].HasField("contents"), "typed in, raw out, as Triton answers"
    probs = fp32(resp.raw_output_contents[0])
    assert len(probs) == 20 and argmax(probs[:10]) == 7 and argmax(probs[10:]) == 7, probs

    req = pb.ModelInferRequest(model_name="tiny-encoder")
    req.inputs.add(name="text", datatype="BYTES", shape=[1]).contents.bytes_contents.append("Die Kinder spielen am Fluss.".encode())
    resp = stub.ModelInfer(req)
    assert len(fp32(resp.raw_output_contents[0])) == 128, resp.outputs
    print("typed contents: live, ready, metadata, FP32 and BYTES inference: ok")


def stream(proto_dir, out_dir, addr):
    """ModelStreamInfer as tritonclient's start_stream and
    async_stream_infer use it with Triton's vLLM backend: text_input and a
    sampling_parameters JSON input, a response per piece, the final one
    flagged (an empty one when enable_empty_final_response asks)."""
    pb, stub = stubs(proto_dir, out_dir, addr)

    def request(rid, empty_final):
        req = pb.ModelInferRequest(model_name="tiny-llama", id=rid)
        req.inputs.add(name="text_input", datatype="BYTES", shape=[1])
        req.inputs.add(name="sampling_parameters", datatype="BYTES", shape=[1])
        req.inputs.add(name="stream", datatype="BOOL", shape=[1])
        text = "Once upon a time".encode()
        params = b'{"max_tokens": 16, "temperature": 0, "ignore_eos": true}'
        req.raw_input_contents.extend([struct.pack("<I", len(text)) + text,
                                       struct.pack("<I", len(params)) + params, b"\x01"])
        req.parameters["triton_enable_empty_final_response"].bool_param = empty_final
        return req

    pieces, finals = {"x": [], "y": []}, {"x": 0, "y": 0}
    for r in stub.ModelStreamInfer(iter([request("x", True), request("y", False)])):
        assert not r.error_message, r.error_message
        resp = r.infer_response
        assert finals[resp.id] == 0, "a response after the final one"
        for raw in resp.raw_output_contents:
            (n,) = struct.unpack("<I", raw[:4])
            pieces[resp.id].append(raw[4:4 + n].decode())
        if resp.parameters["triton_final_response"].bool_param:
            finals[resp.id] += 1
            if resp.id == "x":
                assert not resp.raw_output_contents, "the empty final response"
    assert finals == {"x": 1, "y": 1}, finals
    assert "".join(pieces["x"]) == "".join(pieces["y"]) != "", pieces
    print("stream: decoupled generation, %d pieces, final flags: ok" % len(pieces["x"]))


def compressed(proto_dir, out_dir, addr):
    """Calls compressed as tritonclient's compression_algorithm compresses
    them (gRPC's gzip and deflate, per call), here also on the channel;
    the server answers in the call's encoding, which grpcio reads."""
    pb, stub = stubs(proto_dir, out_dir, addr, compression=grpc.Compression.Gzip)

    raw_req = pb.ModelInferRequest(model_name="digits")
    raw_req.inputs.add(name="pixels", datatype="FP32", shape=[1, 64])
    raw_req.raw_input_contents.append(struct.pack("<64f", *SEVEN))
    typed_req = pb.ModelInferRequest(model_name="digits")
    typed_req.inputs.add(name="pixels", datatype="FP32", shape=[1, 64]).contents.fp32_contents.extend(SEVEN)
    for algorithm in (None, grpc.Compression.Gzip, grpc.Compression.Deflate):
        for req in (raw_req, typed_req):
            resp = stub.ModelInfer(req, compression=algorithm)
            probs = fp32(resp.raw_output_contents[0])
            assert argmax(probs) == 7, (algorithm, probs)
    assert stub.ModelReady(pb.ModelReadyRequest(name="digits"), compression=grpc.Compression.Deflate).ready
    print("compressed: gzip and deflate, raw and typed contents in, raw out: ok")


if __name__ == "__main__":
    mode, proto_dir, out_dir, addr = sys.argv[1:5]
    {"raw": raw, "typed": typed, "stream": stream, "compressed": compressed}[mode](proto_dir, out_dir, addr)
