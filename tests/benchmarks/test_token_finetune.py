"""Tests of benchmarks/token_finetune.py: the packed contexts are what the
teacher-forced pass reads, the peer's labels sit where GPT-2 scores the
loss's tokens, and a small run fills its rows (its fused and separate sides
ending at the same parameters)."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import token_finetune as tf
from jaxil import envs
from jaxil.algorithms.lm import sft
from jaxil.nn.transformer import PAD, TransformerConfig, TransformerPolicy


def _obs(seed, shape, pad_share):
    rng = np.random.default_rng(seed)
    toks = rng.integers(1, 11, shape)
    toks[rng.random(shape) < pad_share] = PAD
    return toks.astype(np.float32)


@pytest.mark.parametrize("pad_share", [0.6, 0.1])  # 0.1: more tokens than slots, the rest cut
def test_packed_contexts_are_what_the_teacher_forced_pass_reads(pad_share):
    C, K = 10, 3
    obs = _obs(0, (3, 6, 2, K), pad_share)
    obs[0, :2] = PAD  # an agent with no token for its first steps
    contexts, at = tf.packed_contexts(obs, K, C)
    assert contexts.shape == (3, 2, C) and at.shape == (3, 6, 2)
    pol = TransformerPolicy(TransformerConfig(vocab_size=11, token_width=K, max_context=C,
                                              d_model=8, num_layers=1, num_heads=1))
    # _chunks hands each agent's packed context to per_token and reads row `at` per step
    # a context's slot p carries [p + 1, context...]: _chunks' row per step shows both
    seen = jax.jit(jax.vmap(lambda o: pol._chunks(lambda c, a: jnp.concatenate(
        [1.0 + jnp.arange(C, dtype=jnp.float32)[:, None],
         jnp.broadcast_to(c, (C, C)).astype(jnp.float32)], -1), o)))(jnp.asarray(obs))
    seen, slot = np.asarray(seen[..., 1:]), np.asarray(seen[..., 0]) - 1  # -1: no token yet
    np.testing.assert_array_equal(slot, at)
    for e, t, n in zip(*np.nonzero(at >= 0)):
        np.testing.assert_array_equal(seen[e, t, n], contexts[e, n])
    assert (at[0, :2] == -1).all()
    real = np.sum(obs != PAD, axis=(1, 3))  # [E, N]
    np.testing.assert_array_equal(np.sum(contexts != PAD, -1), np.minimum(real, C))


def test_shifted_labels_put_each_counted_action_one_slot_after_its_scoring_slot():
    actions = np.array([[[5], [6], [7], [8]]])  # [E=1, T=4, N=1]
    mask = np.array([[[True], [False], [True], [True]]])
    at = np.array([[[-1], [1], [3], [5]]])  # step 0 has no context; step 3 reads the last slot
    labels = tf.shifted_labels(actions, mask, at, max_context=6)
    want = np.full((1, 1, 6), tf.IGNORE)
    want[0, 0, 4] = 7
    np.testing.assert_array_equal(labels, want)


@pytest.fixture(scope="module")
def small_env():
    return envs.make("tokens:repair", max_turns=2)  # C = 18, 8 steps


def test_random_demos_are_token_episodes_that_fill_the_context(small_env):
    demos = tf.random_demos(small_env, jax.random.PRNGKey(0), 3)
    sft.check_demos(small_env, demos)
    contexts, at = tf.packed_contexts(np.asarray(demos.obs), small_env.token_width,
                                      small_env.max_context)
    T = small_env.spec.max_steps
    assert (np.sum(contexts != PAD, -1) == (small_env.max_context // T) * T).all()
    assert tf.loss_mask(demos).all() and (at >= 0).all()


def test_ratios_need_both_sides():
    row = {"update_tokens_per_s": 10.0, "fused_tokens_per_s": 30.0, "separate_tokens_per_s": 15.0}
    tf._ratios(row)
    assert row["fused_over_separate"] == 2.0
    assert row["jaxil_over_peer"] is None and row["fused_over_peer"] is None


def test_a_peer_path_must_be_a_folder(tmp_path):
    with pytest.raises(ValueError, match="--peer-path"):
        tf.add_peer_path([str(tmp_path / "missing")])


def _small_run(parts):
    return tf.measure(["tiny"], [2], parts=parts, env_kwargs={"max_turns": 2}, data="random", k=2,
                      model_overrides={"d_model": 16, "num_layers": 1}, repeats=1, target_s=0.0,
                      log=lambda *a, **k: None)


def _check_side(row, side, updates):
    info = row["sides"][side]
    assert not info["skipped"] and info["updates"] == updates
    assert info["tokens"] == updates * row["loss_tokens"]
    assert math.isfinite(row[f"{side}_tokens_per_s"]) and row[f"{side}_tokens_per_s"] > 0
    assert row[f"{side}_context_tokens_per_s"] == pytest.approx(
        row[f"{side}_tokens_per_s"] * row["context_tokens"] / row["loss_tokens"])


@pytest.mark.slow  # default-suite time (about 11 s of compile); run with -m slow
def test_a_run_counts_the_tokens_of_its_batch(small_env):
    doc = _small_run(("peer",))  # no jaxil side: nothing to compile
    assert {"machine", "versions", "config", "peer", "definitions", "rows"} <= set(doc)
    (row,) = doc["rows"]
    T, C = small_env.spec.max_steps, small_env.max_context
    assert (row["size"], row["batch"], row["k"], row["num_layers"]) == ("tiny", 2, 2, 1)
    assert row["loss_tokens"] == 2 * T and row["context_tokens"] == 2 * (C // T) * T
    assert row["context_slots"] == 2 * C and row["peer_label_tokens"] == row["loss_tokens"]
    assert set(row["sides"]) == {"peer"} and row["fused_over_separate"] is None
    if doc["peer"]["skipped"]:
        assert isinstance(doc["peer"]["skipped"], str)
        assert row["sides"]["peer"]["skipped"] and row["jaxil_over_peer"] is None
    else:
        _check_side(row, "peer", 1)


@pytest.mark.slow  # compiles one update: about 10 s on 2 cores; run with -m slow
def test_an_update_run_times_one_update():
    doc = _small_run(("update", "peer"))
    (row,) = doc["rows"]
    _check_side(row, "update", 1)
    assert math.isfinite(row["sides"]["update"]["warmup_loss"])
    if not doc["peer"]["skipped"]:
        assert row["jaxil_over_peer"] > 0


@pytest.mark.slow  # compiles two updates: about 20 s on 2 cores; run with -m slow
def test_fused_and_separate_take_the_same_updates():
    (row,) = _small_run(("fused",))["rows"]
    _check_side(row, "fused", 2)
    _check_side(row, "separate", 2)
    assert row["sides"]["separate"]["compile_s"] is not None  # no update side to borrow from
    assert row["fused_over_separate"] > 0
    assert row["fused_separate_max_param_diff"] < 1e-5


def _gpt2_with_jaxil_weights(torch, cfg, params):
    """An untied GPT-2 holding a jaxil transformer's weights (same function)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    d, H, V = cfg.d_model, cfg.num_heads, cfg.vocab_size
    model = GPT2LMHeadModel(GPT2Config(
        vocab_size=V, n_positions=cfg.max_context, n_embd=d, n_layer=cfg.num_layers, n_head=H,
        n_inner=cfg.mlp_ratio * d, activation_function="gelu_new", layer_norm_epsilon=cfg.ln_eps,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False)).eval()
    p = jax.tree.map(lambda x: torch.tensor(np.asarray(x)), params["params"])
    sd = {"transformer.wte.weight": p["token_embed"]["embedding"],
          "transformer.wpe.weight": p["pos_embed"], "lm_head.weight": p["head"]["kernel"].T,
          "transformer.ln_f.weight": p["ln_final"]["scale"],
          "transformer.ln_f.bias": p["ln_final"]["bias"]}
    for i in range(cfg.num_layers):
        b, h = p[f"blocks_{i}"], f"transformer.h.{i}."
        sd.update({h + "ln_1.weight": b["ln_attn"]["scale"], h + "ln_1.bias": b["ln_attn"]["bias"],
                   h + "attn.c_attn.weight": b["qkv"]["kernel"].reshape(d, 3 * d),
                   h + "attn.c_attn.bias": b["qkv"]["bias"].reshape(3 * d),
                   h + "attn.c_proj.weight": b["attn_out"]["kernel"].reshape(d, d),
                   h + "attn.c_proj.bias": b["attn_out"]["bias"],
                   h + "ln_2.weight": b["ln_mlp"]["scale"], h + "ln_2.bias": b["ln_mlp"]["bias"],
                   h + "mlp.c_fc.weight": b["mlp_in"]["kernel"], h + "mlp.c_fc.bias": b["mlp_in"]["bias"],
                   h + "mlp.c_proj.weight": b["mlp_out"]["kernel"],
                   h + "mlp.c_proj.bias": b["mlp_out"]["bias"]})
    model.load_state_dict(sd, strict=False)
    return model


def test_the_peer_scores_the_loss_tokens_from_the_same_logits(small_env):
    """With jaxil's weights in an untied GPT-2, the logits the peer's labels
    are scored from are the logits sft_loss scores each counted token from."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    cfg = TransformerConfig(vocab_size=small_env.spec.num_actions,
                            token_width=small_env.token_width,
                            max_context=small_env.max_context, d_model=16, num_layers=2, num_heads=2)
    student = TransformerPolicy(cfg)
    params = student.init(jax.random.PRNGKey(0))
    demos = tf.random_demos(small_env, jax.random.PRNGKey(2), 3)
    C = cfg.max_context
    contexts, at = tf.packed_contexts(np.asarray(demos.obs), cfg.token_width, C)
    labels = tf.shifted_labels(np.asarray(demos.actions), tf.loss_mask(demos), at, C)
    E, N = contexts.shape[:2]
    model = _gpt2_with_jaxil_weights(torch, cfg, params)
    ids = torch.as_tensor(contexts.reshape(E * N, C), dtype=torch.long)
    with torch.no_grad():
        hf = model(input_ids=ids, attention_mask=(ids != PAD).long()).logits.numpy()
    hf = hf.reshape(E, N, C, -1)
    ours = np.asarray(jax.vmap(student.chunk_logits, in_axes=(None, 0))(params, demos.obs))
    e, n, slot = np.nonzero(labels != tf.IGNORE)
    assert len(e) == tf.loss_mask(demos).sum()
    for ei, ni, si in zip(e, n, slot):
        (t,) = np.nonzero((at[ei, :, ni] == si - 1) & tf.loss_mask(demos)[ei, :, ni])
        assert labels[ei, ni, si] == demos.actions[ei, t[-1], ni]
        np.testing.assert_allclose(hf[ei, ni, si - 1], ours[ei, t[-1], ni], rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # compiles the tiny update twice at C = 162: about a minute on 2 busy cores
def test_quick_run_writes_one_json(tmp_path):
    tf.main(["--quick", "--data", "random", "--out-dir", str(tmp_path)])
    files = list(tmp_path.glob("token_finetune-*.json"))
    assert len(files) == 1
    doc = json.loads(files[0].read_text())
    assert doc["benchmark"] == "token_finetune" and doc["config"]["quick"]
    (row,) = doc["rows"]
    assert (row["size"], row["batch"], row["k"]) == ("tiny", 8, 4)
    assert row["update_tokens_per_s"] > 0 and row["fused_over_separate"] > 0
