"""dsv4spec.kernels: Triton kernels for the same operations as impl, with thin launchers.

Launchers take and return CPU tensors like every target; they run on CUDA when a GPU is present
and under TRITON_INTERPRET=1 otherwise (set before this package is imported).
"""
from .quant import *  # noqa: F401,F403
from .indexer import *  # noqa: F401,F403
from .pool import *  # noqa: F401,F403

NAME = "kernels"
CLAIMS_CONFORMANCE = True
VARIANTS: dict = {}
