"""One verify run over N CI jobs: `verify --shard K/N` runs the K-th of N shards of the selected
rules, and `report merge` puts the shards' JSON reports back together as the report of the whole run.

A shard is a pure function of the selected rule ids and N (never of the machine, the target or
a timing): the rules, costliest first, each go to the shard with the least expected cost so far.
The expected cost of a rule is its number of checks, a layer check counting LAYER_CHECK_COST
(the ci profile sizes an ordinary check to about a second or two of CPU time; a layer check runs
several whole layers at 2–5 s each, runner/suite.py).
"""
from __future__ import annotations

import re

from .suite import checks_for, _is_layer_check

LAYER_CHECK_COST = 5
EXPECTED = "K/N, shard K of N with 1 <= K <= N (e.g. 2/4)"


def parse(text: str) -> tuple[int, int]:
    """(K, N) of "K/N"; ValueError naming what is expected otherwise."""
    found = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not found or not 1 <= int(found[1]) <= int(found[2]):
        raise ValueError(f"expected {EXPECTED}, got {text!r}")
    return int(found[1]), int(found[2])


def expected_cost(rule_id: str) -> int:
    return sum(LAYER_CHECK_COST if _is_layer_check(rule_id, c.name) else 1 for c in checks_for(rule_id))


def split(rule_ids: list[str], n: int) -> list[list[str]]:
    """The n shards of `rule_ids`, each in the order of `rule_ids`; together they hold every rule once."""
    shards: list[list[str]] = [[] for _ in range(n)]
    loads = [0] * n
    for rule_id in sorted(rule_ids, key=lambda r: (-expected_cost(r), r)):
        lightest = min(range(n), key=lambda i: (loads[i], len(shards[i]), i))
        shards[lightest].append(rule_id)
        loads[lightest] += expected_cost(rule_id)
    position = {r: i for i, r in enumerate(rule_ids)}
    return [sorted(s, key=position.__getitem__) for s in shards]


def shard_of(rule_ids: list[str], k: int, n: int) -> list[str]:
    """The rules of shard k of n; ValueError when it would hold none."""
    if len(rule_ids) < n:
        raise ValueError(f"--shard {k}/{n}: the selection has {len(rule_ids)} rule(s), fewer than {n} shards; "
                         f"expected N <= {len(rule_ids)}")
    return split(rule_ids, n)[k - 1]
