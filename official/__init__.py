"""dsv4spec.official: the control target.

Every operation computed the way the official DeepSeek reference code computes it, in its order,
dtypes and torch calls (torch.topk's arbitrary ties, int32 indices, no NaN rejection, the
compressor's BF16 casts, BF16 inputs to the quantizers).  It is not impl/: impl is the exact,
readable reference; this is the behaviour the rules must never fail (design.md, "No false alarms").
One module per rule family, as in every other layer.
"""
from .quant import *  # noqa: F401,F403
from .indexer import *  # noqa: F401,F403
from .pool import *  # noqa: F401,F403
from .compressor import *  # noqa: F401,F403
from .rope import *  # noqa: F401,F403
from .path import *  # noqa: F401,F403
from .attn import *  # noqa: F401,F403
from . import quant as _quant

NAME = "official"
DEVICE = "cpu"
CLAIMS_CONFORMANCE = True
CONTRACT = 7                     # the target contract version it is written against (properties/target.py)
VARIANTS: dict = {}
INPUT_DTYPES = {**_quant.INPUT_DTYPES}      # the operations the official code feeds BF16
