"""The `dsv4spec verify` command outliving its targets (without --isolate).

A target runs in the suite's own process unless --isolate is given, so it can end that process
where nothing can catch it (os._exit, C exit, a signal), and `verify` then exited 0 with no report.
The command therefore forks before it loads any target: the child runs the whole verify as before
(its output, its reports, its exit status) and tells the parent, over a pipe, each finished row,
the operation it enters and, last, that its verdict is written.  A child that ends without saying
so is reported by the parent: an ERROR for the rule it was running, naming the operation and how
the process ended, an ERROR "not run" for every rule after it, every report written, exit status 1
or more.  A fork, not a worker (--isolate): no second import of torch and the target, the same
process for the target as before, and a verdict no target can end.

The parent forwards SIGTERM and SIGINT to the child (the child handles the first, writing what
finished, marked interrupted, and ignores the rest); the child receives SIGTERM if the parent dies.
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
from dataclasses import asdict
from multiprocessing.connection import Connection

from dsv4spec.command import Unloaded, handled, report_threads_left, terminated_as_interrupted
from dsv4spec.interpreter import skip_dead_overflow_checks
from dsv4spec.parent_death import signal_on_parent_death

def supervised(run) -> int:
    """`run.here()` in a forked child; its exit status, or the parent's report of its end."""
    import torch  # noqa: F401 -- imported once for both (the parent's report needs it); no CUDA asked
    read, write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        _child(run, Connection(write, readable=False))
    os.close(write)
    return _parent(run, pid, Connection(read, writable=False))


def _child(run, conn):
    status = 70
    try:
        signal_on_parent_death(signal.SIGTERM)
        skip_dead_overflow_checks()         # here, not in the parent: it may ask torch for CUDA
        from dsv4spec.properties.target import WATCH
        WATCH.report = lambda op: conn.send(("op", op))
        WATCH.port = lambda pgid: conn.send(("port", pgid))
        run.on_row = lambda row: conn.send(("row", asdict(row)))
        run.on_targets = lambda targets: conn.send(("targets", [_info(t) for t in targets]))
        with terminated_as_interrupted():
            status = handled(run.here, run.args)
    except BaseException:       # noqa: BLE001 -- a defect of the suite's own: shown, exit status 1
        import traceback
        traceback.print_exc()
        status = 1
    try:
        from dsv4spec.properties.workers import threads_left
        status = report_threads_left(threads_left(), status)
        conn.send(("done", status))
    finally:
        atexit._run_exitfuncs()         # the ports' cleanup (exec_target)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _info(target):
    from dsv4spec.properties.workers import TargetInfo
    return asdict(TargetInfo(target.spec, target.name, target.module, target.claims_conformance,
                             target.version, str(target.device)))


def _parent(run, pid: int, conn) -> int:
    forward = lambda number, _frame: os.kill(pid, number)       # noqa: E731
    saved = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    rows, infos, op, verdict, ports = [], None, None, None, set()
    try:
        while True:
            try:
                kind, value = conn.recv()
            except (EOFError, OSError):
                break
            if kind == "row":
                rows.append(value)
            elif kind == "targets":
                infos = value
            elif kind == "op":
                op = value
            elif kind == "port":
                ports.add(value)
            elif kind == "done":
                verdict = value
        _, code = os.waitpid(pid, 0)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    from dsv4spec.properties.workers import end_groups
    end_groups(ports)                   # what the child's ports left running, however it ended
    if verdict is not None:
        return verdict
    return _report_the_end(run, rows, infos, op, _ended(code))


def _ended(code: int) -> str:
    if os.WIFSIGNALED(code):
        return f"signal {signal.Signals(os.WTERMSIG(code)).name}"
    return f"exit status {os.WEXITSTATUS(code)}"


def _report_the_end(run, rows: list, infos, op, how: str) -> int:
    """The reports of a run whose process the target ended: the rows that finished, an ERROR for
    the rule that was running, and an ERROR "not run" for each rule after it."""
    from dsv4spec.properties.suite import ERROR, Row
    from dsv4spec.properties.workers import TargetInfo
    rows = [Row(**r) for r in rows]
    targets = [TargetInfo(**i) for i in infos] if infos else [Unloaded(s) for s in run.specs]
    done = {(r.rule_id, r.target) for r in rows}
    pending = [(r, t.name) for t in targets for r in run.run_ids if (r, t.name) not in done]
    where = op or ("loading the target" if infos is None else "the check code")
    print(f"dsv4spec verify: error: the target ended the process ({how}) during {where}", file=sys.stderr)
    for i, (rule_id, name) in enumerate(pending):
        why = f"the target ended the process ({how}) during {where}" if i == 0 else \
            f"not run: the target ended the process during {pending[0][0]} on {pending[0][1]}"
        rows.append(Row(rule_id, name, ERROR, why + " (--isolate runs every rule in a worker process, so that "
                                                   "a process the target ends costs only its rule)"))
    return run.conclude(rows, targets, interrupted=False, forced=1)
