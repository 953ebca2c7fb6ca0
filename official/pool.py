"""official.pool: the pool operations as the official code computes them."""

__all__: list = []
