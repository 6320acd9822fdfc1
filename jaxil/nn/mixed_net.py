"""Local per-agent scalars mixed into a team scalar: the network of the DICE
discriminator and value and of the IRL reward models.

`MixedNet` evaluates a [`jaxil.nn.nets.LocalMLP`][jaxil.nn.nets.LocalMLP] with
one output per agent, `x_i = f_i(in_i)` for all N agents at once, and combines
them by `mode`:

- `"hyper"`: `x_tot(s) = Σ_i w_i(s)·x_i + b(s)` with the non-negative weights
  and bias of a [`jaxil.nn.nets.HyperMixer`][jaxil.nn.nets.HyperMixer] of the
  global state ([`jaxil.nn.mixing.mix`][jaxil.nn.mixing.mix]; MisoDICE);
- `"sum"`: `x_tot = Σ_i x_i`
  ([`jaxil.nn.mixing.vdn_mix`][jaxil.nn.mixing.vdn_mix]; VDN);
- `"none"`: no mixing, the `[..., N]` local values themselves (INDD, a
  per-agent discriminator).

Parameters: `{"local": <LocalMLP variables>}` plus `"mixer"` (the
HyperMixer's) in `"hyper"` mode.
"""

from __future__ import annotations

from typing import Any

import jax

from jaxil.nn.mixing import mix, vdn_mix
from jaxil.nn.nets import HyperMixer, LocalMLP

MIXING = ("hyper", "sum", "none")


class MixedNet:
    """Per-agent scalars `[..., N]`, mixed into `[...]` per `mode`.

    Args:
      num_agents: N.
      mode: `"hyper"`, `"sum"` or `"none"` (see the module docstring).
      hidden: hidden widths of the local network.
      mixer_hidden: width of the HyperMixer's hidden layer (`"hyper"`).
      shared: one local parameter set with a one-hot agent id (True) or
        independent stacked parameters per agent (False).
    """

    def __init__(self, num_agents: int, mode: str, hidden: tuple[int, ...],
                 mixer_hidden: int = 64, shared: bool = True):
        if mode not in MIXING:
            raise ValueError(f"mixing must be one of {MIXING}, got {mode!r}")
        self.mode = mode
        self.local = LocalMLP(out_dim=1, num_agents=num_agents, hidden=tuple(hidden),
                              shared=bool(shared))
        self.mixer = HyperMixer(num_agents=num_agents, hidden=mixer_hidden)

    def init(self, key: jax.Array, x: jax.Array, state: jax.Array) -> Any:
        """Parameters from example inputs `x [B, N, D]` and `state [B, S]`."""
        k1, k2 = jax.random.split(key)
        p = {"local": self.local.init(k1, x)}
        if self.mode == "hyper":
            p["mixer"] = self.mixer.init(k2, state)
        return p

    def local_values(self, params: Any, x: jax.Array) -> jax.Array:
        """`x [..., N, D] -> [..., N]` local values (before mixing)."""
        return self.local.apply(params["local"], x)[..., 0]

    def __call__(self, params: Any, x: jax.Array, state: jax.Array) -> jax.Array:
        """`[...]` team values (hyper/sum) or `[..., N]` local ones (none)."""
        local = self.local_values(params, x)
        if self.mode == "hyper":
            w, b = self.mixer.apply(params["mixer"], state)
            return mix(local, w, b)
        if self.mode == "sum":
            return vdn_mix(local)
        return local
