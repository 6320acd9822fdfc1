"""The neural policy of jaxil: one network, one distribution head, one protocol.

Every neural policy — a learner's student (BC, INDD, MisoDICE, O-MAPL), a PPO
teacher, the interactive and IRL learners built on them — is a
[`PolicyNet`][jaxil.nn.policy.PolicyNet]: a local network per agent
([`jaxil.nn.nets.LocalMLP`][jaxil.nn.nets.LocalMLP], all agents in one batched
call, each agent seeing only its own observation) and a head from
[`jaxil.nn.distributions`][jaxil.nn.distributions]:

- discrete actions: logits `[..., N, A]` of a masked categorical;
- box actions, one of three heads (`box`):

  - `"censored_gaussian"`: a diagonal Gaussian clipped to the box, with the
    probability mass that the clip puts on each bound counted in the likelihood
    ([`jaxil.nn.distributions.censored_gaussian_log_prob`][jaxil.nn.distributions.censored_gaussian_log_prob]);
  - `"tanh_gaussian"`: a tanh-squashed diagonal Gaussian;
  - `"beta"`: a Beta per dimension on the box (`log_std="state"` only;
    the network outputs the two concentrations through a softplus).

  The Gaussian heads' log-std is either an output of the network
  (`log_std="state"`, clipped to `[LOG_STD_MIN, LOG_STD_MAX]`; the
  learners) or one state-independent parameter vector (`log_std="param"`;
  the PPO teachers).

  Default head (`box=None`, `DEFAULT_BOX`): the censored Gaussian for
  `log_std="state"`, the policy that learners fit to recorded actions; the
  tanh-Gaussian for `log_std="param"`, the PPO teachers, whose shipped
  checkpoints were trained squashed. Scripted experts put many actions exactly
  on the bounds (MPE spread's controller: 66 % of the action components).
  Under the tanh-Gaussian the likelihood of such an action grows without
  bound as the pre-squash mean goes to ±∞, so behaviour cloning chases
  saturation; the censored Gaussian gives it a probability Φ(·) ≤ 1 instead
  (experiments/misodice_table/README.md measures the three heads). A learner
  names its head in its config (`box`, default the censored Gaussian), so
  its run identity records it.

[`PolicyNet.policy`][jaxil.nn.policy.PolicyNet.policy] gives the
[`envs.policies.Policy`][jaxil.envs.policies.Policy] that rollouts, the dataset
zoo and everything else that takes a policy accept, with `log_prob` and
`entropy` defined; a scripted expert is a Policy with those left `None`.

Raw actions. PPO stores what it sampled *before* the tanh or the clip: `raw` is
the integer action (discrete), the pre-squash / pre-clip Gaussian draw `u`
(Gaussian heads) or the action itself (Beta), and
[`PolicyNet.raw_log_prob_entropy`][jaxil.nn.policy.PolicyNet.raw_log_prob_entropy]
scores it. The tanh Jacobian does not depend on the parameters, so ratios of
raw log-probabilities equal those of the squashed policy, without the precision
loss of `atanh` near the bounds; for the clip, the Gaussian density of `u` is
the likelihood of a policy that acts `u` in an environment that clips.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp

from jaxil.envs.core import EnvSpec
from jaxil.envs.policies import Policy, stateless_carry
from jaxil.nn import distributions as D
from jaxil.nn import running_stats
from jaxil.nn.nets import LocalMLP, activation as activation_fn, orthogonal_init

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
LOG_STD_MODES = ("state", "param")
INITS = ("lecun", "orthogonal")
BOX_HEADS = ("censored_gaussian", "tanh_gaussian", "beta")
#: The box head of `box=None`, per `log_std` mode (see the module docstring).
DEFAULT_BOX = {"state": "censored_gaussian", "param": "tanh_gaussian"}
#: Smallest Beta concentration (softplus(x) + BETA_MIN).
BETA_MIN = 1e-2


class PolicyNet:
    """A decentralised stochastic policy over `obs [..., N, O]`.

    Args:
      spec: the environment's spec (agents, observation width, action space).
      hidden: hidden widths of the local network.
      shared: one parameter set with a one-hot agent id appended (True) or
        independent stacked parameters per agent (False).
      activation: `"relu"` or `"tanh"`.
      init: `"lecun"` (flax's default) or `"orthogonal"` (the PPO
        convention: gain √2 on hidden layers, 0.01 on the output layer).
      log_std: `"state"` (the network outputs mean ⊕ log-std) or
        `"param"` (a state-independent log-std vector); box actions only.
      log_std_init: initial value of the `"param"` log-std.
      box: the box head, one of `BOX_HEADS`; None takes
        `DEFAULT_BOX` of the `log_std` mode. Ignored for discrete
        actions.
      obs_norm: standardise each observation feature by running statistics kept
        in the parameters ([`jaxil.nn.running_stats`][jaxil.nn.running_stats];
        the PPO teachers of MuJoCo robots). The trainer updates them with
        [`PolicyNet.with_obs_stats`][jaxil.nn.policy.PolicyNet.with_obs_stats];
        no gradient reaches them.

    Parameters: `log_std="state"` (and every discrete policy) uses the
    [`LocalMLP`][jaxil.nn.nets.LocalMLP] variables as they are; `"param"` uses
    `{"net": <LocalMLP variables>, "log_std": [d]}`. With `obs_norm` the
    variables move under `"net"` in either case, beside
    `"obs_stats": RunningStats`.
    """

    def __init__(
        self,
        spec: EnvSpec,
        hidden: tuple[int, ...],
        shared: bool = True,
        activation: str = "relu",
        init: str = "lecun",
        log_std: str = "state",
        log_std_init: float = -0.5,
        box: Optional[str] = None,
        obs_norm: bool = False,
    ):
        if init not in INITS:
            raise ValueError(f"PolicyNet init must be one of {INITS}, got {init!r}")
        if log_std not in LOG_STD_MODES:
            raise ValueError(f"PolicyNet log_std must be one of {LOG_STD_MODES}, got {log_std!r}")
        if box is None:
            box = DEFAULT_BOX[log_std]
        if box not in BOX_HEADS:
            raise ValueError(f"PolicyNet box must be one of {BOX_HEADS}, got {box!r}")
        if box == "beta" and log_std == "param":
            raise ValueError('PolicyNet box="beta" has no log-std; use log_std="state" with it')
        self.spec = spec
        self.discrete = spec.discrete
        self.box = None if spec.discrete else box
        self.param_log_std = (not spec.discrete) and log_std == "param"
        self.log_std_init = float(log_std_init)
        if not isinstance(obs_norm, bool):
            raise ValueError(f"PolicyNet obs_norm must be True or False, got {obs_norm!r}")
        self.obs_norm = obs_norm
        if spec.discrete:
            out = spec.num_actions
        else:
            out = spec.action.dim * (1 if self.param_log_std else 2)
        inits = orthogonal_init(0.01) if init == "orthogonal" else (None, None)
        self.net = LocalMLP(out_dim=out, num_agents=spec.num_agents, hidden=tuple(hidden),
                            shared=shared, activation=activation_fn(activation),
                            kernel_init=inits[0], out_kernel_init=inits[1])

    # -- parameters and the head ------------------------------------------------
    def init(self, key: jax.Array) -> Any:
        obs = jnp.zeros((self.spec.num_agents, self.spec.obs_dim), jnp.float32)
        variables = self.net.init(key, obs)
        if not (self.param_log_std or self.obs_norm):
            return variables
        params = {"net": variables}
        if self.param_log_std:
            d = self.spec.action.dim
            params["log_std"] = jnp.full((d,), self.log_std_init, jnp.float32)
        if self.obs_norm:
            params["obs_stats"] = running_stats.init(self.spec.obs_dim)
        return params

    def with_obs_stats(self, params: Any, obs: jax.Array,
                       weight: Optional[jax.Array] = None) -> Any:
        """`params` with the observation statistics updated by every
        observation in `obs [..., N, O]` (all agents pooled per feature;
        `weight [..., N]` optional, 0 on padding)."""
        if not self.obs_norm:
            raise ValueError("PolicyNet.with_obs_stats needs a PolicyNet built with obs_norm=True")
        return {**params, "obs_stats": running_stats.update(params["obs_stats"], obs, weight)}

    def head(self, params: Any, obs: jax.Array):
        """Logits `[..., N, A]` (discrete), `(mean, log_std)` (Gaussian
        box heads) or `(alpha, beta)` (Beta), each `[..., N, d]`."""
        if self.obs_norm:
            obs = running_stats.normalize(params["obs_stats"], obs)
        net = params["net"] if (self.param_log_std or self.obs_norm) else params
        if self.discrete:
            return self.net.apply(net, obs)
        if self.param_log_std:
            mean = self.net.apply(net, obs)
            return mean, jnp.broadcast_to(params["log_std"], mean.shape)
        out = self.net.apply(net, obs)
        d = self.spec.action.dim
        if self.box == "beta":
            return jax.nn.softplus(out[..., :d]) + BETA_MIN, jax.nn.softplus(out[..., d:]) + BETA_MIN
        return out[..., :d], jnp.clip(out[..., d:], LOG_STD_MIN, LOG_STD_MAX)

    # -- scoring ---------------------------------------------------------------
    def log_prob(self, params, obs, avail, actions) -> jax.Array:
        """`[..., N]` log-likelihoods of environment `actions` under the
        box head (for the censored Gaussian: log-probabilities of the actions
        on a bound, log-densities of the others)."""
        out = self.head(params, obs)
        if self.discrete:
            return D.categorical_log_prob(out, avail, actions)
        a = self.spec.action
        if self.box == "censored_gaussian":
            return D.censored_gaussian_log_prob(out[0], out[1], actions, a.low, a.high)
        if self.box == "beta":
            return D.beta_log_prob(out[0], out[1], actions, a.low, a.high)
        return D.tanh_gaussian_log_prob(out[0], out[1], actions, a.low, a.high)

    def _box_entropy(self, out) -> jax.Array:
        # The Beta's own differential entropy; the Gaussian heads have none in
        # closed form (tanh) or none at all (a mixed law), so the pre-squash /
        # pre-clip Gaussian's stands in (PPO's entropy bonus).
        if self.box == "beta":
            a = self.spec.action
            return D.beta_entropy(out[0], out[1], a.low, a.high)
        return D.gaussian_entropy(out[1])

    def entropy(self, params, obs, avail) -> jax.Array:
        """`[..., N]` entropies: of the masked categorical, of the Beta, or
        of the pre-squash / pre-clip Gaussian."""
        out = self.head(params, obs)
        if self.discrete:
            return D.categorical_entropy(out, avail)
        return self._box_entropy(out)

    def raw_log_prob_entropy(self, params, obs, avail, raw) -> tuple[jax.Array, jax.Array]:
        """`(log π(raw), entropy)`, both `[..., N]`, for raw actions
        (integers, pre-squash / pre-clip draws `u`, or Beta actions; see the
        module docstring)."""
        out = self.head(params, obs)
        if self.discrete:
            return D.categorical_log_prob(out, avail, raw), D.categorical_entropy(out, avail)
        if self.box == "beta":
            a = self.spec.action
            return D.beta_log_prob(out[0], out[1], raw, a.low, a.high), self._box_entropy(out)
        mean, log_std = out
        return D.gaussian_log_prob(mean, log_std, raw), D.gaussian_entropy(log_std)

    # -- acting ------------------------------------------------------------------
    def act(self, params, obs, avail, key, deterministic: bool = False) -> jax.Array:
        """Environment actions: sampled, or when `deterministic` the most
        likely available action / the squashed or clipped Gaussian mean / the
        Beta's mode."""
        return self.to_env_action(self.sample_raw(params, obs, avail, key, deterministic)[0])

    def sample_raw(self, params, obs, avail, key,
                   deterministic: bool = False) -> tuple[jax.Array, jax.Array]:
        """`(raw, log π(raw))`: integer actions, pre-squash / pre-clip draws
        `u`, or Beta actions."""
        out = self.head(params, obs)
        if self.discrete:
            a = D.categorical_mode(out, avail) if deterministic else D.categorical_sample(
                key, out, avail)
            return a, D.categorical_log_prob(out, avail, a)
        if self.box == "beta":
            a = self.spec.action
            x = (D.beta_mode(out[0], out[1], a.low, a.high) if deterministic
                 else D.beta_sample(key, out[0], out[1], a.low, a.high))
            return x, D.beta_log_prob(out[0], out[1], x, a.low, a.high)
        mean, log_std = out
        u = mean if deterministic else D.gaussian_sample(key, mean, log_std)
        return u, D.gaussian_log_prob(mean, log_std, u)

    def to_env_action(self, raw: jax.Array) -> jax.Array:
        """Raw actions as the environment takes them (tanh head: squashed;
        censored: clipped; Beta: as they are)."""
        if self.discrete or self.box == "beta":
            return raw
        if self.box == "censored_gaussian":
            return D.clip_to_box(raw, self.spec.action.low, self.spec.action.high)
        return D.squash(raw, self.spec.action.low, self.spec.action.high)

    # -- the protocol ------------------------------------------------------------
    def policy(self, deterministic: bool = False, key: Optional[str] = None) -> Policy:
        """This network as an
        [`envs.policies.Policy`][jaxil.envs.policies.Policy] (no carry; with
        `log_prob` and `entropy`). With `key`, the policy takes a learner's
        whole parameter dict and uses `params[key]`."""
        sub = (lambda params: params) if key is None else (lambda params: params[key])

        def act(params, obs, avail, rng, carry):
            return self.act(sub(params), obs, avail, rng, deterministic), carry

        def log_prob(params, obs, avail, actions):
            return self.log_prob(sub(params), obs, avail, actions)

        def entropy(params, obs, avail):
            return self.entropy(sub(params), obs, avail)

        return Policy(init=stateless_carry, act=act, log_prob=log_prob, entropy=entropy)

    def policy_fn(self, deterministic: bool = False):
        """A plain `(params, obs, avail, key) -> actions` for envs.run_episodes."""

        def fn(params, obs, avail, key):
            return self.act(params, obs, avail, key, deterministic)

        return fn

    def learner_fns(self, key: str = "policy"):
        """`(act, policy)` of a learner whose params hold this network under
        `params[key]`: `act(params, obs, avail, rng, deterministic=False)`
        and `policy(deterministic=False) -> Policy`."""

        def act(params, obs, avail, rng, deterministic=False):
            return self.act(params[key], obs, avail, rng, deterministic)

        return act, functools.partial(self.policy, key=key)


def encode_actions(spec: EnvSpec, actions: jax.Array) -> jax.Array:
    """Actions as network input: one-hot `[..., N, A]` or the raw box vector."""
    if spec.discrete:
        return jax.nn.one_hot(actions, spec.num_actions, dtype=jnp.float32)
    return jnp.asarray(actions, jnp.float32)

