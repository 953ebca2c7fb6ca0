"""official.indexer: the indexer operations as the official code computes them."""

__all__: list = []
