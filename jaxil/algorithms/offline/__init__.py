"""Learners: pure `init`/`sample`/`update`/`act` bundles.

`make_learner(name, spec, **config)` builds one by name:

| name           | learner                                                        |
|----------------|----------------------------------------------------------------|
| `bc_union`     | BC on all data D_U (β = 0)                                     |
| `bc_expert`    | BC on the expert-labelled data D_E (β = 1)                     |
| `bc_mix`       | BC on a β-mixture (β = 0.5 by default)                         |
| `indd`         | independent DemoDICE per agent                                 |
| `misodice_vdn` | MisoDICE with sum mixing                                       |
| `misodice`     | MisoDICE (hypernetwork mixers)                                 |
| `omapl`        | O-MAPL preference learner (Phase 1; trains on PreferenceData)  |
"""

from __future__ import annotations

import dataclasses
import functools

from jaxil.envs.core import EnvSpec
from jaxil.algorithms.offline.base import (Learner, LearnerData, LearnerState, jit_update_n, unalias, update_n,
                                 update_n_checked)
from jaxil.algorithms.offline.bc import BCConfig, BCHParams, make_bc
from jaxil.algorithms.offline.dice import DiceConfig, DiceHParams, make_dice
from jaxil.algorithms.offline.omapl import OMAPLConfig, OMAPLHParams, PreferenceData, make_omapl

_BC_BETA = {"bc_union": 0.0, "bc_expert": 1.0, "bc_mix": 0.5}
_DICE_MIXING = {"indd": "none", "misodice_vdn": "sum", "misodice": "hyper"}
LEARNERS = tuple(_BC_BETA) + tuple(_DICE_MIXING)
"""The names [`make_learner`][jaxil.algorithms.offline.make_learner] builds
from labelled transitions: `bc_union`, `bc_expert`, `bc_mix`, `indd`,
`misodice_vdn`, `misodice`."""
#: Learners that train on preference queries instead of labelled transitions.
PREFERENCE_LEARNERS = ("omapl",)


#: The hyper-parameter classes of the learners `make_learner` builds.
HPARAMS = (BCHParams, DiceHParams)
#: Every hyper-parameter a sweep may vary (a field of some class in HPARAMS);
#: each learner checks the names of a grid against its own class.
SWEEPABLE = tuple(sorted({f.name for cls in HPARAMS for f in dataclasses.fields(cls)}))


def make_learner(name: str, spec: EnvSpec, **config) -> Learner:
    """Build a learner; `config` keywords go to its frozen config
    (`hidden`, `batch_size`, `shared`, ...).

    The same arguments return the same Learner object, so functions jitted
    over it are compiled once per process.
    """
    if "hidden" in config:
        config["hidden"] = tuple(config["hidden"])
    return _make_learner(name, spec, tuple(sorted(config.items())))


@functools.lru_cache(maxsize=64)
def _make_learner(name: str, spec: EnvSpec, config_items: tuple) -> Learner:
    learner = _build(name, spec, dict(config_items))
    init = learner.init

    @functools.wraps(init)
    def owned_init(*args, **kwargs):  # a fresh state can be donated (see unalias)
        return unalias(init(*args, **kwargs))

    return learner._replace(init=owned_init)


def _build(name: str, spec: EnvSpec, config: dict) -> Learner:
    if name in _BC_BETA:
        return make_bc(spec, BCConfig(**config), beta=_BC_BETA[name])._replace(name=name)
    if name in _DICE_MIXING:
        return make_dice(spec, DiceConfig(mixing=_DICE_MIXING[name], **config))
    if name == "omapl":
        return make_omapl(spec, OMAPLConfig(**config))
    raise KeyError(f"unknown learner {name!r}; choose one of {', '.join(LEARNERS + PREFERENCE_LEARNERS)}")


__all__ = [
    "BCConfig", "BCHParams", "DiceConfig", "DiceHParams", "Learner", "LearnerData",
    "LearnerState", "LEARNERS", "OMAPLConfig", "OMAPLHParams", "PREFERENCE_LEARNERS",
    "PreferenceData", "HPARAMS", "SWEEPABLE", "jit_update_n", "make_learner", "unalias", "update_n", "update_n_checked",
]
