"""dsv4spec.runner: what runs the checks of dsv4spec.properties on targets (the target contract and
its loader, the exec protocol, workers, the suite runner, reports, shards, merge, the pytest plugin,
adapters, coverage)."""
