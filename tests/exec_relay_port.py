"""An exec port that relays every call to dsv4spec.impl: the protocol carries what the other rule
families pass and return (strings, ints, keyword arguments such as model= and layer=, dicts of
tensors, numbers and dicts of stages as results).  Replies are encoded with the suite's own
encode_value; requests are decoded here, from PROTOCOL.md."""
import sys
from urllib.parse import unquote

import numpy as np
import torch

import dsv4spec.impl as impl
from dsv4spec.properties.exec_target import DTYPES, ProtocolError, encode_value

IN, OUT = sys.stdin.buffer, sys.stdout.buffer
OPS = ["index_visible", "index_weights", "entry_pack", "entry_unpack", "kv_bytes_per_token", "window_bytes_per_layer",
       "window_index", "compressed_index", "attention_index", "compress", "index_layer"]


def rec():
    words = IN.readline().decode().rstrip("\n").split(" ")
    f, k = dict(w.split("=", 1) for w in words[1:]), words[0]
    key = unquote(f["key"]) if "key" in f else None
    if k == "tensor":
        shape = [int(d) for d in f["shape"].split(",") if d]
        a = np.frombuffer(IN.read(int(f["nbytes"])), DTYPES[f["dtype"]][0]).reshape(shape)
        if f["dtype"] == "bfloat16":
            return key, torch.from_numpy(a.copy()).view(torch.bfloat16)
        return key, torch.from_numpy(a.astype(bool) if f["dtype"] == "bool" else a.astype(a.dtype.newbyteorder("=")))
    if k == "int":
        return key, int(f["value"])
    if k == "float":
        return key, float.fromhex(f["value"]) if "0x" in f["value"] else float(f["value"])
    if k == "str":
        return key, unquote(f.get("value", ""))
    if k == "bool":
        return key, f["value"] == "1"
    if k == "none":
        return key, None
    items = [rec() for _ in range(int(f["n"]))]
    return key, ([v for _, v in items] if k == "list" else dict(items))


def error(kind: str, text: str) -> bytes:
    """An error reply: its message the first line of `text`, in ASCII (a header line is ASCII,
    PROTOCOL.md), any other character written as Python's backslash escape."""
    message = text.splitlines()[0] if text else ""
    return f"error kind={kind} message=".encode() + message.encode("ascii", "backslashreplace") + b"\n"


IN.readline()
OUT.write(f"hello protocol=1 name=relay ops={','.join(OPS)} claims_conformance=1\n".encode())
OUT.flush()
while line := IN.readline():
    f = dict(w.split("=", 1) for w in line.decode().split()[1:])
    args = [rec()[1] for _ in range(int(f["args"]))]
    kwargs = dict(rec() for _ in range(int(f["kwargs"])))
    try:
        r = getattr(impl, f["op"])(*args, **kwargs)
        vals = r if isinstance(r, tuple) else (r,)
        body = b"".join(b for v in vals for b in encode_value(v, "result"))
        OUT.write(f"ok n={len(vals)}\n".encode() + body)
    except (ValueError, TypeError) as e:
        OUT.write(error(type(e).__name__, str(e)))
    except ProtocolError as e:
        OUT.write(error("Unsupported", str(e)))
    OUT.flush()
