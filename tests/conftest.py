import dataclasses
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported


def _skip_dead_overflow_checks():
    """The interpreter evaluates Triton's integer-overflow sanitizer on every int32 add, sub and mul
    (an int64 copy of the operation and two comparisons: a third of a codec kernel's interpreted
    time) and then drops it: the device_assert it feeds returns at once unless options.debug
    (triton-lang/triton python/triton/language/semantic.py, TritonSemantic.device_assert, L1840-1842
    in 3.6.0).  With debug off, switching the sanitizer off removes only that dead work.  Our test
    processes only; the suite's users keep their settings."""
    try:
        from triton.runtime import interpreter
    except ImportError:                       # (the rules but the kernels' run without Triton)
        return
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is not None and not options.debug and getattr(options, "sanitize_overflow", False):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)


_skip_dead_overflow_checks()
