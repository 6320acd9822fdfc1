"""jaxil.collect.demonstrations: which demonstrator and which file a request
names (no collection: the paths and errors are decided before any build)."""

from __future__ import annotations

import pytest

from jaxil.collect.demonstrations import NOISED_EXPERTS, demo_path, demonstrations


def test_noised_paths_are_unchanged_and_epsilon_zero_names_the_clean_expert(tmp_path):
    """The noised sets keep their file names (the studies' built data stay
    valid), and ``epsilon=0`` names an ε = 0 file of the recipe's own short
    name, for an environment without a noised expert too. Bug caught: the
    clean-expert option renaming or overwriting the noised sets."""
    assert demo_path("smax:3m", 200, 0, tmp_path).name == "smax-3m-eps0.4-200d-seed0.npz"
    assert demo_path("mpe:simple_spread_continuous", 800, 0, tmp_path, epsilon=0).name == \
        "mpe-simple_spread_continuous-eps0.0-800d-seed0.npz"
    assert "mpe:simple_spread_continuous" not in NOISED_EXPERTS


@pytest.mark.parametrize("env_id,epsilon,message", [
    ("mpe:simple_spread_continuous", None, "pass epsilon=0"),
    ("smax:3m", 0.3, "None (the ε of NOISED_EXPERTS) or 0"),
    ("toy:none", 0, "no recipes for 'toy:none'"),
])
def test_requests_without_a_demonstrator_are_one_line_errors(tmp_path, env_id, epsilon, message):
    """An environment without a noised expert, an ε other than the two
    offered, and an environment without recipes each raise a ValueError that
    says what to pass, before anything is built."""
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        demonstrations(env_id, 4, data_dir=tmp_path, epsilon=epsilon)
    assert not any(tmp_path.iterdir())
