"""dsv4spec.impl: the readable reference implementation, one module per rule family.

Every public operation is re-exported here under its canonical name, so this package is itself a
target (`dsv4spec verify --target impl`).
"""
from .quant import *  # noqa: F401,F403
from .indexer import *  # noqa: F401,F403
from .pool import *  # noqa: F401,F403
from .compressor import *  # noqa: F401,F403
from .layout import *  # noqa: F401,F403
from .budget import *  # noqa: F401,F403
from .rope import *  # noqa: F401,F403
from .path import *  # noqa: F401,F403
from .attn import *  # noqa: F401,F403

NAME = "impl"
DEVICE = "cpu"
CLAIMS_CONFORMANCE = True
CONTRACT = 7                     # the target contract version it is written against (properties/target.py)
VARIANTS: dict = {}
EXTENSIONS = {"chunked_prefill", "streaming"}   # beyond the official domain (spec.rules.EXTENSIONS)
