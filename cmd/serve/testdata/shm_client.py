"""A Python client of stepserve's system shared memory, for
TestPythonSharedMemory.

    shm_client.py PROTO_DIR OUT_DIR HTTP_BASE GRPC_ADDR

Creates POSIX shared memory as Triton's clients do: the input with
Python's multiprocessing.shared_memory (shm_open under /dev/shm), the
output by opening a file in /dev/shm, sizing it and mapping it, as
tritonclient.utils.shared_memory's create_shared_memory_region does. It
registers regions of them over HTTP and over gRPC (stubs generated with
grpc_tools from the repository's proto/inference.proto, as grpc_client.py
does), infers the held-out 7 with the input read from shared memory and
the output written to it, reads the status, checks the refusals' codes,
and unregisters everything. Uses Debian's python3, python3-grpcio and
python3-grpc-tools only (no tritonclient).

Prints one line ending in "ok"; any failure raises.
"""

import json
import mmap
import os
import struct
import sys
import urllib.error
import urllib.request
from multiprocessing import shared_memory

import grpc

from grpc_client import SEVEN, argmax, stubs

IN_BYTES = 64 * 4  # pixels, FP32 [1, 64]
OUT_BYTES = 10 * 4  # probabilities, FP32 [1, 10]
OUT_OFFSET = 4096 + 8  # the HTTP answer's place in the output object: not on a page boundary


def http(base, method, path, body=None):
    """The status and JSON answer of an HTTP call; errors are answers too."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def shm_params(region, size, offset=0):
    params = {"shared_memory_region": region, "shared_memory_byte_size": size}
    if offset:
        params["shared_memory_offset"] = offset  # left out when 0, as tritonclient does
    return params


def run(proto_dir, out_dir, base, addr):
    pid = os.getpid()
    in_key, out_key = "/stepserve_py_in_%d" % pid, "/stepserve_py_out_%d" % pid

    # The input: multiprocessing's shared memory, as many clients make it.
    inp = shared_memory.SharedMemory(name=in_key, create=True, size=IN_BYTES)
    # The output: as tritonclient's libcshm does (shm_open, ftruncate, mmap).
    out_path = "/dev/shm" + out_key
    fd = os.open(out_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, OUT_OFFSET + OUT_BYTES)
        out = mmap.mmap(fd, OUT_OFFSET + OUT_BYTES)
        try:
            inp.buf[:IN_BYTES] = struct.pack("<64f", *SEVEN)
            over_http(base, in_key, out_key, out)
            over_grpc(proto_dir, out_dir, addr, in_key, out)
        finally:
            out.close()
    finally:
        os.close(fd)
        os.unlink(out_path)
        inp.close()
        inp.unlink()
    print("system shared memory over HTTP and gRPC: register, status, digits in and out of shared memory, refusals, unregister: ok")


def over_http(base, in_key, out_key, out):
    code, ans = http(base, "POST", "/v2/systemsharedmemory/region/py_in/register", {"key": in_key, "offset": 0, "byte_size": IN_BYTES})
    assert code == 200, ans
    code, ans = http(base, "POST", "/v2/systemsharedmemory/region/py_out/register", {"key": out_key, "offset": 0, "byte_size": OUT_OFFSET + OUT_BYTES})
    assert code == 200, ans

    code, ans = http(base, "GET", "/v2/systemsharedmemory/status")
    assert code == 200 and sorted(r["name"] for r in ans) == ["py_in", "py_out"], ans
    code, ans = http(base, "GET", "/v2/systemsharedmemory/region/py_in/status")
    assert code == 200 and ans == [{"name": "py_in", "key": in_key, "offset": 0, "byte_size": IN_BYTES}], ans
    code, ans = http(base, "GET", "/v2", None)
    assert "system_shared_memory" in ans["extensions"], ans

    # As tritonclient's http InferInput/InferRequestedOutput.set_shared_memory send them.
    req = {"id": "py-shm",
           "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "parameters": shm_params("py_in", IN_BYTES)}],
           "outputs": [{"name": "probabilities", "parameters": dict(binary_data=False, **shm_params("py_out", OUT_BYTES, OUT_OFFSET))}]}
    code, ans = http(base, "POST", "/v2/models/digits/infer", req)
    assert code == 200, ans
    o = ans["outputs"][0]
    assert o["name"] == "probabilities" and o["shape"] == [1, 10] and "data" not in o, o
    assert o["parameters"] == {"shared_memory_region": "py_out", "shared_memory_offset": OUT_OFFSET, "shared_memory_byte_size": OUT_BYTES}, o
    probs = struct.unpack_from("<10f", out, OUT_OFFSET)
    assert argmax(probs) == 7 and probs[7] > 0.99, probs

    for path, body, want in [
        ("/v2/systemsharedmemory/region/py_in/register", {"key": in_key, "byte_size": IN_BYTES}, "already in manager"),
        ("/v2/systemsharedmemory/region/py_x/register", {"key": in_key, "offset": 8, "byte_size": IN_BYTES}, "is 256 bytes, but offset 8 + byte_size 256 needs 264"),
        ("/v2/systemsharedmemory/region/py_x/register", {"key": "/../etc/passwd", "byte_size": 8}, "a key is one name"),
        ("/v2/models/digits/infer", dict(req, inputs=[dict(req["inputs"][0], parameters=shm_params("py_in", 128))]),
         'input "pixels": shared_memory_byte_size is 128 bytes, but FP32 [1 64] needs 256'),
    ]:
        code, ans = http(base, "POST", path, body)
        assert code == 400 and want in ans["error"], (path, code, ans)
    # CUDA shared memory, as a Triton without GPUs: no region, and
    # unregistering succeeds; registering is refused, naming it.
    code, ans = http(base, "GET", "/v2/cudasharedmemory/status")
    assert code == 200 and ans == [], ans
    code, ans = http(base, "POST", "/v2/cudasharedmemory/unregister", {})
    assert code == 200, ans
    code, ans = http(base, "POST", "/v2/cudasharedmemory/region/c/register", {"raw_handle": {"b64": ""}, "device_id": 0, "byte_size": 8})
    assert code == 501 and "cuda_shared_memory" in ans["error"], ans


def over_grpc(proto_dir, out_dir, addr, in_key, out):
    pb, stub = stubs(proto_dir, out_dir, addr)
    # A second region over the same object, as Triton allows.
    stub.SystemSharedMemoryRegister(pb.SystemSharedMemoryRegisterRequest(name="g_in", key=in_key, offset=0, byte_size=IN_BYTES))
    status = stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest())
    assert sorted(status.regions) == ["g_in", "py_in", "py_out"], status
    assert status.regions["g_in"].key == in_key and status.regions["g_in"].byte_size == IN_BYTES, status

    out[:OUT_BYTES] = bytes(OUT_BYTES)
    # As tritonclient's grpc set_shared_memory fills the parameters.
    req = pb.ModelInferRequest(model_name="digits", id="grpc-shm")
    inp = req.inputs.add(name="pixels", datatype="FP32", shape=[1, 64])
    inp.parameters["shared_memory_region"].string_param = "g_in"
    inp.parameters["shared_memory_byte_size"].int64_param = IN_BYTES
    o = req.outputs.add(name="probabilities")
    o.parameters["shared_memory_region"].string_param = "py_out"
    o.parameters["shared_memory_byte_size"].int64_param = OUT_BYTES
    resp = stub.ModelInfer(req)
    assert list(resp.outputs[0].shape) == [1, 10] and list(resp.raw_output_contents) == [b""], resp
    assert resp.outputs[0].parameters["shared_memory_byte_size"].int64_param == OUT_BYTES, resp.outputs[0]
    probs = struct.unpack_from("<10f", out, 0)
    assert argmax(probs) == 7 and probs[7] > 0.99, probs

    for call, want in [
        (lambda: stub.SystemSharedMemoryRegister(pb.SystemSharedMemoryRegisterRequest(name="g_in", key=in_key, byte_size=8)), grpc.StatusCode.ALREADY_EXISTS),
        (lambda: stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest(name="nosuch")), grpc.StatusCode.NOT_FOUND),
        (lambda: stub.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest(name="c")), grpc.StatusCode.NOT_FOUND),
        (lambda: stub.CudaSharedMemoryRegister(pb.CudaSharedMemoryRegisterRequest(name="c", byte_size=8)), grpc.StatusCode.UNIMPLEMENTED),
    ]:
        try:
            call()
            raise AssertionError("accepted; want %s" % want)
        except grpc.RpcError as e:
            assert e.code() == want, e

    stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name="g_in"))
    stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest())  # every region
    assert not stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest()).regions


if __name__ == "__main__":
    run(*sys.argv[1:5])
