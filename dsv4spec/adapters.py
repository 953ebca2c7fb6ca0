"""dsv4spec.adapters: exact converters from common encodings to the target contract (documented in
dsv4spec.runner.adapters, where they live beside the suite that checks the results)."""
from dsv4spec.runner.adapters import *  # noqa: F401,F403
from dsv4spec.runner.adapters import __all__  # noqa: F401
