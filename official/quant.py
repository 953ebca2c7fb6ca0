"""official.quant: the quant operations as the official code computes them."""

__all__: list = []
