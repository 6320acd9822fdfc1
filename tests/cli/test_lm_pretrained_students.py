"""The students of a pretrained model: `jaxil lm sft --model ... --out DIR`
keeps the fine-tuned decoder in the task's vocabulary as `DIR/students`,
with `students.json` naming the model, its architecture and the task
vocabulary; `jaxil lm interactive --expert DIR` takes them as an expert LM
and `jaxil lm align --sft DIR` refuses them in one line.

The model is a tiny Llama GGUF the test writes (tests/helpers/pretrained.py)
in `tokens:arith` with one operation. The default tests save students with
`_save_students` and compile nothing; the slow one runs the commands (an SFT
run and an interactive round each compile programs of their own, about a
minute on 2 cores)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from jaxil import envs
from jaxil.algorithms.lm import interactive as TI
from jaxil.algorithms.lm.sft import SFTConfig
from jaxil.cli.lm import _save_students, load_expert_lm
from jaxil.cli.main import main
from jaxil.nn.pretrained_params import params_from_table
from jaxil.nn.task_vocab import TaskVocab, task_decoder, task_table
from jaxil.nn.transformer import TransformerPolicy
from jaxil.pretrained import load_checkpoint

ARITH = ["--env", "tokens:arith", "--task-knob", "num_ops=1", "--no-progress"]
KNOBS = {"num_ops": 1}


@pytest.fixture(scope="module")
def env():
    return envs.make("tokens:arith", num_ops=1)


@pytest.fixture(scope="module")
def gguf(tiny_gguf):
    return tiny_gguf


@pytest.fixture(scope="module")
def saved(env, gguf, tmp_path_factory):
    """`(DIR, model, per-seed params)`: two students of the tiny model
    (its task decoder's parameters, each seed's perturbed otherwise) saved
    as `jaxil lm sft --model GGUF --lora 2 --seeds 2 --out DIR` saves them."""
    model = task_decoder(gguf, env)
    rng = np.random.default_rng(0)
    per_seed = [jax.tree.map(lambda x: np.asarray(x) + s * rng.standard_normal(x.shape).astype(
        np.float32), model.params) for s in (0.0, 0.1)]
    out = tmp_path_factory.mktemp("students") / "sft"
    _save_students(str(out), env.spec.env_id, KNOBS, SFTConfig(lora_rank=2), [3, 4],
                   jax.tree.map(lambda *xs: np.stack(xs), *per_seed), model, str(gguf))
    return out, model, per_seed


def test_students_json_alone_rebuilds_the_decoder(env, saved):
    """`load_expert_lm` rebuilds the task decoder's configuration from
    `students.json` (no checkpoint read) and returns the chosen seed's
    parameters exactly, named by the model. Kills a vocabulary, context or
    architecture recorded otherwise than the run's, and the seeds mixed
    up."""
    out, model, per_seed = saved
    meta = json.loads((out / "students.json").read_text())
    assert meta["size"] is None and meta["seeds"] == [3, 4]
    assert meta["model"]["vocab"]["names"] == list(env.vocab.names)
    assert meta["model"]["lora_rank"] == 2
    for i in (0, 1):
        policy, params, name = load_expert_lm(str(out), env, KNOBS, i)
        assert isinstance(policy, TransformerPolicy) and policy.config == model.config
        assert name.startswith("lm:tiny.gguf:")
        for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(per_seed[i])):
            np.testing.assert_array_equal(np.asarray(got), want)


class _Called(Exception):
    pass


def test_interactive_takes_them_as_the_expert_lm(env, saved, monkeypatch):
    """`jaxil lm interactive dagger --expert DIR --expert-seed 1` hands the
    interactive program the rebuilt decoder and seed 1's parameters."""
    out, model, per_seed = saved
    seen = {}

    def fake_run(env, expert, expert_params, regimes, **kw):
        seen.update(expert=expert, params=expert_params, name=kw.get("expert_name"))
        raise _Called

    monkeypatch.setattr(TI, "run", fake_run)
    with pytest.raises(_Called):
        main(["lm", "interactive", "dagger", *ARITH, "--budget", "2000", "--expert", str(out),
              "--expert-seed", "1"])
    assert seen["expert"].config == model.config and seen["name"].startswith("lm:tiny.gguf:")
    np.testing.assert_array_equal(np.asarray(jax.tree.leaves(seen["params"])[0]),
                                  jax.tree.leaves(per_seed[1])[0])


def test_align_and_a_damaged_students_json_are_refused_in_one_line(saved, tmp_path, capsys):
    """`jaxil lm align --sft DIR` says in one line why it cannot take a
    pretrained model's students and what to do instead; a `students.json`
    whose `model` lost its vocabulary, or whose vocabulary is another
    task's, is refused in one line naming the field or the task."""
    out, _, _ = saved

    def one_line(argv, *needles):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert all(n in err for n in needles), err

    one_line(["lm", "align", *ARITH, "--sft", str(out), "--reward", "r_c"],
             "fine-tuned with `jaxil lm sft --model`", "--expert DIR")
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    meta = json.loads((out / "students.json").read_text())
    expert = ["lm", "interactive", "dagger", *ARITH, "--budget", "2000", "--expert",
              str(damaged)]
    del meta["model"]["vocab"]
    (damaged / "students.json").write_text(json.dumps(meta))
    one_line(expert, "field `model`", "jaxil lm sft --out DIR")
    meta = json.loads((out / "students.json").read_text())
    meta["model"]["vocab"]["names"][5] = "ELSEWHERE"
    (damaged / "students.json").write_text(json.dumps(meta))
    one_line(expert, "mapped onto a vocabulary", "--env and --task-knob")


@pytest.mark.slow  # an SFT run and an interactive round, each its own programs (~1 min)
def test_sft_with_a_model_then_interactive_with_it_as_the_expert(gguf, tmp_path, capsys):
    """`jaxil lm sft --model GGUF --lora 2 --out DIR` writes students equal
    to the exported HF model (adapters merged; each task token's row read at
    its exported id, PAD's left out), and `jaxil lm interactive dagger
    --expert DIR` runs a round against them and prints its row."""
    out = tmp_path / "sft"
    assert main(["lm", "sft", *ARITH, "--model", str(gguf), "--lora", "2", "--lr", "1e-2",
                 "--demos", "8", "--heldout", "0", "--updates", "2", "--eval-every", "2",
                 "--batch-episodes", "4", "--eval-episodes", "2", "--out", str(out)]) == 0
    env = envs.make("tokens:arith", num_ops=1)
    policy, params, _ = load_expert_lm(str(out), env, KNOBS)
    v = json.loads((out / "students.json").read_text())["model"]["vocab"]
    hf = load_checkpoint(out / "hf")
    composed = iter(range(v["model_vocab_size"], hf.arch.vocab_size))
    at_export = TaskVocab(tuple(v["names"]), tuple(v["texts"]),
                          tuple(() if not p else (p[0],) if len(p) == 1 else (next(composed),)
                                for p in v["pieces"]), hf.arch.vocab_size)
    want = params_from_table(policy.config, task_table(at_export, hf.params))
    for (path, got), ref in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                                jax.tree.leaves(want)):
        got, ref, key = np.asarray(got), np.asarray(ref), jax.tree_util.keystr(path)
        if "token_embed" in key:
            got, ref = got[1:], ref[1:]
        elif "'head'" in key:
            got, ref = got[:, 1:], ref[:, 1:]
        np.testing.assert_array_equal(got, ref, err_msg=key)
    base = load_checkpoint(gguf)
    assert not np.array_equal(hf.params["layers.0.attn.q.kernel"],
                              base.params["layers.0.attn.q.kernel"])  # the adapters trained
    capsys.readouterr()
    assert main(["lm", "interactive", "dagger", *ARITH, "--expert", str(out), "--budget", "300",
                 "--rounds", "1", "--episodes-per-round", "2", "--updates-per-round", "1",
                 "--sft-tokens", "40", "--sft-updates", "1", "--batch-episodes", "2",
                 "--eval-episodes", "2"]) == 0
    printed = capsys.readouterr().out
    assert any(line.startswith("dagger@300") for line in printed.splitlines()), printed
