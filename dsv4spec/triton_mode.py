"""Where the Triton kernels run: on a CUDA GPU, or in Triton's interpreter on the CPU.

Decided here and only here, before anything of ours imports Triton: `@triton.jit` reads
TRITON_INTERPRET when it decorates, and Triton decorates its own library functions (tl.sum, tl.max,
tl.cdiv, ...) when it is first imported.  A kernel decorated for the interpreter cannot call library
functions decorated for a GPU, nor the reverse.  This module imports nothing of the package, so
every layer (the kernels, the command line, the workers) may use it.
"""
import os
import sys


# The device files a GPU driver makes on Linux: NVIDIA's, ROCm's and WSL2's.  Where none exists torch
# sees no GPU, and a process that only asks whether there is one need not import torch (1.1-1.5 CPU s).
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


def no_gpu_here() -> bool:
    """True only where torch cannot see a GPU: a Linux machine with none of GPU_DEVICE_FILES."""
    return sys.platform.startswith("linux") and not any(os.path.exists(f) for f in GPU_DEVICE_FILES)


class TritonModeMismatch(RuntimeError):
    """Triton was imported in the other mode than the one the kernels need."""


def choose() -> bool:
    """Set TRITON_INTERPRET=1 where no CUDA GPU is present and nobody set it; an explicit setting is
    kept (TRITON_INTERPRET=0 without a GPU compiles ahead of time).  True when kernels interpret."""
    if "TRITON_INTERPRET" not in os.environ:
        import torch
        # device_count asks NVML first; is_available would initialize the CUDA driver, and a process
        # that forks afterwards (the command's verify, a user's DataLoader) has none in its children
        if torch.cuda.device_count() == 0:
            os.environ["TRITON_INTERPRET"] = "1"
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_imported_for_interpreter() -> bool | None:
    """Whether the Triton already imported decorated its library for the interpreter; None before
    Triton is imported."""
    standard = sys.modules.get("triton.language.standard")
    if standard is None:
        return None
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(standard.sum, InterpretedFunction)


def require_triton_in_mode(interpret: bool) -> None:
    """Raise TritonModeMismatch, saying what happened and what to do, when Triton was imported in the
    other mode (its kernels would fail at their first call, deep inside Triton)."""
    imported = triton_imported_for_interpreter()
    if imported is None or imported == interpret:
        return
    if interpret:
        raise TritonModeMismatch(
            "Triton was imported for a GPU (TRITON_INTERPRET unset when `import triton` first ran), but "
            "this machine has no CUDA GPU, so the kernels must run in Triton's interpreter, and "
            "interpreted kernels cannot call Triton's GPU-decorated library (tl.sum, tl.max, ...). "
            "Set TRITON_INTERPRET=1 in the environment before Python starts (or before the first "
            "`import triton`), or import dsv4spec.kernels before triton.")
    raise TritonModeMismatch(
        f"Triton was imported for its interpreter (TRITON_INTERPRET=1 when `import triton` first ran), "
        f"but TRITON_INTERPRET is now {os.environ.get('TRITON_INTERPRET', 'unset')!r}, so the kernels "
        f"would be compiled for a GPU and could not call Triton's interpreted library. Keep one "
        f"TRITON_INTERPRET setting for the whole process, set before the first `import triton`.")
