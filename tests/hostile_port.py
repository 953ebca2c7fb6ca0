"""A port over the exec protocol (PROTOCOL.md) that attacks the suite rather than merely breaking
the protocol; tests/test_faults.py picks the attack with HOSTILE:

    hang_with_child   at its first call, starts a grandchild that holds the port's standard output
                      and error, writes both process ids to $HOSTILE_PIDS, and never answers
    exit_with_child   the same, but exits at once, leaving the grandchild holding its pipes
    huge              answers with a tensor record declaring 2^40 bytes (a shape that agrees),
                      then sends zeros for as long as the suite reads them
    ansi              writes ANSI colours and a NUL to its standard error, then exits

Its one operation is e2m1_decode.
"""
import os
import subprocess
import sys
import time

HOSTILE = os.environ.get("HOSTILE", "")
IN, OUT = sys.stdin.buffer, sys.stdout.buffer


def read_call():
    line = IN.readline()
    if not line:
        sys.exit(0)
    words = dict(w.split("=", 1) for w in line.decode().split()[1:])
    for _ in range(int(words["args"]) + int(words["kwargs"])):
        header = dict(w.split("=", 1) for w in IN.readline().decode().split()[1:])
        IN.read(int(header.get("nbytes", 0)))


def main():
    IN.readline()
    OUT.write(b"hello protocol=1 name=hostile ops=e2m1_decode claims_conformance=1\n")
    OUT.flush()
    while True:
        read_call()
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
