"""Every golden case, in file order, and the spec's outputs for any of them: the catalog over the
codec, indexer and attention cases (cases.py), the path layers (layers.py) and the attention layers
(attn_layers.py), which build on cases.py's helpers."""
from __future__ import annotations

import functools

import numpy as np

from .attn_layers import ATTN_SPEC, attention_layer_cases
from .cases import SPEC, Case, attention_cases, codec_cases, fp32_codec_cases, indexer_cases
from .layers import PATH_SPEC, path_cases


@functools.lru_cache(maxsize=1)
def _cases() -> tuple[Case, ...]:
    return (*codec_cases(), *indexer_cases(), *path_cases(), *attention_cases(), *attention_layer_cases(),
            *fp32_codec_cases())


def cases() -> list[Case]:
    """Every golden case, in file order (built once: the layer cases search for determined inputs)."""
    return list(_cases())


def spec_outputs(case: Case) -> dict[str, np.ndarray]:
    definition = {**SPEC, **PATH_SPEC, **ATTN_SPEC}[case.op]
    if case.call == "mapping":
        result = definition(dict(case.inputs), **case.args)
        return {name: result[name] for name in case.outputs}
    extra, keywords = case.call_args()
    result = definition(*case.inputs.values(), *extra, **keywords)
    result = result if isinstance(result, tuple) else (result,)
    return dict(zip(case.outputs, result))
