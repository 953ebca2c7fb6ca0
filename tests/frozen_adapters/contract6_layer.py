"""Contract version 6 (2026-12-05): attention_layer from x, its stages up to o_derot (the last it knew)."""
import dsv4spec.impl as lib

NAME = "contract6_layer"
CONTRACT = 6
rope_freqs = lib.rope_freqs


def attention_layer(inputs, *, model, layer, start_pos=0):
    out = lib.attention_layer(inputs, model=model, layer=layer, start_pos=start_pos)
    stages = list(out)
    return {name: out[name] for name in stages[:stages.index("o_derot") + 1]}
