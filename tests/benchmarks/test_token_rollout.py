"""Tests of benchmarks/token_rollout.py: the two decoders do the same work,
the peer skips cleanly, and the --quick run writes one JSON."""

import json
import math

import jax
import numpy as np
import pytest

from benchmarks import token_rollout as tr
from jaxil.nn.transformer import Transformer, TransformerConfig


def _tiny(context=12):
    return Transformer(TransformerConfig(vocab_size=11, token_width=1, max_context=context,
                                         d_model=16, num_layers=2, num_heads=2))


@pytest.mark.slow  # default-suite time (about 10 s); test_transformer.py checks the cached
# decoder against full recomputation by default
@pytest.mark.parametrize("new_tokens", [1, 12])
def test_cached_and_recompute_decoders_emit_the_same_greedy_tokens(new_tokens):
    net = _tiny()
    params = net.init(jax.random.PRNGKey(0))
    fns = tr.decoders(net, batch=3, new_tokens=new_tokens, prompt_token=1, deterministic=True)
    key = jax.random.PRNGKey(1)
    cached = np.asarray(jax.jit(fns["decode_cached"])(params, key))
    recompute = np.asarray(jax.jit(fns["decode_recompute"])(params, key))
    assert cached.shape == (3, new_tokens)
    np.testing.assert_array_equal(cached, recompute)
    assert (cached != tr.PAD).all()


@pytest.mark.slow  # default-suite time; run with -m slow; the greedy equal-work test stays
def test_cached_and_recompute_decoders_sample_the_same_tokens():
    net = _tiny()
    params = net.init(jax.random.PRNGKey(2))
    fns = tr.decoders(net, batch=4, new_tokens=10, prompt_token=1)
    key = jax.random.PRNGKey(3)
    a = np.asarray(jax.jit(fns["decode_cached"])(params, key))
    b = np.asarray(jax.jit(fns["decode_recompute"])(params, key))
    np.testing.assert_array_equal(a, b)
    assert (a != tr.PAD).all()


def test_decoders_refuse_more_tokens_than_the_context():
    with pytest.raises(ValueError, match="max_context"):
        tr.decoders(_tiny(context=4), batch=1, new_tokens=5, prompt_token=1)


def test_peer_reason_is_a_string_or_none():
    reason = tr.peer_unavailable()
    assert reason is None or (isinstance(reason, str) and reason)


def test_ratios_need_both_sides():
    row = {"decode_cached_tokens_per_s": 10.0, "decode_recompute_tokens_per_s": 2.0,
           "hf_cache_tokens_per_s": 5.0}
    tr._ratios(row)
    assert row["decode_cached_over_recompute"] == 5.0
    assert row["jaxil_over_hf_cached"] == 2.0
    assert row["rollout_cached_over_recompute"] is None
    assert row["jaxil_over_hf_recompute"] is None


@pytest.mark.slow  # compiles eight programs: about a minute on a 2-core machine; run with -m slow
def test_quick_run_writes_one_json(tmp_path):
    tr.main(["--quick", "--batches", "2", "--out-dir", str(tmp_path)])
    files = list(tmp_path.glob("token_rollout-*.json"))
    assert len(files) == 1
    doc = json.loads(files[0].read_text())
    assert doc["benchmark"] == "token_rollout"
    assert {"machine", "versions", "config", "peer", "rows"} <= set(doc)
    (row,) = doc["rows"]
    assert (row["size"], row["batch"]) == ("tiny", 2)
    for side in ("decode_cached", "decode_recompute", "rollout_cached", "rollout_recompute"):
        assert not row["sides"][side]["skipped"]
        assert math.isfinite(row[f"{side}_tokens_per_s"]) and row[f"{side}_tokens_per_s"] > 0
    assert row["decode_cached_over_recompute"] > 0
    assert row["rollout_cached_over_recompute"] > 0
    peer = doc["peer"]
    if peer["skipped"]:
        assert isinstance(peer["skipped"], str)
        assert row["sides"]["hf_cache"]["skipped"] and row["jaxil_over_hf_cached"] is None
    else:
        assert row["hf_cache_tokens_per_s"] > 0 and row["jaxil_over_hf_cached"] > 0
