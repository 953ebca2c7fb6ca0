"""The pytest route outliving its targets (without --dsv4spec-isolate), as `dsv4spec verify` does
(dsv4spec/guard.py): a target runs in pytest's own process, where `os._exit(0)` or C `exit(0)` ended
the session with status 0, no summary and no --junitxml.

The session therefore forks before any target is loaded: the child is the pytest session as before
(its output, its --junitxml, its exit status) and tells the parent, over a pipe, the items it
collected, the item and operation it enters, each item's outcome and, last, its exit status.  A
child that ends without saying so is reported by the parent: the item it was running is an error
naming the operation and how the process ended, every item after it did not run, the --junitxml
is written with them, and the exit status is 1.  The parent forwards SIGTERM (and a SIGINT that did
not come from the terminal, which reaches the child itself) and kills the child if it has not
ended a few seconds later (a child that finished without dying of a forwarded SIGTERM, taken by a
target's own handler, still ends the session with 143); the child is killed if the parent dies.
Whatever a target forked or started and left running (the parent is a subreaper: such a process
stays its descendant when the child ends) is named, ended, and makes the exit status at least 1,
as `dsv4spec verify` does.
"""
from __future__ import annotations

import os
import signal
import sys
from multiprocessing.connection import Connection

import pytest

from dsv4spec.parent_death import signal_on_parent_death
from dsv4spec.processes import ForkedChild, become_subreaper, descendants, ended, processes_left

STOP_GRACE_S = 5.0          # after a forwarded signal, before the child is killed (a target hung in C)


def guarded(config) -> bool:
    """Whether this session forks (not under --dsv4spec-isolate, nor in or over pytest-xdist's workers,
    whose own crash report covers them)."""
    return (hasattr(os, "fork") and not config.getoption("dsv4spec_isolate")
            and not hasattr(config, "workerinput") and not config.getoption("numprocesses", None))


def fork_the_session(config) -> None:
    """Return in the child, which goes on as the session; the parent never returns."""
    read, write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    become_subreaper()          # what the target starts stays among this process's descendants
    pid = os.fork()
    if pid == 0:
        os.close(read)
        signal_on_parent_death(signal.SIGKILL)
        config.pluginmanager.register(_Child(Connection(write, readable=False)), "dsv4spec-guard")
        return
    os.close(write)
    watch = _Parent(pid, Connection(read, writable=False))
    code = watch.until_it_ends()
    status = os.waitstatus_to_exitcode(code)
    if watch.status is None and watch.signal:       # stopped by the user, as pytest is without the plugin
        status = 128 + watch.signal
    elif watch.status is None and (status <= 0 or watch.item is not None):  # not pytest's own error (a usage error)
        status = watch.report(config, code)
    elif watch.signal == signal.SIGTERM and watch.kill_at is not None and status >= 0:  # a target's handler took it
        print("dsv4spec: the session finished without acting on the SIGTERM pytest received (a target's own "
              "handler took it, or it came as the session ended); exit status 143", flush=True)
        status = 128 + signal.SIGTERM
    status = _processes_left(status)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status if status >= 0 else 128 - status)


def _processes_left(status: int) -> int:
    """The exit status, at least 1 where the targets left a process running (named, ended)."""
    left = processes_left(descendants)
    if not left:
        return status
    print(f"dsv4spec: the targets left {len(left)} process(es) running: {'; '.join(left)}; a target must end "
          f"what it starts (they were ended with SIGKILL; exit status 1 at least)", flush=True)
    return status if status > 0 else 1


class _Child:
    """The session's side: what the parent needs to report the session if the target ends it."""

    def __init__(self, conn):
        self.conn = conn
        from .contract import WATCH
        WATCH.report = lambda op: self.send("op", op)

    def send(self, *message):
        try:
            self.conn.send(message)
        except OSError:
            pass

    def pytest_collection_finish(self, session):
        self.send("items", [item.nodeid for item in session.items])

    def pytest_runtest_logstart(self, nodeid, location):
        self.send("item", nodeid)

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            self.send("outcome", report.nodeid, report.outcome, str(report.longrepr or "")[-2000:])

    @pytest.hookimpl(tryfirst=True)
    def pytest_unconfigure(self, config):
        self.send("done", 0)        # its exit status is the process's


class _Parent(ForkedChild):
    """What the parent knows of the session: its items, the item and operation it is in, each
    item's outcome, and whether it reached its end."""

    def __init__(self, pid: int, conn):
        super().__init__(pid, conn, STOP_GRACE_S)
        self.items, self.item, self.op, self.outcomes, self.status = [], None, None, {}, None

    def received(self, kind, *value):
        if kind == "items":
            self.items = value[0]
        elif kind == "item":
            self.item, self.op = value[0], None
        elif kind == "op":
            self.op = value[0]
        elif kind == "outcome":
            self.outcomes.setdefault(value[0], (value[1], value[2]))
        elif kind == "done":
            self.status = value[0]

    def report(self, config, code: int) -> int:
        """The summary and the --junitxml of a session whose process the target ended: exit status 1."""
        where = f"{self.op or 'the check code'} in {self.item}" if self.item else "the session's set-up"
        why = f"the target ended pytest's process ({ended(code)}) during {where}"
        after = [i for i in self.items if i not in self.outcomes and i != self.item]
        print(f"\nERROR {self.item or 'dsv4spec'}: {why} (--dsv4spec-isolate runs the targets in a worker "
              f"process, so that a process the target ends costs only its item)", flush=True)
        counts = {}
        for outcome, _ in self.outcomes.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        done = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
        print(f"==== dsv4spec: 1 error, {len(after)} not run{', ' + done if done else ''} "
              f"(the session was ended; exit status 1) ====", flush=True)
        if getattr(config.option, "xmlpath", None):
            _junit(config.option.xmlpath, self.items, self.outcomes, self.item, why, after)
        return 1


def _junit(path: str, items: list[str], outcomes: dict, running, why: str, after: list[str]) -> None:
    import xml.etree.ElementTree as ET
    suite = ET.Element("testsuite", name="pytest", tests=str(len(items)))
    for nodeid in items or [running or "dsv4spec"]:
        module, _, name = nodeid.rpartition("::")
        case = ET.SubElement(suite, "testcase", classname=module.removesuffix(".py").replace("/", "."), name=name)
        outcome, text = outcomes.get(nodeid, (None, ""))
        if outcome == "failed":
            ET.SubElement(case, "failure", message="failed").text = text
        elif outcome == "skipped":
            ET.SubElement(case, "skipped", message=text[:200])
        elif nodeid == running or (running is None and nodeid == "dsv4spec"):
            ET.SubElement(case, "error", message=why)
        elif nodeid in after:
            ET.SubElement(case, "error", message=f"not run: {why}")
    suite.set("errors", str(len(suite.findall("testcase/error"))))
    suite.set("failures", str(len(suite.findall("testcase/failure"))))
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
