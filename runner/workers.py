"""Running rules in worker processes: `verify --isolate` and `verify --jobs N`.

The supervisor (this process) hands one (target, rule) at a time to each of N workers, started
with the standard library's `spawn` context.  A worker loads targets by their spec, runs the rule
exactly as `suite.run_rule` does in one process, and sends the row back; before every operation
call it says which operation it enters.  So:

- a worker that dies (segfault, illegal memory access, abort) costs the rule it was running: ERROR
  with the signal and the operation, and a fresh worker takes the next rule (one that dies while
  loading the target costs all of that target's rules);
- an operation that does not return within the time limit, even inside C code where no signal
  reaches it, is ended by killing the worker: TIMEOUT with the operation;
- rows come back in any order and are put back in the single-process order, so a report is the
  same (apart from timings) for any N and for the in-process run with the same seed.

With several GPUs visible, worker i sees only GPU i mod n (CUDA_VISIBLE_DEVICES); otherwise the
CPU cores are dealt out among the workers (affinity and torch threads).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import wait

from dsv4spec.interpreter import skip_dead_overflow_checks
from dsv4spec.processes import in_group, processes_left
from dsv4spec.triton_mode import no_gpu_here

from . import suite
from .suite import ERROR, TIMEOUT, Row
from .exec_target import left_by
from .target import TargetLoadError, TargetNotFound, WATCH, load_target

GRACE_S = 1.0               # beyond the per-operation limit, before a silent worker is killed
LOAD_LIMIT_S = 300.0        # importing a target (torch, CUDA context) may be slow on a busy machine
LOADING = "<loading the target>"


@dataclass
class TargetInfo:
    """What a report needs of a target that was loaded in a worker."""
    spec: str
    name: str
    module: str = ""
    claims_conformance: bool = False
    version: str = ""
    device: str = ""
    load_error: str = ""
    usage_error: bool = False       # the spec names something that is not a target (exit status 2)
    threads_left: list = field(default_factory=list)    # non-daemon threads it left running in a worker
    processes_left: list = field(default_factory=list)  # processes it left running there (ended since)


def threads_left() -> list[str]:
    """The names of the non-daemon threads alive beside the main thread: a target's leftovers."""
    return [t.name for t in threading.enumerate()
            if t is not threading.main_thread() and not t.daemon and t.is_alive()]


def visible_gpus() -> list[str]:
    """The GPUs a worker may be pinned to: CUDA_VISIBLE_DEVICES's entries, else every device torch sees."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d for d in listed.split(",") if d.strip()]
    if no_gpu_here():               # the supervisor of workers on the CPU never imports torch
        return []
    try:
        import torch
        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:       # noqa: BLE001 -- no usable CUDA: workers run on the CPU
        return []


def devices_for(jobs: int) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES of each worker (None: inherit) -- pinned only when there are several GPUs."""
    gpus = visible_gpus()
    return [gpus[i % len(gpus)] for i in range(jobs)] if len(gpus) > 1 else [None] * jobs


def cores_for(jobs: int) -> list[list[int]]:
    """The CPU cores of each worker: this process's cores dealt out, so that N workers do not
    each start one torch thread per core of the machine."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) < jobs:
        return [cores] * jobs
    return [cores[i::jobs] for i in range(jobs)]


def _pin(cores: list[int]):
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
        import torch
        torch.set_num_threads(len(cores))


# ------------------------------------------------------------------------------------------------
# The worker
# ------------------------------------------------------------------------------------------------

def _worker(conn, cores, run: dict, timeout):
    from dsv4spec.parent_death import signal_on_parent_death
    signal_on_parent_death(signal.SIGKILL)             # a supervisor that dies takes its workers along
    os.setpgid(0, 0)                                   # a group of its own: what a target forks is found in it
    signal.signal(signal.SIGINT, signal.SIG_IGN)       # the supervisor handles Ctrl-C
    _pin(cores)
    skip_dead_overflow_checks()                        # a process of ours (dsv4spec/interpreter.py)
    for setting, value in run.items():                 # the supervisor's RUN: seed, program, isolate, ...
        setattr(suite.RUN, setting, value)
    WATCH.report = lambda op: conn.send(("op", op))
    WATCH.port = lambda pgid: conn.send(("port", pgid))
    suite.load_checks()
    targets = {}
    while True:
        task = conn.recv()
        if task is None:
            for spec, target in targets.items():        # read by the supervisor's stop
                if left := left_by(target, close=True):
                    conn.send(("processes", spec, left))
            if threads_left():      # reported with their rows; they would hold this process for join's 5 s
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)
            return
        index, spec, rule_id, profile, hung = task
        if spec not in targets:
            conn.send(("op", LOADING))
            try:
                t = load_target(spec)
                t.timeout = timeout
                targets[spec] = t
            except (TargetNotFound, TargetLoadError) as e:
                conn.send(("load_error", index, str(e), isinstance(e, TargetNotFound)))
                continue
            conn.send(("op", None))
            conn.send(("loaded", asdict(TargetInfo(spec, t.name, t.module, t.claims_conformance, t.version, str(t.device)))))
        targets[spec].hung.update(hung)         # operations that hung a worker before are not called again
        row = suite.run_rule(rule_id, targets[spec], profile)
        if left := threads_left():  # before the row: the supervisor may end this worker on it
            conn.send(("threads", spec, left))
        if left := processes_left(lambda: in_group(os.getpid(), besides={os.getpid()})) + left_by(targets[spec]):
            conn.send(("processes", spec, left))
        conn.send(("row", index, asdict(row)))


# ------------------------------------------------------------------------------------------------
# The supervisor
# ------------------------------------------------------------------------------------------------

def end_groups(pgids: set[int]) -> None:
    """SIGKILL the process groups of the ports a worker started (their children included), once
    the worker is gone: a port outlives a worker killed in the middle of a call."""
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    pgids.clear()


class _Slot:
    def __init__(self, ctx, device, cores, *args):
        self.ctx, self.device = ctx, device
        self.args = (cores, *args)
        self.process = self.conn = self.task = None
        self.op, self.since = None, 0.0
        self.ports: set[int] = set()        # process groups of the ports its worker started

    def start(self):
        parent, child = self.ctx.Pipe()
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        if self.device is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = self.device
        try:
            self.process = self.ctx.Process(target=_worker, args=(child, *self.args), daemon=True)
            self.process.start()
        finally:
            if self.device is not None:
                if saved is None:
                    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                else:
                    os.environ["CUDA_VISIBLE_DEVICES"] = saved
        child.close()
        self.conn = parent

    def give(self, task, hung):
        if self.process is None or not self.process.is_alive():
            self.start()
        self.task, self.op, self.since = task, None, time.monotonic()
        self.conn.send((*task, hung))

    def kill(self) -> list[str]:
        """End the worker, its ports and what it left running in its group (named)."""
        left = []
        if self.process is not None:
            self.process.kill()
            self.process.join()
            left = processes_left(lambda: in_group(self.process.pid))
        self.process = self.conn = None
        end_groups(self.ports)
        return left

    def stop(self, infos: dict):
        """End the worker, after it has closed its targets and said what their ports left running."""
        if self.process is not None and self.process.is_alive():
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.process.join(5)
            _drain(self, None, infos, ())
        self.kill()


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a worker run, with what is known of the targets (their names)."""

    def __init__(self, infos: dict[str, TargetInfo]):
        super().__init__()
        self.infos = infos


def run(specs: list[str], rule_ids: list[str], profile: str, *, jobs: int = 1, seed: int | None = None,
        timeout: float = 60.0, isolate: bool = False, progress=None) -> tuple[list[Row], dict[str, TargetInfo]]:
    """Every rule on every target in `jobs` worker processes; rows in the single-process order.
    `isolate` (asked for by the user) adds --isolate to every reproduce line; a crash or hang row
    has it anyway."""
    pool = Pool(jobs=jobs, seed=seed, timeout=timeout, isolate=isolate)
    try:
        return pool.run(specs, rule_ids, profile, progress)
    finally:
        pool.close()


class Pool:
    """Worker processes kept between runs (the pytest route runs one rule at a time through one);
    a worker keeps the targets it loaded, and a dead or killed one is replaced at the next task."""

    def __init__(self, *, jobs: int = 1, seed: int | None = None, timeout: float = 60.0, isolate: bool = False):
        self.seed, self.timeout, self.isolate = seed, timeout, isolate
        program = suite.RUN.program or suite.program()
        ctx = multiprocessing.get_context("spawn")
        pinned = jobs > 1 and devices_for(jobs)[0] is None          # CPU workers share the cores out
        cores = cores_for(jobs) if pinned else [[]] * jobs
        run = dict(seed=seed, program=program, isolate=isolate, debug=suite.RUN.debug,
                   max_examples=suite.RUN.max_examples)
        self.slots = [_Slot(ctx, d, c, run, timeout) for d, c in zip(devices_for(jobs), cores)]
        self.infos: dict[str, TargetInfo] = {}
        self.hung: dict[str, dict[str, str]] = {}

    def close(self):
        for slot in self.slots:
            slot.stop(self.infos)

    def run(self, specs: list[str], rule_ids: list[str], profile: str,
            progress=None) -> tuple[list[Row], dict[str, TargetInfo]]:
        slots, timeout, seed = self.slots, self.timeout, self.seed
        tasks = deque((i, spec, rule_id, profile) for i, (spec, rule_id) in
                      enumerate((s, r) for s in specs for r in rule_ids))
        rows: dict[int, Row] = {}
        infos, hung = self.infos, self.hung
        for spec in specs:
            infos.setdefault(spec, TargetInfo(spec, spec))
            hung.setdefault(spec, {})

        def record(index, row, shown=True):     # a target's load error is one line, not a row a rule
            rows[index] = row
            if progress and shown:
                progress(row)

        def lost(slot, status, why):
            index, spec, rule_id, _ = slot.task
            if slot.op == LOADING:          # it would die the same way for every rule
                infos[spec].load_error = why = f"target {spec!r} could not be loaded: {why}"
            elif status == TIMEOUT:
                hung[spec][slot.op] = why
            infos[spec].processes_left.extend(slot.kill())
            repro = suite.reproduce_command(spec, rule_id, profile, seed, timeout, isolate=True)
            record(index, Row(rule_id, infos[spec].name, status, why, repro), shown=not infos[spec].load_error)
            slot.task = None

        try:
            while tasks or any(s.task for s in slots):
                for slot in slots:
                    while slot.task is None and tasks:
                        task = tasks.popleft()
                        index, spec, rule_id, _ = task
                        if infos[spec].load_error:
                            record(index, Row(rule_id, infos[spec].name, ERROR, infos[spec].load_error), shown=False)
                            continue
                        slot.give(task, hung[spec])
                WATCH.safe_point()          # the command's: a SIGTERM or SIGINT it recorded ends the run here
                busy = [s for s in slots if s.task]
                ready = wait([s.conn for s in busy] + [s.process.sentinel for s in busy], timeout=0.5)
                for slot in busy:
                    _drain(slot, record, infos, ready)
                    if slot.task is None:
                        continue
                    if not slot.process.is_alive():
                        code = slot.process.exitcode
                        cause = f"signal {signal.Signals(-code).name}" if code and code < 0 else f"exit status {code}"
                        lost(slot, ERROR, f"the target's process died ({cause}) in {slot.op or 'the check code'}")
                        continue
                    limit = LOAD_LIMIT_S if slot.op == LOADING else timeout + GRACE_S
                    if slot.op and time.monotonic() - slot.since > limit:
                        lost(slot, TIMEOUT, f"{slot.op} did not return within {limit - GRACE_S:g} s "
                                            f"(the target's process was ended)")
        except BaseException as e:         # Ctrl-C: end the workers now, whatever they are running
            for slot in slots:
                slot.kill()
            if isinstance(e, KeyboardInterrupt):
                raise Interrupted(infos) from None
            raise
        return [rows[i] for i in sorted(rows)], {spec: infos[spec] for spec in specs}


def _drain(slot, record, infos, ready):
    """Read every message a worker has sent so far."""
    while slot.conn in ready or slot.conn.poll():
        try:
            message = slot.conn.recv()
        except (EOFError, OSError):
            return
        ready = ()
        kind = message[0]
        if kind == "op":
            slot.op, slot.since = message[1], time.monotonic()
        elif kind == "port":
            slot.ports.add(message[1])
        elif kind in ("threads", "processes"):
            known = getattr(infos[message[1]], f"{kind}_left")
            known.extend(n for n in message[2] if n not in known)
        elif kind == "loaded":
            infos[message[1]["spec"]] = TargetInfo(**message[1])
        elif kind == "row":
            record(message[1], Row(**message[2]))
            slot.task = None
            return
        elif kind == "load_error":
            _, index, why, usage = message
            spec = slot.task[1]
            infos[spec].load_error, infos[spec].usage_error = why, usage
            record(index, Row(slot.task[2], infos[spec].name, ERROR, why), shown=False)
            slot.task = None
            return
