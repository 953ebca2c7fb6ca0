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

The parent forwards SIGTERM and SIGINT to the child, which ends the run at its next safe point and
writes what finished, marked interrupted; a child that has not ended STOP_GRACE_S later (a target
hung in C, or one whose own handler took the signal) is killed with what it started, and the
parent writes those reports from the rows it was told; one that finished without hearing the
signal (a target's own handler took it) exits with the signal's status as well.  Whatever a target forked or started and
left running (the parent is a subreaper: such a process stays its descendant when the child ends)
is named, ended, and makes the exit status at least 1 (it would hold the pipe, and the command,
open).  The child stays in the command's process group, so that a target may still read the
terminal (a debugger); a Ctrl-C there reaches both, and is not forwarded twice.
The child is killed if the parent dies (SIGKILL: no handler of Python's runs in a target hung in C).
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
from dataclasses import asdict
from multiprocessing.connection import Connection

from dsv4spec.command import (SIGNALLED, Unloaded, flushed, handled, report_processes_left, report_threads_left,
                              terminated_as_interrupted)
from dsv4spec.interpreter import skip_dead_overflow_checks
from dsv4spec.parent_death import signal_on_parent_death
from dsv4spec.processes import ForkedChild, become_subreaper, descendants, ended, processes_left

STOP_GRACE_S = 5.0      # after a signal is forwarded, before the child is killed (a target hung in C)


def supervised(run) -> int:
    """`run.here()` in a forked child; its exit status, or the parent's report of its end."""
    import torch  # noqa: F401 -- imported once for both (the parent's report needs it); no CUDA asked
    read, write = os.pipe()
    flushed(sys.stdout, sys.stderr)
    become_subreaper()          # what the target starts stays among this process's descendants
    pid = os.fork()
    if pid == 0:
        os.close(read)
        _child(run, Connection(write, readable=False))
    os.close(write)
    return _parent(run, pid, Connection(read, writable=False))


def _child(run, conn):
    status = 70
    try:
        signal_on_parent_death(signal.SIGKILL)     # a command killed outright takes its child along, even one hung in C
        skip_dead_overflow_checks()         # here, not in the parent: it may ask torch for CUDA
        from dsv4spec.runner.target import WATCH
        WATCH.report = lambda op: conn.send(("op", op))
        WATCH.port = lambda pgid: conn.send(("port", pgid))
        run.on_row = lambda row: conn.send(("row", asdict(row)))
        run.on_targets = lambda targets: conn.send(("targets", [_info(t) for t in targets]))
        run.on_loading = lambda spec: conn.send(("loading", spec))
        with terminated_as_interrupted():
            status = handled(run.here, run.args)
    except BaseException:       # noqa: BLE001 -- a defect of the suite's own: shown, exit status 1
        import traceback
        traceback.print_exc()
        status = 1
    try:
        from dsv4spec.runner.workers import threads_left
        status = report_threads_left(threads_left(), status)
        conn.send(("done", (status, SIGNALLED.get("signal"))))     # the signal it heard, if any
    finally:
        atexit._run_exitfuncs()         # the ports' cleanup (exec_target)
        flushed(sys.stdout, sys.stderr)
        os._exit(status)


def _info(target):
    from dsv4spec.runner.workers import TargetInfo
    if isinstance(target, TargetInfo):      # a target that could not be loaded, with its load error
        return asdict(target)
    return asdict(TargetInfo(target.spec, target.name, target.module, target.claims_conformance,
                             target.version, str(target.device)))


def _parent(run, pid: int, conn) -> int:
    watch = _Watch(pid, conn)
    code = watch.until_it_ends()
    if watch.signal:
        SIGNALLED.setdefault("signal", watch.signal)        # the reports' interrupted_by and exit status
    from dsv4spec.runner.workers import end_groups
    end_groups(watch.ports)             # what the child's ports left running, however it ended
    left = processes_left(descendants)      # what the target forked or started, still running
    if watch.verdict is not None:       # a signal forwarded (kill_at) that the run never heard is still the verdict's
        status = watch.verdict if watch.heard or watch.kill_at is None else _unheard(watch.signal)
    elif watch.signal:                  # the child did not write the reports of the interrupted run
        how = f"did not stop within {STOP_GRACE_S:g} s of the signal and was killed" if watch.killed \
            else f"ended ({ended(code)})"
        print(f"dsv4spec verify: the run's process {how} before writing its reports; they are written from "
              f"the results that finished", file=sys.stderr)
        status = _report_the_interruption(run, watch)
    else:
        status = _report_the_end(run, watch, ended(code))
    return report_processes_left(left, status, "the command's process")


class _Watch(ForkedChild):
    """What the parent knows of the child: the rows it finished, its targets, the operation it is
    in, its verdict, the ports it started."""

    def __init__(self, pid: int, conn):
        super().__init__(pid, conn, STOP_GRACE_S)
        self.rows, self.infos, self.op, self.verdict, self.heard, self.ports = [], None, None, None, None, set()
        self.loading = None         # the spec of the target being loaded, until the targets are reported

    def kill(self):
        super().kill()
        processes_left(lambda: [p for p in descendants() if p[0] != self.pid], grace_s=0)    # it is waited for

    def received(self, kind, value):
        if kind == "row":
            self.rows.append(value)
        elif kind == "targets":
            self.infos = value
        elif kind == "loading":
            self.loading = value
        elif kind == "op":
            self.op = value
        elif kind == "port":
            self.ports.add(value)
        elif kind == "done":
            self.verdict, self.heard = value


def _unheard(number: int) -> int:
    """The exit status of a run whose process finished without hearing the signal the command
    received and passed on (a target's own handler took it): the signal's, said on standard error."""
    print(f"dsv4spec verify: the run's process finished without acting on the {signal.Signals(number).name} the "
          f"command received (a target's own handler took it, or it came as the run ended); its reports are of "
          f"the whole run", file=sys.stderr)
    return 128 + number


def _report_the_interruption(run, watch) -> int:
    from dsv4spec.runner.suite import Row
    from dsv4spec.runner.workers import TargetInfo
    targets = [TargetInfo(**i) for i in watch.infos] if watch.infos else [Unloaded(s) for s in run.specs]
    return run.conclude([Row(**r) for r in watch.rows], targets, interrupted=True)


def _report_the_end(run, watch, how: str) -> int:
    """The reports of a run whose process the target ended: the rows that finished, an ERROR for
    the rule that was running, and an ERROR "not run" for each rule after it; a target that ended
    it while being loaded could not be loaded, as a worker reports it."""
    from dsv4spec.runner.suite import ERROR, Row
    from dsv4spec.runner.workers import TargetInfo
    if watch.infos is None and watch.loading is not None:
        return _report_a_load_that_ended(run, watch.loading, how)
    rows, infos, op = [Row(**r) for r in watch.rows], watch.infos, watch.op
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


def _report_a_load_that_ended(run, spec: str, how: str) -> int:
    """The reports of a run whose process a target ended while it was being loaded: its rules ERROR
    with its load error (exit status 3, the words of a worker that died loading it), the other
    targets' not run."""
    from dsv4spec.runner.suite import ERROR, Row
    from dsv4spec.runner.workers import LOADING, TargetInfo
    why = f"target {spec!r} could not be loaded: the target's process died ({how}) in {LOADING}"
    targets = [TargetInfo(s, s, load_error=why if s == spec else "") for s in run.specs]
    rows = [Row(r, s, ERROR, why if s == spec else f"not run: {why}") for s in run.specs for r in run.run_ids]
    return run.conclude(rows, targets, interrupted=False)
