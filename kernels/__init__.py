"""dsv4spec.kernels: Triton kernels for the same operations as impl, with thin launchers.

Launchers take and return CPU tensors like every target; they run on CUDA when a GPU is present
and under the Triton interpreter otherwise.
"""
from ..triton_mode import choose, require_triton_in_mode

# Before the first kernel is decorated: without a GPU (and without an explicit setting) the kernels
# run in the interpreter (dsv4spec/triton_mode.py).  Submodules read INTERPRET from here.
INTERPRET = choose()
require_triton_in_mode(INTERPRET)

from .quant import *  # noqa: E402,F401,F403
from .indexer import *  # noqa: E402,F401,F403
from .pool import *  # noqa: E402,F401,F403
from .path import *  # noqa: E402,F401,F403
from .attn import *  # noqa: E402,F401,F403

NAME = "kernels"
DEVICE = "cpu (Triton interpreter)" if INTERPRET else "cuda"   # where the kernels run (informative)
CLAIMS_CONFORMANCE = True
CONTRACT = 5                     # the target contract version it is written against (properties/target.py)
VARIANTS: dict = {}
EXTENSIONS = {"chunked_prefill"}   # beyond the official domain (spec.rules.EXTENSIONS)
