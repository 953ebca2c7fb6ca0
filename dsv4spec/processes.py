"""The processes a target leaves running (a helper it forked or started): found by process group
in Linux's /proc, named and ended, by the command's guard and by the --isolate workers.  Imports
nothing of the package, so that every layer may use it."""
import os
import signal
import time


def processes_in_group(pgid: int) -> list[tuple[int, str]]:
    """(pid, command line) of each live process of group `pgid` (Linux's /proc; elsewhere none)."""
    try:
        entries = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    found = []
    for pid in entries:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state, _, group = f.read().rsplit(")", 1)[1].split()[:3]
            if state == "Z" or int(group) != pgid:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found.append((pid, f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:120]))
        except (OSError, ValueError):
            continue
    return found


LEFT_GRACE_S = 2.0      # a helper process that ends on its own this soon is not left behind


def processes_left(pgid: int, besides=frozenset(), grace_s: float = LEFT_GRACE_S) -> list[str]:
    """The processes a target left running in group `pgid` (all of it but the pids `besides`), named
    and ended with SIGKILL: a helper it forked or started keeps a pipe of the suite's open, or is orphaned."""
    deadline = time.monotonic() + grace_s
    while (left := [p for p in processes_in_group(pgid) if p[0] not in besides]) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return [f"pid {pid}: {command or '?'}" for pid, command in left]
