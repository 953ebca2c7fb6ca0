import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest  # noqa: E402

from dsv4spec.properties.suite import FAIL, run_rule  # noqa: E402
from dsv4spec.properties.target import Target  # noqa: E402


def caught(provider, rule_id: str, profile: str = "ci") -> bool:
    """True when the mutant `provider` is reported FAIL on `rule_id`."""
    row = run_rule(rule_id, Target(provider, provider.NAME), profile)
    return row.status == FAIL


@pytest.fixture
def assert_caught():
    def check(provider, rule_id: str):
        row = run_rule(rule_id, Target(provider, provider.NAME), "ci")
        assert row.status == FAIL, f"mutant {provider.NAME} survived {rule_id}: {row.status} {row.detail}"
    return check
