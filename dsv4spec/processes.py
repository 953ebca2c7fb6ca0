"""The processes a target leaves running (a helper it forked or started): found in Linux's /proc (by
process group in an --isolate worker, among the command's descendants by its guard), named and
ended; and the guard's watch over the child it forks.  Imports
nothing of the package, so that every layer may use it."""
import os
import signal
import time


def _live() -> list[tuple[int, int, int, str]]:
    """(pid, parent pid, process group, command line) of every live process (Linux's /proc; elsewhere none)."""
    try:
        entries = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    found = []
    for pid in entries:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state, parent, group = f.read().rsplit(")", 1)[1].split()[:3]
            if state == "Z":
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:120]
            found.append((pid, int(parent), int(group), command))
        except (OSError, ValueError):
            continue
    return found


def in_group(pgid: int, besides=frozenset()) -> list[tuple[int, str]]:
    """(pid, command line) of each live process of group `pgid` but the pids `besides`."""
    return [(pid, command) for pid, _, group, command in _live() if group == pgid and pid not in besides]


def descendants() -> list[tuple[int, str]]:
    """(pid, command line) of each live process descended from this one (its orphans come back to
    it once it is a subreaper: become_subreaper)."""
    live = _live()
    mine, found = {os.getpid()}, []
    while grown := [(pid, command) for pid, parent, _, command in live if parent in mine and pid not in mine]:
        mine.update(pid for pid, _ in grown)
        found += grown
    return found


PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Have the processes this one's descendants orphan reparented to it, not to init (Linux), so that
    what a target started is still found among its descendants after the target's process has ended."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


LEFT_GRACE_S = 2.0      # a helper process that ends on its own this soon is not left behind


def processes_left(find, grace_s: float = LEFT_GRACE_S) -> list[str]:
    """The processes `find()` lists that are still running `grace_s` later, ended with SIGKILL and
    named: a helper a target forked or started holds a pipe of the suite's open, or is orphaned."""
    deadline = time.monotonic() + grace_s
    while (left := find()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid, _ in left:
        _kill(pid)
    return [f"pid {pid}: {command or '?'}" for pid, command in left]


def _kill(pid: int) -> None:
    """SIGKILL, and collect it where it is a child of this process (a forked helper, an orphan come back)."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, PermissionError, ChildProcessError):
        pass


def terminal_foreground() -> bool:
    """Whether this process's group is its terminal's foreground: a Ctrl-C there reaches its children too."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


class ForkedChild:
    """A parent's watch over the child it forked to run the targets (dsv4spec/guard.py, the pytest
    plugin's guard): the messages the child sends over a pipe (`received`), its end, waited for by
    pid, not by the end of the pipe (a process a target forked holds the pipe open), and the
    signals the parent receives, forwarded (a Ctrl-C at the terminal reached the child already);
    a child that has not ended `grace_s` after the first forwarded one is killed (a target hung in C,
    or one whose own handler took the signal), with what it started (`kill`)."""

    POLL_S = 0.1

    def __init__(self, pid: int, conn, grace_s: float):
        self.pid, self.conn, self.grace_s = pid, conn, grace_s
        self.kill_at, self.killed, self.signal = None, False, None

    def forward(self, number, _frame):
        self.signal = self.signal or number
        if number == signal.SIGINT and terminal_foreground():
            return      # the child has it from the terminal, where its user may be debugging, or press Ctrl-C again
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.grace_s
        try:
            os.kill(self.pid, number)
        except ProcessLookupError:
            pass

    def until_it_ends(self) -> int:
        """The child's wait status, its signals forwarded meanwhile."""
        saved = {s: signal.signal(s, self.forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while True:
                self.read(self.POLL_S)
                ended, code = os.waitpid(self.pid, os.WNOHANG)
                if ended:
                    self.read(0)
                    return code
                if self.kill_at is not None and time.monotonic() > self.kill_at:
                    self.killed = True
                    self.kill()
                    return os.waitpid(self.pid, 0)[1]
        finally:
            for s, handler in saved.items():
                signal.signal(s, handler)

    def kill(self):
        os.kill(self.pid, signal.SIGKILL)

    def read(self, timeout: float) -> None:
        from multiprocessing.connection import wait
        if self.conn is None:
            time.sleep(timeout)
            return
        while wait([self.conn], timeout):
            timeout = 0
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                self.conn = None
                return
            self.received(*message)

    def received(self, kind: str, *values):
        raise NotImplementedError


def ended(code: int) -> str:
    """How a process ended, from its wait status: `signal SIGKILL`, `exit status 3`."""
    if os.WIFSIGNALED(code):
        return f"signal {signal.Signals(os.WTERMSIG(code)).name}"
    return f"exit status {os.WEXITSTATUS(code)}"
