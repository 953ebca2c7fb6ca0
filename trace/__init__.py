"""dsv4spec.trace: the second way in (docs/TRACE.md).  An engine records the tensors at the stage
boundaries of the layers and steps it chooses (`Recorder`, or `record_official`'s forward hooks on
code shaped like the official model.py); `dsv4spec check-trace` judges each recorded stage from its
recorded input by the judge `verify` uses for it (trace.judge)."""
from .format import MANIFEST, STAGES, VERSION, VOCABULARY, Recorder, Step, Trace, TraceError
from .hooks import OFFICIAL_NAMES, record_official

__all__ = ["Recorder", "Trace", "TraceError", "Step", "record_official", "OFFICIAL_NAMES", "VOCABULARY",
           "STAGES", "MANIFEST", "VERSION"]
