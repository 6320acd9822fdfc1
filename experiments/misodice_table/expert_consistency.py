"""Is MPE spread's expert data a function BC can read off the observation?

Replays the scripted expert (:func:`envs.mpe.spread_expert`) on the stored
observations of the expert trajectories of
``mpe-simple_spread_continuous/misodice-200e-1000p`` and compares its actions
with the recorded ones: exact agreement means the dataset pairs each action
with the observation it was chosen from (no off-by-one, no hidden noise).
For scale it also prints the error of a policy that repeats the previous
step's action, the bar BC's mode error (``box_heads.py``) has to beat.

    python experiments/misodice_table/expert_consistency.py
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from jaxil.envs.mpe import spread_expert
from jaxil.collect.recipes import load_dataset
from jaxil.data.environment import dataset_env


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="mpe-simple_spread_continuous/misodice-200e-1000p")
    args = p.parse_args(argv)
    ds = load_dataset(args.recipe, 0)
    env = dataset_env(ds)
    expert = jax.jit(jax.vmap(spread_expert(env), in_axes=(None, 0, 0, None)))
    ex = np.asarray(ds.expert, bool)
    obs, act, mask = (np.asarray(x)[ex] for x in (ds.obs, ds.actions, ds.mask))
    obs = obs[:, :-1]  # the observation each action was chosen from

    def replay(o):  # [M, N, O] -> [M, N, d]
        return np.asarray(expert(None, jnp.asarray(o), jnp.ones(o.shape[:2] + (1,), bool),
                                 jax.random.PRNGKey(0)))

    flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
    m = flat(mask)
    err = np.abs(replay(flat(obs)) - flat(act))[m]
    both = flat(mask[:, 1:] & mask[:, :-1])
    repeat = np.abs(flat(act[:, 1:]) - flat(act[:, :-1]))[both]
    print(f"{args.recipe}: {int(m.sum())} expert steps; replayed expert vs recorded action: "
          f"mean abs. error {err.mean():.2e} per component, {np.mean(err.max((-1, -2)) < 1e-5):.3f} "
          f"of steps exact; repeating the previous step's action: {repeat.mean():.3f}")


if __name__ == "__main__":
    main()
