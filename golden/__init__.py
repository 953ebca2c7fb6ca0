"""dsv4spec.golden: golden tensors, their manifest, the generator and the checker."""
