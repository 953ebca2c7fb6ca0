"""What the command line's subcommands and the verify supervisor (guard.py) share: the usage error,
the rule prefixes of --rules, SIGTERM handled as Ctrl-C, the one-line report of a usage or load
error with its exit status, and the finding of threads a target left running.  Imports no subcommand, so that each may import it."""
from __future__ import annotations

import os
import signal
import sys


class UsageError(Exception):
    """A mistake in the command line or its inputs: reported in one line, exit status 2."""


def prefixes(text: str | None) -> list[str] | None:
    """The rule-id prefixes a comma-separated --rules names (None: every rule)."""
    if not text:
        return None
    return [p.strip() for p in text.split(",") if p.strip()]


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is: what finished is printed and written, marked interrupted."""


SIGNALLED: dict = {}


class terminated_as_interrupted:
    """SIGTERM (and SIGINT) raise KeyboardInterrupt once; a second signal while the reports are
    written is ignored, so that they are written whole."""

    def __enter__(self):
        self.saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in self.saved:
            signal.signal(s, self._raise)

    def _raise(self, number, _frame):
        for s in self.saved:
            signal.signal(s, signal.SIG_IGN)
        SIGNALLED["signal"] = number
        raise Terminated() if number == signal.SIGTERM else KeyboardInterrupt()

    def __exit__(self, *exc):
        for s, handler in self.saved.items():
            signal.signal(s, handler)
        return False


class Unloaded:
    """A target whose worker was stopped before it reported (Ctrl-C)."""

    def __init__(self, spec):
        self.spec = self.name = spec
        self.claims_conformance, self.module, self.version, self.device = False, "", "", ""


def handled(call, args) -> int:
    """call(), with a usage or load error reported in one line and its exit status."""
    from dsv4spec.properties.contract import printable
    from dsv4spec.properties.target import TargetLoadError
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
