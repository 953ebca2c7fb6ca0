"""dsv4spec.kernels: Triton kernels for the same operations as impl, with thin launchers.

Launchers take and return CPU tensors like every target; they run on CUDA when a GPU is present
and under the Triton interpreter otherwise.
"""
from .mode import INTERPRET  # first: decides interpreter or GPU before any kernel is decorated
from .quant import *  # noqa: F401,F403
from .indexer import *  # noqa: F401,F403
from .pool import *  # noqa: F401,F403
from .path import *  # noqa: F401,F403
from .attn import *  # noqa: F401,F403

NAME = "kernels"
DEVICE = "cpu (Triton interpreter)" if INTERPRET else "cuda"   # where the kernels run (informative)
CLAIMS_CONFORMANCE = True
CONTRACT = 5                     # the target contract version it is written against (properties/target.py)
VARIANTS: dict = {}
EXTENSIONS = {"chunked_prefill"}   # beyond the official domain (spec.rules.EXTENSIONS)
