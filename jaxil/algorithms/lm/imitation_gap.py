"""The imitation gap of a privileged expert, as two rates over visited states.

A token task's scripted expert may read the privileged columns
(`obs[:, K:]`, see [`envs.tokens`][jaxil.envs.tokens]); a student sees
only its context. Where the expert's token is not a function of the context,
the student is trained to guess. Over a set of visited agent-steps (DAgger's
labelled states, OEC's expert segments, the demonstrations), restricted to
those with a choice (more than one legal token):

- **differs**: the share where the privileged expert's token differs from
  the transcript-only expert's (the expert that acts on the context alone,
  [`envs.token_transcript`][jaxil.envs.token_transcript]);
- **undetermined**: the share whose context (the agent's token history up to
  that step) is also the context of a selected state of another episode
  (another instance) where the privileged expert's token is different: the
  label is then provably not a function of the context. It is a lower bound on
  the share of undetermined labels (it only sees contexts that recur in the
  sample); `shared` says how many states could show it at all.

A transcript-only expert's rates against itself are 0 by construction.
[expert_labels][jaxil.algorithms.lm.imitation_gap.expert_labels] replays an
expert over recorded episodes (its carry rebuilt step by step, as in the
rollout), [imitation_gap][jaxil.algorithms.lm.imitation_gap.imitation_gap]
computes the rates.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxil.envs.policies import as_policy


@dataclasses.dataclass(frozen=True)
class ImitationGap:
    """The two rates of
    [imitation_gap][jaxil.algorithms.lm.imitation_gap.imitation_gap].

    Attributes:
      states: selected agent-steps with more than one legal token.
      differs: share of them where the privileged and the transcript-only
        expert's tokens differ.
      undetermined: share whose context is that of a selected state of
        another episode with a different privileged token.
      shared: share whose context is that of a selected state of another
        episode at all.
    """

    states: int
    differs: float
    undetermined: float
    shared: float


@functools.partial(jax.jit, static_argnums=(0,))
def _replay(policy, params, obs, avail, key):
    def episode(o, a, k):
        def step(carry, x):
            ob, av, kk = x
            act, carry = policy.act(params, ob, av, kk, carry)
            return carry, jnp.asarray(act, jnp.int32)

        c0 = policy.init(k, o.shape[1])
        return jax.lax.scan(step, c0, (o, a, jax.random.split(k, o.shape[0])))[1]

    return jax.vmap(episode)(obs, avail, jax.random.split(key, obs.shape[0]))


def expert_labels(expert: Any, obs: Any, avail: Any, params: Any = None,
                  seed: int = 0) -> np.ndarray:
    """The tokens `expert` proposes on every step of recorded episodes.

    Args:
      expert: a [Policy][jaxil.envs.policies.Policy] or a plain policy
        function; its carry is started at each episode's first step and
        threaded through every step, played by it or not.
      obs: `[E, T, N, O]` the observations the tokens were chosen on (e.g.
        `Episodes.obs[:, :-1]`).
      avail: `[E, T, N, V]` the legal tokens there.
      params: the expert's parameters (None for a scripted expert).
      seed: the key of a stochastic expert.

    Returns:
      `[E, T, N]` int32 tokens.
    """
    return np.asarray(_replay(as_policy(expert), params, jnp.asarray(obs), jnp.asarray(avail),
                              jax.random.PRNGKey(seed)))


def imitation_gap(env: Any, privileged: Any, transcript: Any, episodes: Any,
                  select: Any = None, params: tuple[Any, Any] = (None, None)) -> ImitationGap:
    """The imitation-gap rates of `privileged` over visited states (see the
    module docstring).

    Args:
      env: the token environment (`token_width`).
      privileged: the expert that may read the privileged columns (e.g.
        `envs.token_expert(env)[0]`).
      transcript: the transcript-only expert (`envs.token_expert(env,
        "transcript")[0]`).
      episodes: recorded [Episodes][jaxil.envs.rollout.Episodes] (`obs`,
        `avail_actions`, `mask`), one instance per episode.
      select: `[E, T]` or `[E, T, N]` bool, the states to count (DAgger's
        labels, OEC's expert segments); default every valid step.
      params: the two experts' parameters.

    Returns:
      An [ImitationGap][jaxil.algorithms.lm.imitation_gap.ImitationGap].

    Raises:
      ValueError: `select` does not match the episodes' shape.
    """
    return imitation_gap_by_turn(env, privileged, transcript, episodes, select, params, 1)[0]


def imitation_gap_by_turn(env: Any, privileged: Any, transcript: Any, episodes: Any,
                          select: Any = None, params: tuple[Any, Any] = (None, None),
                          num_bins: int = 4, labels: Any = None) -> list[ImitationGap]:
    """[imitation_gap][jaxil.algorithms.lm.imitation_gap.imitation_gap]
    over all selected states, then per turn bin: `[all, turn 0, …,
    turn ≥ num_bins − 1]`.

    A state's turn is how many turns its agent had ended before it, read
    from the transcript's echo column (`obs[..., 0] == env.eot_token`), so
    it is the same whether the step's recorded target is the action taken
    or an expert's label. A context's recurrence (`undetermined`,
    `shared`) is judged over all selected states: a shared context is at
    the same turn in both episodes.

    `labels` (`[E, T, N]` int): the privileged expert's recorded tokens
    (a demonstration's actions, DAgger's labels, OEC's expert segments)
    instead of replaying `privileged` (which may then be None), for
    episodes stored without their privileged columns.
    """
    if isinstance(num_bins, bool) or not isinstance(num_bins, int) or num_bins < 1:
        raise ValueError(f"num_bins must be an int >= 1, got {num_bins!r}")
    obs = np.asarray(episodes.obs)[:, :-1]
    avail = np.asarray(episodes.avail_actions)[:, :-1].astype(bool)
    E, T, N = obs.shape[:3]
    sel = np.broadcast_to(np.asarray(episodes.mask, bool)[..., None], (E, T, N))
    if select is not None:
        s = np.asarray(select, bool)
        if s.shape not in ((E, T), (E, T, N)):
            raise ValueError(f"select has shape {s.shape}; it must be [E, T] = {(E, T)} or "
                             f"[E, T, N] = {(E, T, N)}, like the episodes' steps")
        sel = sel & (s[..., None] if s.ndim == 2 else s)
    sel = sel & (avail.sum(-1) > 1)
    empty = ImitationGap(0, float("nan"), float("nan"), float("nan"))
    if not sel.any():
        return [empty] * (num_bins + (num_bins > 1))
    if labels is None:
        p = expert_labels(privileged, obs, avail, params[0])
    else:
        p = np.asarray(labels)
        if p.shape != (E, T, N):
            raise ValueError(f"labels has shape {p.shape}; it must be [E, T, N] = {(E, T, N)}, "
                             "like the episodes' steps")
    x = expert_labels(transcript, obs, avail, params[1])

    K = env.token_width
    rows = np.round(obs[..., :K]).astype(np.int64)  # [E, T, N, K]
    labels: dict[int, set] = {}
    episodes_of: dict[int, set] = {}
    keys = np.zeros((E, T, N), np.int64)
    for e in range(E):
        for n in range(N):
            h = hash(("ctx", n))
            for t in range(T):
                h = hash((h, rows[e, t, n].tobytes()))
                keys[e, t, n] = h
                if sel[e, t, n]:
                    labels.setdefault(h, set()).add(int(p[e, t, n]))
                    episodes_of.setdefault(h, set()).add(e)
    undetermined = np.zeros((E, T, N), bool)
    shared = np.zeros((E, T, N), bool)
    for e, t, n in zip(*np.nonzero(sel)):
        h = keys[e, t, n]
        shared[e, t, n] = len(episodes_of[h]) > 1
        undetermined[e, t, n] = len(labels[h]) > 1

    def rates(where: np.ndarray) -> ImitationGap:
        m = int(where.sum())
        if not m:
            return empty
        return ImitationGap(states=m, differs=float((p != x)[where].mean()),
                            undetermined=float(undetermined[where].mean()),
                            shared=float(shared[where].mean()))

    out = [rates(sel)]
    if num_bins > 1:
        ended = np.round(obs[..., 0]).astype(np.int64) == int(env.eot_token)  # [E, T, N]
        turn = np.cumsum(ended, axis=1)  # the echo at step t ended a turn before step t
        bins = np.minimum(turn, num_bins - 1)
        out += [rates(sel & (bins == b)) for b in range(num_bins)]
    return out
