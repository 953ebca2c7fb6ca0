"""dsv4spec.properties: the conformance suite (targets, checks, comparison policies, reports)."""
