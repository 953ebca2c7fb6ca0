"""A port over the exec protocol (PROTOCOL.md) that attacks the suite rather than merely breaking
the protocol; tests/test_faults.py picks the attack with HOSTILE:

    hang_with_child   at its first call, starts a grandchild that holds the port's standard output
                      and error, writes both process ids to $HOSTILE_PIDS, and never answers
    exit_with_child   the same, but exits at once, leaving the grandchild holding its pipes
    huge              answers with a tensor record declaring 2^40 bytes (a shape that agrees),
                      then sends zeros for as long as the suite reads them
    ansi              writes ANSI colours and a NUL to its standard error, then exits
    many_strings      answers with a list declaring 10^8 strings, then sends them for as long as read
    nested_strings    answers with 300 lists of 300 strings each (90000 records, each list within bounds)
    int_overflow      answers with an int past 64 bits
    shape_overflow    answers with a tensor whose shape has a dimension past 64 bits
    missized          answers with 3 floats where the request's result holds one per code
    setsid_child      at its first call, starts a grandchild in a session of its own (setsid), writes
                      both process ids to $HOSTILE_PIDS, and answers
    ansi_message      answers with an error whose message holds ANSI escapes and a NUL

Its one operation is e2m1_decode.
"""
import os
import subprocess
import sys
import time

HOSTILE = os.environ.get("HOSTILE", "")
IN, OUT = sys.stdin.buffer, sys.stdout.buffer


def read_call():
    """The number of codes the call's tensor holds."""
    line = IN.readline()
    if not line:
        sys.exit(0)
    words = dict(w.split("=", 1) for w in line.decode().split()[1:])
    n = 0
    for _ in range(int(words["args"]) + int(words["kwargs"])):
        header = dict(w.split("=", 1) for w in IN.readline().decode().split()[1:])
        n = int(header.get("nbytes", 0))
        IN.read(n)
    return n


def decoded(n):
    return f"ok n=1\ntensor dtype=float32 shape={n} nbytes={4 * n}\n".encode() + bytes(4 * n)


ANSWERS = {     # the reply of each attack that answers at once
    "int_overflow": b"ok n=1\nint value=99999999999999999999\n",
    "shape_overflow": b"ok n=1\ntensor dtype=uint8 shape=99999999999999999999,0 nbytes=0\n",
    "missized": decoded(3),
    "nested_strings": b"ok n=1\nlist n=300\n" + (b"list n=300\n" + b"str value=x\n" * 300) * 300,
    "ansi_message": b"error kind=RuntimeError message=bad \x1b[2J\x1b]0;owned\x07\x00 end\n",
}


def main():
    IN.readline()
    OUT.write(b"hello protocol=1 name=hostile ops=e2m1_decode claims_conformance=1\n")
    OUT.flush()
    while True:
        n = read_call()
        if HOSTILE in ANSWERS:
            OUT.write(ANSWERS[HOSTILE])
            OUT.flush()
            continue
        if HOSTILE == "many_strings":
            OUT.write(b"ok n=1\nlist n=100000000\n")
            while True:             # until the suite closes the pipe
                OUT.write(b"str value=x\n" * 100000)
                OUT.flush()
        if HOSTILE == "setsid_child":
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            with open(os.environ["HOSTILE_PIDS"], "w") as f:
                f.write(f"{os.getpid()} {child.pid}\n")
            OUT.write(decoded(n))
            OUT.flush()
            continue
        if HOSTILE == "hang_with_child":
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
            with open(os.environ["HOSTILE_PIDS"], "w") as f:
                f.write(f"{os.getpid()} {child.pid}\n")
            time.sleep(3600)
        if HOSTILE == "exit_with_child":
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
            with open(os.environ["HOSTILE_PIDS"], "w") as f:
                f.write(f"{os.getpid()} {child.pid}\n")
            os._exit(3)
        if HOSTILE == "huge":
            OUT.write(b"ok n=1\ntensor dtype=float32 shape=274877906944 nbytes=1099511627776\n")
            zeros = bytes(1 << 20)
            while True:             # until the suite closes the pipe
                OUT.write(zeros)
                OUT.flush()
        if HOSTILE == "ansi":
            sys.stderr.write("\x1b[31mred alert\x1b[0m \x00 nul ``` fence\n")
            sys.stderr.flush()
            sys.exit(7)


if __name__ == "__main__":
    main()
