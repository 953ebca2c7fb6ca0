"""A child process that ends with its parent: the supervisor's forked verify, the --isolate workers
and the exec: ports.  Imports nothing of the package, so that every layer may use it."""
import sys

PR_SET_PDEATHSIG = 1


def signal_on_parent_death(number: int) -> None:
    """Have the kernel send this process `number` when its parent dies (Linux; elsewhere nothing)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(number), 0, 0, 0)
    except (OSError, AttributeError):
        pass
