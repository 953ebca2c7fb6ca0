"""The coverage engine: the recording proxy, every family's boundaries by rule, the runs (a rule's
checks against a target, the shares of drawn examples, the layer strategies) and the report."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ...spec.rules import select
from ...properties.compare import as_numpy
from ..suite import checks_for, run_check
from ..target import Target, load_target
from .attn import attn_boundaries
from .boundary import Boundary, Call, F32, LEVELS
from .budget import budget_boundaries
from .compressor import cmp_boundaries
from .indexer import had_boundaries, idx_boundaries
from .layout import layout_boundaries
from .path import layer_boundaries, path_boundaries
from .pool import pool_rule_boundaries
from .quant import quant_boundaries
from .rope import rope_boundaries


class Recorder(Target):
    """A view of a target that records the inputs of every operation call, then makes it, and
    which of them a randomly drawn example made (suite.forall calls example_starts)."""

    def __init__(self, target: Target, memo: dict | None = None):
        self.__dict__.update(target.__dict__)
        # A provider of its own: a check that caches a target's results by provider (path.run_layer)
        # calls this one's operations afresh, so every rule's recording holds its own inputs; the
        # layer operations' results are kept in `memo` (one coverage run's), keyed by their inputs.
        self.provider = _SameProvider(target.provider)
        self.memo = {} if memo is None else memo
        self.calls: list[Call] = []
        self.check = ""
        self.drawn: int | None = None
        self.draws = 0

    def example_starts(self, explicit: bool):
        if explicit:
            self.drawn = 0
        else:
            self.draws += 1
            self.drawn = self.draws

    def op(self, name: str):
        fn = Target.op(self, name)

        def recorded(*args, **kwargs):
            call = Call(name, tuple(_plain(a) for a in args), {k: _plain(v) for k, v in kwargs.items()},
                        self.drawn, self.check)
            self.calls.append(call)
            if name not in MEMO_OPS:
                return fn(*args, **kwargs)
            key = (name, _digest(call.args), _digest(call.kwargs))
            if key not in self.memo:
                self.memo[key] = fn(*args, **kwargs)
            return self.memo[key]
        return recorded


MEMO_OPS = ("index_layer", "attention_layer")      # a layer at real shapes: seconds a call


def _digest(a):
    """A hashable digest of an operation's inputs (arrays by dtype, shape and bytes)."""
    if isinstance(a, dict):
        return tuple((k, _digest(v)) for k, v in sorted(a.items()))
    if isinstance(a, (tuple, list)):
        return tuple(_digest(v) for v in a)
    if isinstance(a, np.ndarray) or hasattr(a, "detach"):
        a = np.ascontiguousarray(_plain(a))
        return a.dtype.str, a.shape, hashlib.sha1(a.tobytes()).hexdigest()
    return a


class _SameProvider:
    """The provider's operations and attributes under another identity."""

    def __init__(self, provider):
        self.__dict__["_provider"] = provider

    def __getattr__(self, name):
        return getattr(self._provider, name)


def _plain(a):
    return as_numpy(a).copy() if hasattr(a, "detach") else a


def boundaries(rule_id: str) -> list[Boundary]:
    return BOUNDARIES.get(rule_id, [])


# Each family's, in the order the families were written (quant, indexer, pool, then the argument-level ones).
BOUNDARIES = {**quant_boundaries(), **idx_boundaries(), **pool_rule_boundaries(), **had_boundaries(),
              **cmp_boundaries(), **layout_boundaries(), **budget_boundaries(), **layer_boundaries(),
              **rope_boundaries(), **path_boundaries(), **attn_boundaries()}
REQUIRED = ("FMT", "FP4", "FP8", "IDX", "POOL")      # families whose ci coverage must be complete
OTHER = ("HAD", "CMP", "LAYOUT", "BUDGET", "LAYER", "ROPE", "PATH", "ATTN")   # the argument-level ones


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------

RANDOM_REACH = 1 / 50       # each boundary reached by at least this share of a check's drawn examples


@dataclass
class RuleCoverage:
    rule_id: str
    reached: list[Boundary]
    missed: list[Boundary]
    calls: int
    drawn: dict = None      # boundary name -> the largest share of one check's drawn examples reaching it
    by_examples: frozenset = frozenset()    # names of the boundaries explicit @examples reach
    counts: dict = None     # boundary name -> (drawn examples reaching it, drawn examples) of that check
    strategy: dict = None   # layer boundary name -> the share of its layer strategy's own draws (strategy_rates)

    def random_rate(self, b: Boundary) -> float:
        return (self.drawn or {}).get(b.name, 0.0)

    def random_count(self, b: Boundary) -> tuple[int, int]:
        return (self.counts or {}).get(b.name, (0, 0))

    def strategy_rate(self, b: Boundary) -> float | None:
        return (self.strategy or {}).get(b.name)

    def reached_by(self, b: Boundary) -> str:
        """'drawn' (random draws reach it), 'examples' (explicit @examples only) or 'sweep' (a
        fixed, exhaustive sweep only)."""
        return "drawn" if self.random_rate(b) > 0 else "examples" if b.name in self.by_examples else "sweep"


def _per_drawn_example(calls) -> dict[str, list[list[Call]]]:
    """{check: [the calls of each of its drawn examples]}."""
    out: dict[str, dict[int, list[Call]]] = {}
    for c in calls:
        if c.drawn:
            out.setdefault(c.check, {}).setdefault(c.drawn, []).append(c)
    return {check: list(by.values()) for check, by in out.items()}


def random_counts(listed, calls, sample: int = 100) -> dict[str, tuple[int, int]]:
    """Per boundary, (reaching, drawn) for the check whose drawn examples reach it in the largest
    share (at most `sample` examples a check, evenly spaced; of a boundary read from one operation,
    only the checks that call it); (0, the most such a check drew) when no drawn example reaches it."""
    drawn = [c for c in calls if c.drawn]
    examples = {check: ex[::max(1, len(ex) // sample)] for check, ex in _per_drawn_example(calls).items()}
    calling = {op: [ex for ex in examples.values() if any(c.op == op for e in ex for c in e)]
               for op in {c.op for c in drawn}}
    counts = {}
    for b in listed:
        checks = calling.get(b.op, []) if b.op else list(examples.values())
        hits = [(sum(bool(b.reached(e)) for e in ex), len(ex)) for ex in checks] if b.reached(drawn) else []
        counts[b.name] = max(hits, key=lambda h: h[0] / h[1], default=(0, max(map(len, checks), default=0)))
    return counts


def random_rates(listed, calls, sample: int = 100) -> dict[str, float]:
    """Per boundary, the largest share of one check's drawn examples that reach it on their own
    (random_counts; 0 when no drawn example reaches it)."""
    return {name: hits / n if n else 0.0 for name, (hits, n) in random_counts(listed, calls, sample).items()}


# ---------------------------------------------------------------------------------------------
# The layer strategies, measured on their own
# ---------------------------------------------------------------------------------------------
# A layer check runs a whole layer an example, so ci draws 2 (dev 10, thorough 100): too few to show
# a rate of 1/50 from the checks' own draws.  The strategy itself is cheap: STRATEGY_DRAWS keys of
# path.layer_keys drawn as a dev run draws them (seed STRATEGY_SEED), each classified by the same
# boundaries as a call of the layer operations, and nothing run on them.
STRATEGY_DRAWS, STRATEGY_SEED = 400, 0
LAYER_OPS = MEMO_OPS


def drawn_values(strategy, draws: int = STRATEGY_DRAWS, seed: int = STRATEGY_SEED) -> list:
    """`draws` values of a strategy as a dev run with the seed `seed` generates them (the generate
    phase alone: no explicit example, no shrinking)."""
    from hypothesis import Phase, given, seed as seeded, settings
    from ..suite import settings_for
    out = []

    @seeded(seed)
    @settings(settings_for("PATH.LAYER", "dev", shrink=False), max_examples=draws, phases=(Phase.generate,))
    @given(strategy)
    def draw(value):
        out.append(value)
    draw()
    return out


def layer_key_calls(key: tuple) -> list[Call]:
    """A layer key (model, layer, seqlen, start_pos, seed) as the calls of the layer operations the
    boundaries read (x of seqlen rows, the model, the layer and the start position)."""
    model, layer, seqlen, start_pos, _ = key
    inputs = {"x": np.empty((seqlen, 0), F32)}
    return [Call(op, (inputs,), dict(model=model, layer=layer, start_pos=start_pos), 1) for op in LAYER_OPS]


def layer_strategy_rules() -> dict[str, tuple]:
    """{rule: the layer kinds its layer check draws from (path.layer_keys)}."""
    from ...properties import attn, path      # noqa: F401  (each registers its layer checks' kinds)
    return dict(path.LAYER_CHECK_KINDS)


_KEYS: dict = {}         # sorted kinds -> the default draws of layer_keys(kinds), once a process


def _layer_keys(kinds: tuple) -> list[tuple]:
    from ...properties.path import layer_keys
    key = tuple(sorted(kinds))
    if key not in _KEYS:
        _KEYS[key] = drawn_values(layer_keys(key))
    return _KEYS[key]


def strategy_rates(rule_id: str, keys: list | None = None) -> dict[str, float]:
    """Per layer boundary of the rule (one its layer operations decide), the share of its layer
    check's strategy draws that reach it (`keys`: the draws to classify, default that strategy's
    STRATEGY_DRAWS); {} for a rule without a layer check."""
    kinds = layer_strategy_rules().get(rule_id)
    if kinds is None:
        return {}
    keys = _layer_keys(kinds) if keys is None else keys
    calls = [layer_key_calls(k) for k in keys]
    return {b.name: sum(bool(b.reached(c)) for c in calls) / max(1, len(calls))
            for b in boundaries(rule_id) if b.op in LAYER_OPS}


def rarely_drawn_by_the_strategies(rates: dict | None = None) -> dict[str, dict[str, float]]:
    """{rule: {layer boundary: its strategy rate}} for those below RANDOM_REACH (`rates`: rule ->
    strategy_rates, default every rule with a layer check)."""
    rates = {r: strategy_rates(r) for r in layer_strategy_rules()} if rates is None else rates
    low = {rule: {name: rate for name, rate in by.items() if rate < RANDOM_REACH} for rule, by in rates.items()}
    return {rule: by for rule, by in low.items() if by}


def rule_coverage(rule_id: str, target: Target | None = None, profile: str = "ci",
                  memo: dict | None = None) -> RuleCoverage:
    """Run every check of the rule against the target (impl by default) and evaluate its boundaries,
    on every input and on the randomly drawn examples alone (`memo`: layer results shared by the
    rules of one run)."""
    recorder = Recorder(target or load_target("impl"), memo)
    for chk in checks_for(rule_id):
        recorder.check, recorder.drawn = chk.name, None      # None until an example starts: a sweep
        run_check(chk, recorder, profile)
    listed = boundaries(rule_id)
    hit = [b.reached(recorder.calls) for b in listed]
    explicit = [c for c in recorder.calls if c.drawn == 0]
    counts = random_counts(listed, recorder.calls)
    return RuleCoverage(rule_id, [b for b, h in zip(listed, hit) if h],
                        [b for b, h in zip(listed, hit) if not h], len(recorder.calls),
                        {name: h / n if n else 0.0 for name, (h, n) in counts.items()},
                        frozenset(b.name for b, h in zip(listed, hit) if h and b.reached(explicit)),
                        counts, strategy_rates(rule_id))


def coverage(prefixes=None, target: Target | None = None, profile: str = "ci", progress=None) -> list[RuleCoverage]:
    out, memo = [], {}
    target = target or load_target("impl")
    for r in select(prefixes):
        if r.id in BOUNDARIES:
            out.append(rule_coverage(r.id, target, profile, memo))
            if progress:
                progress(out[-1])
    return out


def _drawn(rc: RuleCoverage, b: Boundary) -> str:
    """How the checks' own drawn examples reach a boundary: a share, or 'k of n' where one check
    draws too few examples (under 50) for a share to say anything of 1/50."""
    hits, n = rc.random_count(b)
    return f"random draws {hits} of {n}" if n < 1 / RANDOM_REACH else f"random draws {hits / n:.1%}"


def _strategy(rc: RuleCoverage, b: Boundary) -> str:
    rate = rc.strategy_rate(b)
    return "" if rate is None else f"; the strategy {rate:.1%} of {STRATEGY_DRAWS} draws"


def render(results: list[RuleCoverage], show_reached: bool = False, show_clauses: bool = False) -> str:
    """Per rule: the boundaries reached (by any input; by random draws; by at least 1/50 of one
    check's drawn examples), then each one missed, reached only by explicit examples or fixed
    sweeps, or drawn too rarely, with --reached every one with its random reach, and with
    --clauses the statement's clauses beside the check and the mutants that fail when one changes.
    A layer boundary also shows the share of its layer strategy's own draws that reach it
    (strategy_rates): what a layer check draws per example, which ci's 2 draws cannot show."""
    from ...properties import clauses as CL
    lines = []
    for rc in results:
        total = len(rc.reached) + len(rc.missed)
        by_draws = [b for b in rc.reached if rc.random_rate(b) > 0]
        often = [b for b in by_draws if rc.random_rate(b) >= RANDOM_REACH]
        strategy = [b for b in rc.reached + rc.missed if rc.strategy_rate(b) is not None]
        lines.append(f"{rc.rule_id:<22} {len(rc.reached):>3}/{total:<3} boundaries reached, "
                     f"{len(by_draws):>3} by random draws, {len(often):>3} in ≥ 1/50 of the draws ({rc.calls} calls)"
                     + (f"; {sum(rc.strategy_rate(b) >= RANDOM_REACH for b in strategy)}/{len(strategy)} layer "
                        f"boundaries in ≥ 1/50 of the strategy's {STRATEGY_DRAWS} draws" if strategy else ""))
        for b in sorted(rc.missed, key=lambda b: LEVELS.index(b.level)):
            lines.append(f"    MISSED        [{b.level}] {b.name}" + (f"  ({_strategy(rc, b)[2:]})" if _strategy(rc, b) else ""))
        for b in rc.reached:
            rate, strat = rc.random_rate(b), rc.strategy_rate(b)
            if show_reached:
                how = _drawn(rc, b) if rate else f"{rc.reached_by(b)} only"
                lines.append(f"    reached [{b.level}] {b.name}  ({how}{_strategy(rc, b)})")
            elif strat is not None and strat < RANDOM_REACH:
                lines.append(f"    rarely drawn  [{b.level}] {b.name}  ({_drawn(rc, b)}{_strategy(rc, b)})")
            elif rate == 0:
                lines.append(f"    {rc.reached_by(b) + ' only':<13} [{b.level}] {b.name}"
                             + (f"  ({_drawn(rc, b)}{_strategy(rc, b)})" if strat is not None else ""))
            elif rate < RANDOM_REACH:
                lines.append(f"    rarely {rate:6.1%} [{b.level}] {b.name}")
        if show_clauses:
            lines += CL.render(rc.rule_id, [chk.name for chk in checks_for(rc.rule_id)])
    reached = sum(len(rc.reached) for rc in results)
    drawn = sum(1 for rc in results for b in rc.reached if rc.random_rate(b) > 0)
    often = sum(1 for rc in results for b in rc.reached if rc.random_rate(b) >= RANDOM_REACH)
    missed = sum(len(rc.missed) for rc in results)
    layer = [rc.strategy_rate(b) for rc in results for b in rc.reached + rc.missed if rc.strategy_rate(b) is not None]
    lines.append(f"\n{len(results)} rules, {reached} boundaries reached ({drawn} by random draws, {often} in "
                 f"≥ 1/50 of them), {missed} missed"
                 + (f"; {sum(r >= RANDOM_REACH for r in layer)}/{len(layer)} layer boundaries in ≥ 1/50 of their "
                    f"strategy's {STRATEGY_DRAWS} draws" if layer else ""))
    return "\n".join(lines)
