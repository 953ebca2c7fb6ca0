"""A port over the exec protocol (PROTOCOL.md), written from PROTOCOL.md with the standard library
only, that misbehaves on request: tests/test_exec_target.py drives it by environment variables.

    FAKE_FAULT   what goes wrong (default: nothing): crash, hang, junk, junk_first, short, nbytes,
                 dtype, float64, trailing, huge_line, chatter, chatter_crash, value_error,
                 port_error, not_implemented, swap_nibbles; values (every kind of result); at
                 the handshake: no_hello, silent, bad_hello, protocol_2, unknown_op,
                 no_ops (ops= empty); deaf
                 (reads no request); at its end: leaves_child, leaves_session (starts a process,
                 in its own group or in a session of its own, writes its pid to $FAKE_PIDS, exits)
    FAKE_OP      the one operation that misbehaves (default: every one)
    FAKE_HELLO   extra words for the hello line (e.g. "variants=nibble_order:high_first")

Operations: e2m1_decode, e8m0_decode, fp4_pack, fp4_unpack.
"""
import math
import os
import signal
import struct
import sys
import time

FAULT = os.environ.get("FAKE_FAULT", "")
ONLY = os.environ.get("FAKE_OP", "")
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
IN, OUT = sys.stdin.buffer, sys.stdout.buffer


def fields(line):
    words = line.decode().rstrip("\n").split(" ")
    return words[0], dict(w.split("=", 1) for w in words[1:])


def read_value():
    kind, f = fields(IN.readline())
    if kind == "tensor":
        return bytes(IN.read(int(f["nbytes"]))), [int(d) for d in f["shape"].split(",") if d]
    if kind == "int":
        return int(f["value"])
    return f.get("value")


def tensor(dtype, shape, data, nbytes=None):
    size = len(data) if nbytes is None else nbytes
    return f"tensor dtype={dtype} shape={','.join(map(str, shape))} nbytes={size}\n".encode() + data


def compute(op, args):
    data, shape = args[0]
    if op == "e2m1_decode":
        if any(c > 15 for c in data):
            return b"error kind=ValueError message=codes must be nibbles 0..15\n"
        return tensor("float32", shape, struct.pack(f"<{len(data)}f", *(E2M1[c] for c in data)))
    if op == "e8m0_decode":
        values = [math.nan if b == 255 else math.ldexp(1.0, b - 127) for b in data]
        if FAULT == "float64":
            return tensor("float64", shape, struct.pack(f"<{len(data)}d", *values))
        return tensor("float32", shape, struct.pack(f"<{len(data)}f", *values))
    if op == "fp4_pack":
        low, high = (1, 0) if FAULT == "swap_nibbles" else (0, 1)
        packed = bytes(data[i + low] | data[i + high] << 4 for i in range(0, len(data), 2))
        return tensor("uint8", shape[:-1] + [shape[-1] // 2], packed)
    if op == "fp4_unpack":
        codes = bytes(c for b in data for c in ((b >> 4, b & 15) if FAULT == "swap_nibbles" else (b & 15, b >> 4)))
        return tensor("uint8", shape[:-1] + [shape[-1] * 2], codes)
    raise AssertionError(op)


def reply(op, args):
    body = compute(op, args)
    if body.startswith(b"error"):
        return body
    good = b"ok n=1\n" + body
    fault = FAULT if not ONLY or op == ONLY else ""
    if fault == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "hang":
        time.sleep(3600)
    if fault == "junk":
        return b"Segmentation fault? no: just a debug print\n"
    if fault == "junk_first":
        return b"debug: computing " + op.encode() + b"\n" + good
    if fault == "short":
        OUT.write(good[:len(good) - 3])
        OUT.flush()
        sys.exit(3)
    if fault == "nbytes":
        head, _, data = body.partition(b"\n")
        return b"ok n=1\n" + head.replace(b"nbytes=", b"nbytes=1") + b"\n" + data + b"\x00" * 100
    if fault == "dtype":
        return good.replace(b"dtype=float32", b"dtype=float8").replace(b"dtype=uint8", b"dtype=float8")
    if fault == "trailing":
        return good + b"left over\n"
    if fault in ("chatter", "chatter_crash"):
        sys.stderr.write(f"chatter: {op} called\n" * 50)
        sys.stderr.flush()
    if fault == "chatter_crash":
        sys.exit(7)
    if fault == "values":
        return (b"ok n=3\ndict n=3\nint value=-5 key=a\nfloat value=0x1.8p+1 key=b\nlist n=2 key=c\n"
                b"str value=x%20y\nnone\nbool value=1\ntensor dtype=bfloat16 shape=2 nbytes=4\n\x80\x3f\x00\xc0")
    if fault == "huge_line":
        return b"x" * 70000
    if fault == "value_error":
        return b"error kind=ValueError message=rejected: NaN in block 3\n"
    if fault == "port_error":
        return b"error kind=OutOfMemory message=device memory exhausted (needed 12 MiB)\n"
    if fault == "not_implemented":
        return b"error kind=NotImplementedError message=only rows of 32\n"
    return good


def leave_a_process():
    import subprocess
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"],
                             start_new_session=FAULT == "leaves_session", stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.environ["FAKE_PIDS"], "w") as f:
        f.write(f"{child.pid}\n")


def main():
    if FAULT == "no_hello":
        sys.exit(0)
    if FAULT == "silent":
        time.sleep(3600)
    IN.readline()
    ops = "e2m1_decode,e8m0_decode,fp4_pack,fp4_unpack" + (",fp4_frobnicate" if FAULT == "unknown_op" else "")
    ops = "" if FAULT == "no_ops" else ops
    hello = {"bad_hello": "hi there\n",
             "protocol_2": f"hello protocol=2 ops={ops}\n"}.get(
        FAULT, f"hello protocol=1 name=fake%20port ops={ops} claims_conformance=1 version=0.1 "
               f"{os.environ.get('FAKE_HELLO', '')}".rstrip() + "\n")
    OUT.write(hello.encode())
    OUT.flush()
    if FAULT == "deaf":
        time.sleep(3600)
    while True:
        line = IN.readline()
        if not line:
            return leave_a_process() if FAULT in ("leaves_child", "leaves_session") else None
        kind, f = fields(line)
        assert kind == "call", line
        args = [read_value() for _ in range(int(f["args"]) + int(f["kwargs"]))]
        OUT.write(reply(f["op"], args))
        OUT.flush()


if __name__ == "__main__":
    main()
