"""The Triton interpreter's dead work, skipped in dsv4spec's own processes (its command line, the
workers it starts, its test run); never in a process of the suite's users, whose settings stay theirs."""
import dataclasses

from dsv4spec.triton_mode import choose


def skip_dead_overflow_checks() -> bool:
    """The interpreter evaluates Triton's integer-overflow sanitizer on every int32 add, sub and mul
    (an int64 copy of the operation and two comparisons: a third of a codec kernel's interpreted
    time) and then drops it: the device_assert it feeds returns at once unless options.debug
    (triton-lang/triton python/triton/language/semantic.py, TritonSemantic.device_assert, L1840-1842
    in 3.6.0).  With debug off, switching the sanitizer off removes only that dead work.  True when
    it was switched off here.  Makes the interpreter-or-GPU choice first: importing Triton before it
    would decorate Triton's library for a GPU on a machine without one (dsv4spec/triton_mode.py)."""
    if not choose():
        return False
    try:
        from triton.runtime import interpreter
    except ImportError:                       # (every rule but the kernels' runs without Triton)
        return False
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is None or options.debug or not getattr(options, "sanitize_overflow", False):
        return False
    builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True
