"""What the command line's subcommands and the verify supervisor (guard.py) share: the usage error,
the rule prefixes of --rules, SIGTERM handled as Ctrl-C (at the runner's next safe point), the one-line report of a usage or load
error with its exit status, and the finding of threads a target left running.  Imports no subcommand, so that each may import it."""
from __future__ import annotations

import os
import signal
import sys


class UsageError(Exception):
    """A mistake in the command line or its inputs: reported in one line, exit status 2."""


def shard_argument(text: str) -> tuple[int, int]:
    """--shard K/N of verify and check-trace, as argparse takes a type."""
    import argparse
    from dsv4spec.runner.shard import parse
    try:
        return parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def prefixes(text: str | None) -> list[str] | None:
    """The rule-id prefixes a comma-separated --rules names (None: every rule)."""
    if not text:
        return None
    return [p.strip() for p in text.split(",") if p.strip()]


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is: what finished is printed and written, marked interrupted."""


SIGNALLED: dict = {}        # the first signal received ("signal"), how many came ("count"), whether acted on ("acted")


def interruption() -> KeyboardInterrupt:
    return Terminated() if SIGNALLED.get("signal") == signal.SIGTERM else KeyboardInterrupt()


def act_on_a_signal() -> None:
    """The runner's safe point (an operation's call and return, each row): a recorded signal ends the run here."""
    if SIGNALLED.get("signal") and not SIGNALLED.get("acted"):
        SIGNALLED["acted"] = True
        raise interruption()


class terminated_as_interrupted:
    """SIGTERM and SIGINT end the run at its next safe point (act_on_a_signal): the handler only
    records the signal, since an exception raised in it may land where Python discards it (in
    Hypothesis's gc callback, a __del__), and no signal is ever ignored.  A second signal before
    the run acted on the first raises at once (a loop in the target that reaches no safe point);
    one that comes while the reports are written is recorded, so that they are written whole."""

    def __enter__(self):
        from dsv4spec.runner.contract import WATCH
        self.saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        SIGNALLED.clear()
        self.watch, self.safe_point = WATCH, WATCH.safe_point
        WATCH.safe_point = act_on_a_signal
        for s in self.saved:
            signal.signal(s, self._record)

    def _record(self, number, _frame):
        SIGNALLED.setdefault("signal", number)
        SIGNALLED["count"] = SIGNALLED.get("count", 0) + 1
        if SIGNALLED["count"] > 1 and not SIGNALLED.get("acted"):
            act_on_a_signal()

    def __exit__(self, *exc):
        for s, handler in self.saved.items():
            signal.signal(s, handler)
        self.watch.safe_point = self.safe_point
        return False


class Unloaded:
    """A target whose worker was stopped before it reported (Ctrl-C)."""

    def __init__(self, spec):
        self.spec = self.name = spec
        self.claims_conformance, self.module, self.version, self.device = False, "", "", ""


def handled(call, args) -> int:
    """call(), with a usage or load error reported in one line and its exit status."""
    from dsv4spec.runner.contract import printable
    from dsv4spec.runner.target import TargetLoadError
    try:
        return call()
    except (UsageError, ValueError, FileNotFoundError, TargetLoadError) as e:
        if args.debug:
            raise
        print(f"dsv4spec {args.command}: error: {printable(str(e))}", file=sys.stderr)   # a target's words, shown
        return 3 if isinstance(e, TargetLoadError) else 2
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def threads_finding(names: list[str], where: str = "the process") -> str:
    """The finding of non-daemon threads a target left running in `where`."""
    return (f"the target left {len(names)} non-daemon thread(s) running ({', '.join(names)}); a target must end "
            f"the threads it starts (exit status 1 at least; {where} ended regardless)")


FINDINGS_SHOWN: set = set()     # process-level findings already on standard error (with the reports)


def report_finding(finding: str) -> None:
    """A process-level finding on standard error, once."""
    if finding not in FINDINGS_SHOWN:
        FINDINGS_SHOWN.add(finding)
        print(f"dsv4spec verify: error: {finding}", file=sys.stderr)


def report_threads_left(names: list[str], status: int, where: str = "the process") -> int:
    """Threads a target started and left running keep a process from ending: named as a finding on
    standard error (once: the run's reports may have named them already); the exit status becomes
    at least 1 (`where` ended regardless)."""
    if not names:
        return status
    report_finding(threads_finding(names, where))
    return max(status, 1)


def processes_finding(described: list[str], where: str = "the process") -> str:
    """The finding of processes a target started and left running in `where` (ended with SIGKILL)."""
    return (f"the target left {len(described)} process(es) running in {where} ({'; '.join(described)}); a target "
            f"must end the processes it starts (they were ended with SIGKILL; exit status 1 at least)")


def report_processes_left(described: list[str], status: int, where: str = "the process") -> int:
    """Processes a target started and left running (a helper holding a pipe of the suite's, an
    orphan): named as a finding on standard error (once), ended; the exit status becomes at least 1."""
    if not described:
        return status
    report_finding(processes_finding(described, where))
    return max(status, 1)


def printed(text: str, stream) -> bool:
    """print(text) to `stream`; False where it is closed or its reader has gone (standard output
    closed, `| head`): the reports to files are written regardless, and the exit status says so."""
    try:
        print(text, file=stream, flush=True)
        return stream is not None
    except (OSError, ValueError):
        _to_devnull(stream)
        return False


def flushed(*streams) -> None:
    """Flush each stream; one that is closed or has lost its reader is pointed at /dev/null, so
    that no later flush (the interpreter's last) raises."""
    for stream in streams:
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            _to_devnull(stream)


def _to_devnull(stream) -> None:
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
    except (OSError, ValueError, AttributeError):
        pass
