"""The rule families, each checked by the properties module of its name, in the order reports list them."""
FAMILY_MODULES = ("formats", "quant", "indexer", "pool", "compressor", "layout", "budget", "rope", "path", "attn")
