"""Settings of an interactive-imitation run: static shapes and traced regimes.

[`InteractiveConfig`][jaxil.algorithms.interactive.config.InteractiveConfig]
fixes what the compiled program's shapes depend on (rounds, environments per
round, updates, networks). A *regime* is one
[`RegimeHParams`][jaxil.algorithms.interactive.config.RegimeHParams] — arrays
only, so many regimes (methods, budgets, ablations) × seeds run as one `vmap`
axis of ONE compiled program.

The methods are presets of the same knobs
([`regime`][jaxil.algorithms.interactive.config.regime]):

| method   | who acts                                   | trained on              | verifier | demos            |
|----------|--------------------------------------------|-------------------------|----------|------------------|
| bc       | (student; no rollout is kept: allowance 0) | the demonstrations only | —        | the whole budget |
| dagger   | expert w.p. β_r/step                       | expert label, all       | off      | SFT set          |
| oec      | student t<k, expert ≥k                     | expert steps (mask)     | on       | SFT set          |
| oec_mix  | as oec                                     | as oec                  | on       | a share ρ        |
| onpolicy | student                                    | own accepted steps      | on       | the whole budget |

Budget accounting: `budget` is the total number of expert labels
(agent-steps an expert annotated) a regime may use, INCLUDING the
demonstrations (the SFT set and any extra demos). `demo_labels` of it are
spent on demonstrations; the rest, `budget − demo_labels`, on interactive
queries, spread evenly over the rounds. On-policy rejection sampling asks
the expert nothing interactively, so it spends its budget on demonstrations,
like BC, and adds its own verified rollouts.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
from flax import struct

from jaxil.algorithms.interactive.labels import VERIFIERS
from jaxil.algorithms.interactive.schedule import BETA_SCHEDULES, SWITCHES

METHODS = ("bc", "dagger", "oec", "oec_mix", "onpolicy")
#: The student's network: `PolicyNet` keywords besides the hidden widths.
STUDENTS: dict[str, dict[str, Any]] = {
    "bc": dict(box="censored_gaussian"),
    "ppo": dict(activation="tanh", init="orthogonal", log_std="param", box="tanh_gaussian",
                obs_norm=True),
}


@dataclasses.dataclass(frozen=True)
class InteractiveConfig:
    """Static settings (changing one recompiles).

    Attributes:
      hidden, shared, batch_size, max_grad_norm: the student (a BC learner's
        [`jaxil.nn.policy.PolicyNet`][jaxil.nn.policy.PolicyNet]) and its updates.
      rounds: interactive rounds after the SFT start.
      envs_per_round: episodes rolled out per round and run.
      updates_per_round: K fused student updates per round.
      sft_labels: expert labels of the demonstration set the student is
        first behaviour-cloned on (the "SFT" start shared by every regime).
      sft_updates: updates of that start.
      capacity: steps the aggregate buffer holds (ring; oldest overwritten).
      eval_episodes: episodes per evaluation, from fixed start states.
      deterministic_eval: evaluate the student's mode instead of samples.
      student: the student's network, one of `STUDENTS`: `"bc"`, the BC
        learner's own (relu, a state-dependent log-std on box actions), or
        `"ppo"`, the PPO actor's (tanh, orthogonal initialisation, a
        state-independent log-std, a tanh-Gaussian head on box actions, and
        observations standardised by the statistics of the SFT
        demonstrations, fixed from then on), which is the network of the
        PPO teachers and of GAIL/AIRL's policy.
    """

    hidden: tuple[int, ...] = (64, 64)
    shared: bool = True
    batch_size: int = 256
    max_grad_norm: float = 1.0
    rounds: int = 8
    envs_per_round: int = 32
    updates_per_round: int = 250
    sft_labels: int = 600
    sft_updates: int = 500
    capacity: int = 8192
    eval_episodes: int = 64
    deterministic_eval: bool = False
    student: str = "bc"

    def __post_init__(self):
        if self.student not in STUDENTS:
            raise ValueError(f"interactive student must be one of {', '.join(STUDENTS)}, "
                             f"got {self.student!r}")
        positive = ("batch_size", "rounds", "envs_per_round", "updates_per_round",
                    "sft_labels", "sft_updates", "capacity", "eval_episodes")
        for name in positive:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"interactive {name} must be a positive integer, got {v!r}")
        if not self.hidden or any(int(h) < 1 for h in self.hidden):
            raise ValueError(f"interactive hidden must be positive layer widths, got {self.hidden}")
        if not self.max_grad_norm > 0:
            raise ValueError(f"interactive max_grad_norm must be > 0, got {self.max_grad_norm}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@struct.dataclass
class RegimeHParams:
    """One regime's traced numbers (see the module docstring and
    [`jaxil.algorithms.interactive.schedule`][jaxil.algorithms.interactive.schedule]
    /
    [`jaxil.algorithms.interactive.labels`][jaxil.algorithms.interactive.labels])."""

    beta0: jax.Array  # DAgger expert probability at round 0
    beta_kind: jax.Array  # index into BETA_SCHEDULES
    beta_rate: jax.Array
    switch_kind: jax.Array  # index into SWITCHES
    switch_lo: jax.Array
    switch_hi: jax.Array
    switch_p: jax.Array
    use_label: jax.Array  # train on the expert's label (else the executed action)
    mask_prefix: jax.Array  # OEC: the student's steps t < k are not trained on
    verifier: jax.Array  # index into VERIFIERS
    return_threshold: jax.Array
    repeat_limit: jax.Array  # repetition filter R (0: off)
    demo_ratio: jax.Array  # share of each batch from the demos (-1: in proportion)
    budget: jax.Array  # total expert labels, demos included
    demo_labels: jax.Array  # labels spent on demonstrations (≥ sft_labels)
    lr: jax.Array
    scratch: jax.Array  # retrain from a fresh initialisation every round
    entropy_gate: jax.Array  # token students: expert takes over above this entropy (-1: off)


_INT_FIELDS = ("beta_kind", "switch_kind", "switch_lo", "switch_hi", "verifier", "repeat_limit",
               "budget", "demo_labels")
_BOOL_FIELDS = ("use_label", "mask_prefix", "scratch")


AUTO = "auto"


def regime(method: str, budget: int, *, sft_labels: int, has_win: bool,
           switch_hi: Any = AUTO, return_threshold: Any = AUTO, **overrides: Any) -> dict[str, Any]:
    """The knobs of `method` at a total `budget` of expert labels, with
    `overrides` (names of
    [`RegimeHParams`][jaxil.algorithms.interactive.config.RegimeHParams];
    `beta_kind`, `switch_kind` and `verifier` also by name). Checked by
    [`check_regime`][jaxil.algorithms.interactive.config.check_regime].

    `switch_hi` and `return_threshold` may stay `"auto"`: the driver then sets
    them from the demonstrations
    ([`resolve_auto`][jaxil.algorithms.interactive.config.resolve_auto])."""
    if method not in METHODS:
        raise ValueError(f"unknown interactive method {method!r}; choose one of {', '.join(METHODS)}")
    h = dict(beta0=0.0, beta_kind="constant", beta_rate=1.0, switch_kind="none", switch_lo=0,
             switch_hi=switch_hi, switch_p=0.1, use_label=False, mask_prefix=False,
             verifier="off", return_threshold=return_threshold, repeat_limit=0,
             demo_ratio=-1.0, budget=budget, demo_labels=sft_labels, lr=1e-3, scratch=False,
             entropy_gate=-1.0)
    verifier = "win" if has_win else "return"
    if method == "bc":
        # The student's rollouts would be labelled (use_label) but the
        # interactive allowance is 0, so none is kept: BC trains on the
        # demonstrations alone. (With use_label off they would cost nothing
        # and BC would also imitate its own rollouts.)
        h.update(demo_labels=budget, use_label=True)
    elif method == "dagger":
        h.update(beta0=0.5, beta_kind="exponential", beta_rate=0.5, use_label=True)
    elif method in ("oec", "oec_mix"):
        h.update(switch_kind="uniform", mask_prefix=True, verifier=verifier, repeat_limit=8)
        if method == "oec_mix":
            h.update(demo_labels=sft_labels + (budget - sft_labels) // 2, demo_ratio=0.5)
    elif method == "onpolicy":
        h.update(verifier=verifier, repeat_limit=8, demo_labels=budget)
    h.update(overrides)
    for name, names in (("beta_kind", BETA_SCHEDULES), ("switch_kind", SWITCHES),
                        ("verifier", VERIFIERS)):
        if isinstance(h[name], str):
            if h[name] not in names:
                raise ValueError(f"{name} must be one of {', '.join(names)}, got {h[name]!r}")
            h[name] = names.index(h[name])
    check_regime(h, sft_labels)
    return h


def resolve_auto(h: Mapping[str, Any], expert_length_mean: float, expert_return_q25: float
                 ) -> dict[str, Any]:
    """`switch_hi = "auto"`: half the expert's mean episode length (so the
    expert takes over in the first half of a typical episode, and the switch
    range is as wide as the episodes are long); `return_threshold = "auto"`:
    the 25th percentile of the demonstrations' returns."""
    h = dict(h)
    if h["switch_hi"] == AUTO:
        h["switch_hi"] = max(int(h["switch_lo"]), int(round(0.5 * expert_length_mean)))
    if h["return_threshold"] == AUTO:
        h["return_threshold"] = float(expert_return_q25)
    return h


def check_regime(h: Mapping[str, Any], sft_labels: int) -> None:
    """One-line errors for values outside their range (`"auto"` values
    are checked once resolved)."""
    unknown = sorted(set(h) - {f.name for f in dataclasses.fields(RegimeHParams)})
    if unknown:
        raise ValueError(f"unknown regime setting(s) {', '.join(unknown)}")

    def bad(name, rule):
        raise ValueError(f"regime {name}={h[name]!r} is out of range: {rule}")

    for name in h:
        v = h[name]
        if isinstance(v, float) and not math.isfinite(v):
            bad(name, "must be finite")
    if not 0.0 <= h["beta0"] <= 1.0:
        bad("beta0", "DAgger's expert probability lies in [0, 1]")
    if not 0 <= h["beta_kind"] < len(BETA_SCHEDULES):
        bad("beta_kind", f"an index into {BETA_SCHEDULES}")
    if h["beta_rate"] < 0 or (h["beta_kind"] == 2 and h["beta_rate"] > 1):
        bad("beta_rate", "≥ 0 (linear: per-round decrement), in [0, 1] for exponential decay")
    if not 0 <= h["switch_kind"] < len(SWITCHES):
        bad("switch_kind", f"an index into {SWITCHES}")
    if h["switch_hi"] == AUTO or h["return_threshold"] == AUTO:
        h = resolve_auto(h, 0.0, 0.0)
    if h["switch_lo"] < 0 or h["switch_hi"] < h["switch_lo"]:
        bad("switch_hi" if h["switch_lo"] >= 0 else "switch_lo", "0 ≤ switch_lo ≤ switch_hi")
    if not 0.0 < h["switch_p"] <= 1.0:
        bad("switch_p", "the geometric switch probability lies in (0, 1]")
    if not 0 <= h["verifier"] < len(VERIFIERS):
        bad("verifier", f"an index into {VERIFIERS}")
    if h["repeat_limit"] < 0 or h["repeat_limit"] == 1:
        bad("repeat_limit", "0 (off) or ≥ 2 repeats")
    if not (h["demo_ratio"] == -1.0 or 0.0 <= h["demo_ratio"] <= 1.0):
        bad("demo_ratio", "-1 (in proportion to the data) or a share in [0, 1]")
    if h["budget"] < sft_labels:
        bad("budget", f"at least the SFT set's {sft_labels} labels")
    if not sft_labels <= h["demo_labels"] <= h["budget"]:
        bad("demo_labels", f"between the SFT set's {sft_labels} labels and the budget {h['budget']}")
    if not h["lr"] > 0:
        bad("lr", "a positive learning rate")
    if not (h["entropy_gate"] == -1.0 or h["entropy_gate"] >= 0.0):
        bad("entropy_gate", "-1 (off) or an entropy threshold ≥ 0 in nats")


def stack_regimes(hs: list[Mapping[str, Any]]) -> RegimeHParams:
    """`[R]`-stacked arrays of several regimes."""
    def col(name):
        dtype = jnp.int32 if name in _INT_FIELDS else (jnp.bool_ if name in _BOOL_FIELDS
                                                       else jnp.float32)
        return jnp.asarray([h[name] for h in hs], dtype)

    return RegimeHParams(**{f.name: col(f.name) for f in dataclasses.fields(RegimeHParams)})
