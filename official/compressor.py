"""official.compressor: the compressor operations as the official code computes them."""

__all__: list = []
