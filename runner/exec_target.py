"""The exec target: a port in any language, run as a child process and called over the protocol
of PROTOCOL.md (version 1) on its standard input and output.

    --target exec:CMD        CMD split like a shell line; a first word with a "/" is a path
                             relative to the working directory, otherwise looked up on PATH

`load(spec)` starts the port, reads its handshake and returns a Target whose provider (`Port`)
turns every operation call into one request and its reply back into tensors.  Everything a port
can do wrong on the wire (crash, hang, junk, wrong sizes, unknown dtypes, bytes after a reply) is a
ProtocolError (reported ERROR) or an OperationTimeout (TIMEOUT) naming what was expected; the port
is then killed and a fresh one answers the next call.
"""
from __future__ import annotations

import atexit
import contextlib
import itertools
import math
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from urllib.parse import quote, unquote

import numpy as np

from dsv4spec.parent_death import signal_on_parent_death
from dsv4spec.processes import in_group, processes_left

from .contract import (DEFAULT_TIMEOUT_S, SHAPES, WATCH, NotImplementedOp, NothingImplemented, OperationTimeout,
                       Target, TargetLoadError, TargetNotFound, known_ops)

PREFIX = "exec:"
PROTOCOL = 1
MAX_LINE = 65536
EXIT_GRACE_S = 1.0
START_VARIABLE = "DSV4SPEC_EXEC_START_S"     # seconds a port may take to answer the handshake
STDERR_TAIL = 2000          # characters of the port's standard error shown with an error
MAX_REPLY_BYTES = 1 << 30   # tensor bytes one reply may declare, whatever the operation
MAX_REPLY_RECORDS = 1 << 16  # value records one reply may hold (a result is a few tensors, a dict of them)
INT64 = (-(1 << 63), (1 << 63) - 1)
MARKER = "DSV4SPEC_EXEC_PORT"    # in every port's environment, so that what it leaves anywhere is found
WIDEST = 8                  # bytes of the widest element a reply may send (int64, float64)

# dtype name -> (numpy little-endian dtype, element size); bfloat16 travels as its 16-bit pattern
DTYPES = {"bool": ("|b1", 1), "uint8": ("|u1", 1), "int8": ("|i1", 1), "int16": ("<i2", 2),
          "int32": ("<i4", 4), "int64": ("<i8", 8), "float16": ("<f2", 2), "bfloat16": ("<i2", 2),
          "float32": ("<f4", 4), "float64": ("<f8", 8)}
VALUE_KINDS = ("tensor", "int", "float", "str", "bool", "none", "list", "dict")
ERROR_KINDS = {"ValueError": ValueError, "TypeError": TypeError}


class ProtocolError(Exception):
    """The port broke the protocol (or died): reported ERROR, with what was expected."""


class PortError(Exception):
    """The port answered `error` with a kind other than ValueError/TypeError/NotImplementedError."""


def command(spec: str) -> list[str]:
    """The argv of an `exec:CMD` spec, its program resolved; TargetNotFound for a malformed spec,
    TargetLoadError for a program that cannot be started (no such file or program, not executable:
    exit status 3, PROTOCOL.md)."""
    text = spec[len(PREFIX):]
    try:
        argv = shlex.split(text)
    except ValueError as e:
        raise TargetNotFound(f"target {spec!r}: cannot split the command ({e})") from None
    if not argv:
        raise TargetNotFound(f"target {spec!r}: no command after {PREFIX!r}; write exec:./myport or "
                             f"exec:'myport --flag'")
    program = argv[0]
    if "/" in program:
        path = os.path.abspath(program)
        if not os.path.isfile(path):
            raise TargetLoadError(f"target {spec!r}: no file {path} (a path is relative to the working "
                                 f"directory {os.getcwd()}; build the port first?)")
        if not os.access(path, os.X_OK):
            raise TargetLoadError(f"target {spec!r}: {path} is not executable")
    else:
        path = shutil.which(program)
        if path is None:
            raise TargetLoadError(f"target {spec!r}: no program {program!r} on PATH (write ./{program} for a "
                                 f"file in the working directory)")
    return [path] + argv[1:]


def load(spec: str) -> Target:
    """Start the port of `exec:CMD`, read its handshake, and return it as a Target."""
    port = Port(spec, command(spec))
    try:
        target = Target(port, spec)
    except ValueError as e:         # VARIANTS or EXTENSIONS the registry does not know
        port.close()
        raise TargetLoadError(f"target {spec!r}: {e}") from None
    port.timeout_of = weakref.ref(target)
    return target


def _contract_number(text: str, where: str) -> int:
    """A declared contract version: a decimal integer (Target checks its range)."""
    if not text.isdigit():
        raise TargetLoadError(f"{where} must be the contract version the port was written against, an integer "
                              f"(`dsv4spec ops --json` states this suite's), got {text!r}")
    return int(text)


# ------------------------------------------------------------------------------------------------
# The wire format
# ------------------------------------------------------------------------------------------------

def _text(value: str) -> str:
    return quote(value, safe="")


def _header(kind: str, **fields) -> bytes:
    words = [kind] + [f"{k}={v}" for k, v in fields.items() if v is not None]
    return (" ".join(words) + "\n").encode("ascii")


def encode_value(value, where: str, key: str | None = None) -> list[bytes]:
    """The records of one argument (a header, then raw bytes for a tensor)."""
    import torch
    key = None if key is None else _text(key)
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return _encode_tensor(value, where, key)
    if isinstance(value, (bool, np.bool_)):
        return [_header("bool", value=int(bool(value)), key=key)]
    if isinstance(value, (int, np.integer)):
        return [_header("int", value=int(value), key=key)]
    if isinstance(value, (float, np.floating)):
        return [_header("float", value=float(value).hex(), key=key)]
    if isinstance(value, str):
        return [_header("str", value=_text(value), key=key)]
    if value is None:
        return [_header("none", key=key)]
    if isinstance(value, (list, tuple)):
        return [_header("list", n=len(value), key=key)] + \
            [r for i, v in enumerate(value) for r in encode_value(v, f"{where}[{i}]")]
    if isinstance(value, dict):
        return [_header("dict", n=len(value), key=key)] + \
            [r for k, v in value.items() for r in encode_value(v, f"{where}[{k!r}]", key=str(k))]
    raise ProtocolError(f"{where} is a {type(value).__module__}.{type(value).__name__}, which protocol "
                        f"{PROTOCOL} cannot send (it sends tensors, ints, floats, strs, bools, None, lists "
                        f"and dicts)")


def _encode_tensor(t, where, key) -> list[bytes]:
    import torch
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu().contiguous()
        name = str(t.dtype).removeprefix("torch.")
        array = t.view(torch.int16).numpy() if name == "bfloat16" else t.numpy()
    else:
        name, array = str(t.dtype), t
    if name not in DTYPES:
        raise ProtocolError(f"{where} has dtype {name}, which protocol {PROTOCOL} cannot send "
                            f"(dtypes: {', '.join(DTYPES)})")
    data = np.ascontiguousarray(array).astype(DTYPES[name][0], copy=False).tobytes()
    shape = ",".join(str(d) for d in array.shape)
    return [_header("tensor", dtype=name, shape=shape, nbytes=len(data), key=key), data]


def parse_header(line: bytes, expected: str, kinds) -> tuple[str, dict]:
    """(kind, fields) of a header line whose kind is one of `kinds`; ProtocolError naming
    `expected` if it is not such a line."""
    try:
        text = line.decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError(f"expected {expected}, got a line that is not ASCII: {_show(line)}") from None
    head, message_follows, message = text.partition(" message=")
    words = head.split(" ")
    kind, fields = words[0], {}
    if kind not in kinds:
        raise ProtocolError(f"expected {expected}, got {_show(line)}")
    for word in words[1:]:
        k, eq, v = word.partition("=")
        if not eq or not k:
            raise ProtocolError(f"expected {expected}, got {_show(line)} (the word {word!r} is not key=value)")
        fields[k] = v
    if message_follows:
        fields["message"] = message
    return kind, fields


def _show(data: bytes, limit: int = 120) -> str:
    text = repr(bytes(data[:limit]))
    return text + (f" … ({len(data)} bytes)" if len(data) > limit else "")


def _int(fields: dict, key: str, what: str) -> int:
    if key not in fields:
        raise ProtocolError(f"{what} has no {key}=")
    return _int64(fields[key], f"{what}: {key}")


def _int64(text: str, what: str) -> int:
    """The 64-bit signed integer `text` (PROTOCOL.md); ProtocolError naming `what` otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise ProtocolError(f"{what}={text!r} is not an integer") from None
    if not INT64[0] <= value <= INT64[1]:
        raise ProtocolError(f"{what}={text[:40]}{'…' if len(text) > 40 else ''} is beyond a 64-bit signed integer")
    return value


def _sized(op: str, values: tuple, args: tuple, kwargs: dict):
    """ProtocolError when a result tensor holds another number of elements than the contract fixes
    for this request's inputs: a reply to another request, or a wrong size, named as such."""
    shapes = _result_shapes(op, args, kwargs) or []
    for i, (value, shape) in enumerate(zip(values, shapes if len(values) == len(shapes) else ())):
        if hasattr(value, "numel") and value.numel() != math.prod(shape):
            what = f"{op} result {i}" if len(values) > 1 else f"{op} result"
            raise ProtocolError(f"{what} holds {value.numel()} elements (shape {list(value.shape)}); this request's "
                                f"inputs make it {list(shape)}, {math.prod(shape)} elements: a reply to another "
                                f"request, or a wrong size")


def reply_limit(op: str, args: tuple, kwargs: dict) -> int:
    """The tensor bytes a reply to this request may hold: its results' shapes (where the contract
    fixes them) at the widest element, within MAX_REPLY_BYTES."""
    shapes = _result_shapes(op, args, kwargs)
    if shapes is None:
        return MAX_REPLY_BYTES
    return min(MAX_REPLY_BYTES, sum(int(np.prod(s, dtype=np.int64)) for s in shapes) * WIDEST)


def _result_shapes(op: str, args: tuple, kwargs: dict) -> list[tuple] | None:
    """The shapes of the results the contract fixes for these inputs (None: it fixes none)."""
    try:
        shapes = SHAPES[op](args, kwargs)
    except Exception:       # noqa: BLE001 -- no shape the contract fixes (or inputs chosen malformed)
        return None
    return [shapes] if shapes and not isinstance(shapes[0], tuple) else list(shapes)


# ------------------------------------------------------------------------------------------------
# The port process
# ------------------------------------------------------------------------------------------------

_PORTS: "weakref.WeakSet[Port]" = weakref.WeakSet()


@atexit.register
def _close_all():
    for port in list(_PORTS):
        port.close()


class Port:
    """The provider of an exec target: one child process speaking the protocol."""

    def __init__(self, spec: str, argv: list[str]):
        self.spec, self.argv = spec, argv
        self.proc = None
        self.reply_left = self.reply_limit = MAX_REPLY_BYTES
        self.buffer = bytearray()
        self.stderr: deque = deque(maxlen=4)        # chunks of at most STDERR_TAIL bytes
        self.timeout_of = lambda: None
        self.last_op = "the handshake"
        self.left: list[str] = []       # the processes it left running once it had ended (killed since)
        _PORTS.add(self)
        try:
            hello = self._start()
        except (ProtocolError, OperationTimeout) as e:
            self.close()
            raise TargetLoadError(f"target {spec!r}: {e}") from None
        self._declare(hello)

    # -- metadata, from the handshake ---------------------------------------------------------

    def _declare(self, hello: dict):
        def items(key):
            return [unquote(v) for v in hello.get(key, "").split(",") if v]

        def pairs(key):
            out = {}
            for item in hello.get(key, "").split(","):
                if item:
                    k, colon, v = item.partition(":")
                    if not colon:
                        raise TargetLoadError(f"target {self.spec!r}: hello {key}= entry {item!r} is not "
                                              f"name:value")
                    out[unquote(k)] = unquote(v)
            return out
        if "ops" not in hello:
            self.close()
            raise TargetLoadError(f"target {self.spec!r}: the port's hello has no ops= (the operations it "
                                  f"implements, comma-separated; see PROTOCOL.md)")
        self.ops = frozenset(items("ops"))
        if not self.ops:                # as a Python target providing none of them: a usage error
            self.close()
            raise NothingImplemented(f"target {self.spec!r}: the port's hello declares no operation (ops= is "
                                     f"empty); a port lists the operations it implements (`dsv4spec ops`)")
        unknown = sorted(self.ops - known_ops())
        if unknown:
            self.close()
            raise TargetLoadError(f"target {self.spec!r}: the port declares operations the contract does not "
                                  f"know: {', '.join(unknown)} (`dsv4spec ops` lists them)")
        self.NAME = unquote(hello["name"]) if hello.get("name") else self.spec
        self.DEVICE = unquote(hello.get("device", "cpu")) or "cpu"
        self.CLAIMS_CONFORMANCE = hello.get("claims_conformance", "0") == "1"
        self.VARIANTS = pairs("variants")
        self.EXTENSIONS = set(items("extensions"))
        self.INPUT_DTYPE = hello.get("input_dtype", "float32")
        self.INPUT_DTYPES = pairs("input_dtypes")
        self.__version__ = unquote(hello.get("version", "")) or "unversioned"
        if "contract" in hello:             # the contract version it was written against (CONTRACT)
            self.CONTRACT = _contract_number(hello["contract"], f"target {self.spec!r}: hello contract=")

    def __getattr__(self, name):
        if name.startswith("_") or name not in self.__dict__.get("ops", ()):
            raise AttributeError(name)

        def operation(*args, **kwargs):
            return self.call(name, args, kwargs)
        operation.__name__ = name
        return operation

    # -- the process --------------------------------------------------------------------------

    def _start(self) -> dict:
        try:
            self.marker = f"{os.getpid()}.{next(_STARTED)}"
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, start_new_session=True,
                                         preexec_fn=_dies_with_the_suite, env={**os.environ, MARKER: self.marker})
        except OSError as e:
            raise ProtocolError(f"cannot start {shlex.join(self.argv)}: {e.strerror or e}") from None
        WATCH.port(self.proc.pid)
        self.buffer = bytearray()
        self.stderr.clear()
        threading.Thread(target=_drain, args=(self.proc.stderr, self.stderr), daemon=True).start()
        os.set_blocking(self.proc.stdout.fileno(), False)
        os.set_blocking(self.proc.stdin.fileno(), False)
        deadline = self._deadline()
        expected = f"the line 'hello protocol={PROTOCOL} ops=...'"
        self._write(_header("hello", protocol=PROTOCOL), deadline, "the handshake")
        kind, fields = parse_header(self._line(deadline, expected, "the handshake"), expected, ("hello", "error"))
        if kind == "error":
            raise ProtocolError(f"the port refused the handshake: {fields.get('message', '')}")
        if fields.get("protocol") != str(PROTOCOL):
            raise ProtocolError(f"the port speaks protocol {fields.get('protocol')!r}; this suite speaks "
                                f"protocol {PROTOCOL} (PROTOCOL.md)")
        return fields

    def close(self):
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        self._kill(proc)                # what it started and left running, if not the port itself
        proc.stdout.close()

    def _kill(self, proc):
        """Kill the port's process group (start_new_session), whose members outlive the port itself
        when it has ended (a grandchild holding its pipes), then whatever still carries the port's
        marker in its environment (a descendant that left the group for a session of its own),
        naming it.  What the port left running, in its group once it had ended or outside it, is
        kept in `left`: the runner reports it as a finding (exit status 1 at least)."""
        in_its_group = processes_left(lambda: in_group(proc.pid, besides={proc.pid})) if proc.poll() is not None else []
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            if proc.poll() is None:
                proc.kill()
        proc.wait()
        outside = _marked(self.marker, proc.pid)
        for pid, command_line in outside:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            print(f"dsv4spec: error: the port {self.spec} left process {pid} ({command_line}) running outside "
                  f"its process group; it was killed (a port must end what it starts)", file=sys.stderr)
        self.left += in_its_group + [f"pid {pid}: {command_line or '?'}" for pid, command_line in outside]

    def _abandon(self):
        """Kill the port after a violation: its stream is no longer in step with ours."""
        proc, self.proc = self.proc, None
        if proc is not None:
            self._kill(proc)
            for stream in (proc.stdin, proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass

    def __del__(self):
        try:
            self.close()
        except Exception:       # noqa: BLE001 -- interpreter shutdown
            pass

    # -- one call -----------------------------------------------------------------------------

    def call(self, op: str, args: tuple, kwargs: dict):
        records = [r for i, a in enumerate(args) for r in encode_value(a, f"{op} argument {i}")]
        records += [r for k, v in kwargs.items() for r in encode_value(v, f"{op} argument {k}", key=k)]
        request = _header("call", op=op, args=len(args), kwargs=len(kwargs)) + b"".join(records)
        self.reply_left = self.reply_limit = reply_limit(op, args, kwargs)
        self.records_left = MAX_REPLY_RECORDS
        try:
            if self.proc is None or self.proc.poll() is not None:
                self._abandon()
                self._start()
            self._nothing_pending(op)
            deadline = self._deadline()
            self._write(request, deadline, op)
            kind, fields = self._reply(op, deadline)
            if kind == "ok":
                n = _int(fields, "n", f"{op}: the reply 'ok'")
                self._count(op, n, f"{op} result", spend=False)
                values = tuple(self._value(op, deadline, f"{op} result {i}" if n > 1 else f"{op} result")
                               for i in range(n))
                _sized(op, values, args, kwargs)
            self._nothing_after(op)
        except BaseException:
            self._abandon()
            raise
        if kind == "ok":
            return values[0] if n == 1 else values
        message = fields.get("message", "")
        error = fields.get("kind", "")
        if error == "NotImplementedError":
            raise NotImplementedOp(f"{op} ({message})" if message else op)
        if error in ERROR_KINDS:
            raise ERROR_KINDS[error](message)
        raise PortError(f"{op}: the port reported {error or 'an error'}: {message}")

    def _deadline(self) -> float | None:
        """When the call in progress must have its reply: the target's --timeout from now."""
        target = self.timeout_of()
        self.seconds = target.timeout if target is not None else \
            float(os.environ.get(START_VARIABLE, DEFAULT_TIMEOUT_S))
        # a hair before the target's own alarm, so that the TIMEOUT says what the port was waiting for
        return time.monotonic() + self.seconds - min(0.01 * self.seconds, 0.1) if self.seconds else None

    def _nothing_pending(self, op):
        extra = self._pending()
        if extra:
            raise ProtocolError(f"{op}: before the request, the port had written {len(extra)} bytes after its "
                                f"last reply (to {self.last_op}): {_show(extra)} (expected nothing between a reply "
                                f"and the next request){self._stderr_note()}")

    def _nothing_after(self, op):
        """ProtocolError on this call, the offender, when the port has already written past its reply."""
        self.last_op = op
        extra = self._pending()
        if extra:
            raise ProtocolError(f"{op}: after its reply, the port wrote {len(extra)} more bytes: {_show(extra)} "
                                f"(expected nothing between a reply and the next request){self._stderr_note()}")

    def _pending(self) -> bytes:
        """What the port has written and the suite has not read (without waiting)."""
        ready = self._readable(self.proc.stdout.fileno())
        return bytes(self.buffer) + ((self._read_some() or b"") if ready else b"")

    def _reply(self, op, deadline):
        expected = "a reply line 'ok n=N' or 'error kind=K message=...'"
        line = self._line(deadline, expected, op)
        try:
            return parse_header(line, f"{expected} to {op}", ("ok", "error"))
        except ProtocolError as e:
            raise ProtocolError(f"{e}{self._stderr_note()}") from None

    def _value(self, op, deadline, what):
        return self._record(op, deadline, what)[1]

    def _record(self, op, deadline, what):
        """(its key= or None, the value) of the next value record."""
        expected = "a value record (tensor, int, float, str, bool, none, list, dict)"
        self._count(op, 1, what)
        line = self._line(deadline, f"{expected} for {what}", op)
        kind, fields = parse_header(line, f"{expected} for {what}", VALUE_KINDS)
        key = unquote(fields["key"]) if "key" in fields else None
        try:
            if kind == "tensor":
                return key, self._tensor(op, deadline, what, fields)
            if kind == "int":
                return key, _int64(fields["value"], f"{what}: int value")
            if kind == "float":
                text = fields["value"]
                return key, float.fromhex(text) if "0x" in text.lower() else float(text)
            if kind == "str":
                return key, unquote(fields.get("value", ""))
            if kind == "bool":
                if fields["value"] not in ("0", "1"):
                    raise ValueError
                return key, fields["value"] == "1"
            if kind == "none":
                return key, None
            n = _int(fields, "n", f"{what}: the {kind} record")
            self._count(op, n, what, spend=False)
            if kind == "list":
                return key, [self._value(op, deadline, f"{what}[{i}]") for i in range(n)]
            entries = [self._record(op, deadline, f"{what} entry {i}") for i in range(n)]
            if any(name is None for name, _ in entries):
                raise ProtocolError(f"{what}: every entry of a dict record needs key=NAME")
            return key, dict(entries)
        except (KeyError, ValueError):
            raise ProtocolError(f"{what}: malformed {kind} record {_show(line)}") from None

    def _count(self, op, n, what, spend=True):
        """Spend (or, announced by a list, dict or reply, only foresee) n of the reply's records."""
        if n < 0:
            raise ProtocolError(f"{what}: a count of {n} records")
        if n > self.records_left:
            raise ProtocolError(f"{what}: {n} more value records are beyond the {MAX_REPLY_RECORDS} a reply to {op} "
                                f"may hold (a result is a few tensors, or a dict of them)")
        if spend:
            self.records_left -= n

    def _tensor(self, op, deadline, what, fields):
        import torch
        dtype = fields.get("dtype")
        if dtype not in DTYPES:
            raise ProtocolError(f"{what}: unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
        shape_text = fields.get("shape")
        if shape_text is None:
            raise ProtocolError(f"{what}: the tensor record has no shape= (write shape= for a 0-d tensor)")
        try:
            shape = tuple(int(d) for d in shape_text.split(",")) if shape_text else ()
        except ValueError:
            raise ProtocolError(f"{what}: shape={shape_text!r} is not comma-separated integers") from None
        if any(d < 0 for d in shape):
            raise ProtocolError(f"{what}: shape={shape_text} has a negative dimension")
        for d in shape:
            _int64(str(d), f"{what}: a dimension of shape")
        nbytes = _int(fields, "nbytes", f"{what}: the tensor record")
        expected = math.prod(shape) * DTYPES[dtype][1]
        if nbytes != expected:
            raise ProtocolError(f"{what}: nbytes={nbytes}, but dtype {dtype} and shape {list(shape)} take "
                                f"{expected} bytes")
        if nbytes > self.reply_left:
            raise ProtocolError(f"{what}: nbytes={nbytes} is beyond the {self.reply_limit} bytes a reply to {op} "
                                f"may hold (its results' shapes at {WIDEST} bytes an element where the contract "
                                f"fixes them, else {MAX_REPLY_BYTES})")
        self.reply_left -= nbytes
        data = self._bytes(nbytes, deadline, op, what)
        array = np.frombuffer(data, dtype=DTYPES[dtype][0]).reshape(shape)
        if dtype == "bool":
            if np.any(array.view(np.uint8) > 1):
                raise ProtocolError(f"{what}: a bool tensor holds bytes other than 0 and 1")
            return torch.from_numpy(array.astype(bool))
        if dtype == "bfloat16":
            return torch.from_numpy(array.astype(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(array.astype(array.dtype.newbyteorder("="), copy=True))

    # -- the stream ---------------------------------------------------------------------------

    def _write(self, data: bytes, deadline, op):
        view, fd = memoryview(data), self.proc.stdin.fileno()
        while view:
            ready = self._wait(fd, deadline, op, "to read its request", write=True)
            if not ready:
                continue
            try:
                n = os.write(fd, view)
            except BrokenPipeError:
                self._died(op, "while the request was being written")
            except BlockingIOError:
                continue
            view = view[n:]

    def _read_some(self) -> bytes | None:
        """What the port has written (b"" at the end of its output; None: nothing yet)."""
        try:
            return os.read(self.proc.stdout.fileno(), 1 << 20)
        except BlockingIOError:
            return None

    def _fill(self, deadline, op, expected):
        if self._wait(self.proc.stdout.fileno(), deadline, op, f"for {expected}"):
            chunk = self._read_some()
            if chunk == b"":
                self._died(op, f"before {expected}", got=bytes(self.buffer))
            self.buffer += chunk or b""

    def _line(self, deadline, expected, op) -> bytes:
        while (end := self.buffer.find(b"\n")) < 0:
            if len(self.buffer) > MAX_LINE:
                raise ProtocolError(f"{op}: expected {expected}, got {len(self.buffer)} bytes without a line "
                                    f"feed: {_show(self.buffer)} (a header line is at most {MAX_LINE} bytes)"
                                    f"{self._stderr_note()}")
            self._fill(deadline, op, expected)
        line = bytes(self.buffer[:end])
        del self.buffer[:end + 1]
        return line

    def _bytes(self, n, deadline, op, what) -> bytes:
        while len(self.buffer) < n:
            if self._wait(self.proc.stdout.fileno(), deadline, op, f"for the {n} bytes of {what}"):
                chunk = self._read_some()
                if chunk == b"":
                    self._died(op, f"after {len(self.buffer)} of the {n} bytes of {what}")
                self.buffer += chunk or b""
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        return data

    def _wait(self, fd, deadline, op, doing, write=False) -> bool:
        WATCH.safe_point()          # a SIGTERM while the port is silent ends the run within the step
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            note = self._stderr_note()
            self._abandon()
            raise OperationTimeout(f"{op}: the port did not answer within {self.seconds:g} s (waiting {doing}; "
                                   f"the port was ended){note}")
        step = 0.5 if left is None else min(left, 0.5)
        r, w, _ = select.select([] if write else [fd], [fd] if write else [], [], step)
        if not (r or w) and self.proc.poll() is not None and (write or not self._readable(fd)):
            self._died(op, f"waiting {doing}", got=bytes(self.buffer))
        return bool(r or w)

    def _readable(self, fd) -> bool:
        return bool(select.select([fd], [], [], 0)[0])

    def _died(self, op, when, got: bytes = b""):
        proc = self.proc
        try:
            code = proc.wait(EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            cause = "closed its standard output"
        elif code < 0:
            cause = f"was killed by signal {signal.Signals(-code).name}"
        else:
            cause = f"exited with status {code}"
        partial = f"; it had sent {_show(got)}" if got else ""
        raise ProtocolError(f"{op}: the port {cause} {when}{partial}{self._stderr_note(wait=True)}")

    def _stderr_note(self, wait=False) -> str:
        if wait:
            time.sleep(0.05)                        # let the drain thread read the last lines
        text = b"".join(self.stderr).decode("utf-8", "replace").strip()
        if not text:
            return ""
        return f"\nthe port's standard error ends with:\n{text[-STDERR_TAIL:]}"


_STARTED = itertools.count()


def left_by(target, close: bool = False) -> list[str]:
    """What the exec port of `target` left running (named, killed), its port closed first where
    `close`; none for a target that is not an exec port."""
    port = getattr(target, "provider", None)
    if not isinstance(port, Port):
        return []
    if close:
        port.close()
    return list(port.left)


def _marked(marker: str, group: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live processes outside process group `group` whose environment
    holds MARKER=marker (Linux's /proc; elsewhere none are found)."""
    wanted, found = f"\0{MARKER}={marker}\0".encode(), []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if wanted not in b"\0" + f.read() + b"\0":
                    continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                if int(f.read().rsplit(b")", 1)[1].split()[2]) == group:
                    continue            # the group's own, killed a moment ago
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found.append((int(entry), f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _dies_with_the_suite():
    """In the port's process before it starts: SIGKILL when the suite's process dies (Linux)."""
    signal_on_parent_death(signal.SIGKILL)


def _drain(stream, tail: deque):
    """Keep the last of what the port writes to its standard error, read in bounded chunks (a
    stream without line feeds is never buffered whole); the rest is dropped."""
    try:
        for chunk in iter(lambda: stream.read1(STDERR_TAIL), b""):
            tail.append(chunk)
    except (OSError, ValueError):
        pass
    finally:
        try:
            stream.close()
        except OSError:
            pass
