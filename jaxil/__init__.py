"""jaxil: JAX imitation learning for multi-agent systems and language-model agents.

The public API, importable from here:

```python
import jaxil
env = jaxil.make_env("smax:3m")                       # an environment
ds = jaxil.load_dataset("smax-3m/misodice-200e-1000p")  # a file, or a recipe (built once)
data = jaxil.LearnerData.from_dataset(ds, ds.expert)  # on-device, expert labels
learner = jaxil.make_learner("misodice", ds.spec)     # a learner (pure functions)
out = jaxil.train(learner, env, data, runs=jaxil.expand_grid({}, seeds=4),
                  num_updates=2000, eval_every=500)   # seeds vmapped in one program
policy = learner.policy(deterministic=True)           # a policy for envs.run_episodes
```

The names are loaded on first use, so `import jaxil` stays cheap and does
not start JAX (the `jaxil` command sets up host memory and multi-process
runs before that).

The packages, lowest layer first (a module imports only its own layer and
those before it; `tests/test_imports.py` checks this):

- [`jaxil.envs`][jaxil.envs]: environments behind one stacked-agent interface.
- [`jaxil.losses`][jaxil.losses]: the objectives as pure, shape-checked functions.
- [`jaxil.nn`][jaxil.nn]: networks, distributions, the policy layer, mixing.
- [`jaxil.lm`][jaxil.lm]: a pretrained language model in one call
  (`jaxil.lm.load("smollm2-135m-instruct")`).
- [`jaxil.runs`][jaxil.runs]: the run engine (run directories, resume, the guard,
  checkpoints, loggers, sharding).
- [`jaxil.data`][jaxil.data]: the dataset format, sampling, preferences, interchange.
- [`jaxil.algorithms`][jaxil.algorithms]: `offline`, `rl`, `labelling`,
  `interactive` and `irl`.
- [`jaxil.teachers`][jaxil.teachers]: shipped teachers and their presets.
- [`jaxil.collect`][jaxil.collect]: source policies and the dataset recipes.
- `jaxil.cli`: the `jaxil` command.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> (module, attribute)
_EXPORTS = {
    # environments
    "envs": ("jaxil.envs", None),
    "make_env": ("jaxil.envs", "make"),
    "list_envs": ("jaxil.envs.registry", "list_envs"),
    "run_episodes": ("jaxil.envs", "run_episodes"),
    # pretrained language models
    "lm": ("jaxil.lm", None),
    # learners and policies
    "LEARNERS": ("jaxil.algorithms.offline", "LEARNERS"),
    "Learner": ("jaxil.algorithms.offline", "Learner"),
    "LearnerData": ("jaxil.algorithms.offline", "LearnerData"),
    "LearnerState": ("jaxil.algorithms.offline", "LearnerState"),
    "make_learner": ("jaxil.algorithms.offline", "make_learner"),
    "update_n": ("jaxil.algorithms.offline", "update_n"),
    "jit_update_n": ("jaxil.algorithms.offline", "jit_update_n"),
    "PolicyNet": ("jaxil.nn.policy", "PolicyNet"),
    "load_teacher": ("jaxil.teachers", "load_teacher"),
    "shipped_teachers": ("jaxil.teachers", "shipped_teachers"),
    # data
    "Dataset": ("jaxil.data", "Dataset"),
    "load": ("jaxil.data", "load"),
    "save": ("jaxil.data", "save"),
    "load_dataset": ("jaxil.collect.recipes", "load_dataset"),
    "build_recipe": ("jaxil.collect.recipes", "build"),
    "get_recipe": ("jaxil.collect.recipes", "get_recipe"),
    "import_vault": ("jaxil.data", "import_vault"),
    "export_vault": ("jaxil.data", "export_vault"),
    # training
    "train": ("jaxil.algorithms.offline.train", "train"),
    "expand_grid": ("jaxil.algorithms.offline.train", "expand_grid"),
    "RunSpec": ("jaxil.algorithms.offline.train", "RunSpec"),
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'jaxil' has no attribute {name!r}") from None
    value = importlib.import_module(module)
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
