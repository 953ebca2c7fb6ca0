"""What the command line's subcommands and the verify supervisor (guard.py) share: the usage error,
the rule prefixes of --rules, SIGTERM handled as Ctrl-C, the one-line report of a usage or load
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
    from dsv4spec.properties.shard import parse
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
    from dsv4spec.properties.target import TargetLoadError
    try:
        return call()
    except (UsageError, ValueError, FileNotFoundError, TargetLoadError) as e:
        if args.debug:
            raise
        print(f"dsv4spec {args.command}: error: {e}", file=sys.stderr)
        return 3 if isinstance(e, TargetLoadError) else 2
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def report_threads_left(names: list[str], status: int, where: str = "the process") -> int:
    """Threads a target started and left running keep a process from ending: named as a finding on
    standard error; the exit status becomes at least 1 (`where` ended regardless)."""
    if not names:
        return status
    print(f"dsv4spec verify: error: the target left {len(names)} non-daemon thread(s) running "
          f"({', '.join(names)}); a target must end the threads it starts (exit status 1 at least; "
          f"{where} ended regardless)", file=sys.stderr)
    return max(status, 1)
