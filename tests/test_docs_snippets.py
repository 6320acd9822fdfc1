"""The code blocks of the docs pages and the README run as written.

Every fenced ``python`` block of ``docs/**/*.md`` and ``README.md`` is a
test that executes it in a fresh namespace, in a temporary working directory
whose ``runs/data`` is the repository's (recipes are built once and
shared). Every ``bash`` block has each of its ``jaxil`` command lines parsed
by the real command-line parser, and each ``python path.py`` line's script
must exist. An HTML comment on the line just above a fence, which neither
the site nor GitHub shows, marks a block:

- ``<!-- snippet: fragment -->``: a piece of a larger program (names it
  does not define, ``...`` for the user's code) or a synopsis with
  placeholders; not run, not parsed;
- ``<!-- snippet: slow -->``: runs only under ``-m slow`` (training that
  takes minutes); a slow ``bash`` block is also executed with ``bash``
  (``jaxil`` is the installed command);
- ``<!-- snippet: continues -->``: runs after the page's previous
  ``python`` block, in its namespace (one test for the pair).

Marks combine, e.g. ``<!-- snippet: continues, slow -->``. The collector is
this module rather than pytest-markdown-docs or mktestdocs: the site's
fence parser (pymdownx.superfences) renders pytest-markdown-docs'
``python notest`` info strings as inline text, neither tool checks shell
blocks or marks one block slow, and pytest-markdown-docs, once enabled, also
collects every docstring of the package.

Bugs caught: a snippet that uses a name it never defines, calls a renamed
function or passes a removed keyword; a documented command whose
subcommand or flag the CLI no longer has; a documented script that moved;
and an unknown, misspelt or misplaced mark (which would hide a block from
the tests).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
MARKS = {"fragment", "slow", "continues"}
MARK = re.compile(r"^<!--\s*snippet:\s*([\w ,]*?)\s*-->\s*$")
FENCE = re.compile(r"^(`{3,})(\w*)\s*$")
SHELL = {"bash", "sh", "shell"}


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence
    lang: str
    code: str
    marks: set = field(default_factory=set)

    @property
    def name(self) -> str:
        return f"{_rel(self.page)}:{self.line}"


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)


def blocks_of(page: Path) -> list[Block]:
    """The top-level fenced blocks of a page with a language, and their
    marks (raises on an unknown mark)."""
    lines = page.read_text().splitlines()
    for n, line in enumerate(lines):
        if MARK.match(line) and not (n + 1 < len(lines) and FENCE.match(lines[n + 1])):
            raise ValueError(f"{_rel(page)}:{n + 1}: a snippet mark must sit on the line just "
                             f"above a code fence")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith(m.group(1)):
            j += 1
        marks = set()
        if i and (mk := MARK.match(lines[i - 1])):
            marks = {w.strip() for w in mk.group(1).split(",") if w.strip()}
            unknown = marks - MARKS
            if unknown:
                raise ValueError(f"{_rel(page)}:{i + 1}: unknown snippet mark(s) "
                                 f"{sorted(unknown)}; use {sorted(MARKS)}")
        if m.group(2):
            out.append(Block(page, i + 1, m.group(2), "\n".join(lines[i + 1:j]) + "\n", marks))
        i = j + 1
    return out


def python_tests(blocks: list[Block]) -> list[list[Block]]:
    """Python blocks grouped into tests: a ``continues`` block joins the
    page's previous python block."""
    tests: list[list[Block]] = []
    for b in blocks:
        if b.lang != "python" or "fragment" in b.marks:
            continue
        if "continues" in b.marks:
            if not tests or tests[-1][0].page != b.page:
                raise ValueError(f"{b.name}: marked continues, but no python block runs before it")
            tests[-1].append(b)
        else:
            tests.append([b])
    return tests


ALL = [b for p in PAGES for b in blocks_of(p)]
PY = python_tests(ALL)
SH = [b for b in ALL if b.lang in SHELL and "fragment" not in b.marks]


def _param(group, name):
    slow = any("slow" in b.marks for b in group)
    return pytest.param(group, id=name, marks=[pytest.mark.slow] if slow else [])


def shell_commands(code: str) -> list[list[str]]:
    """The simple commands of a shell block (comments, line continuations,
    ``&&``, ``;`` and ``|`` handled; ``VAR=value`` prefixes and ``srun``
    dropped)."""
    code = code.replace("\\\n", " ")
    out = []
    for line in code.splitlines():
        words = shlex.split(line, comments=True)
        cmd: list[str] = []
        for w in words + [";"]:
            if w in ("&&", "||", ";", "|"):
                while cmd and (re.match(r"^\w+=", cmd[0]) or cmd[0] == "srun"):
                    cmd.pop(0)
                if cmd:
                    out.append(cmd)
                cmd = []
            else:
                cmd.append(w)
    return out


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    """A fresh working directory that shares the repository's built recipes."""
    (ROOT / "runs" / "data").mkdir(parents=True, exist_ok=True)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "data").symlink_to(ROOT / "runs" / "data")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_collector_reads_marks_and_shell_commands(tmp_path):
    """The collector itself. Bugs caught: a mark read from the wrong line
    (every block would then run or none would), a misspelt mark accepted
    silently, a ``continues`` block run on its own, and ``&&`` or a
    trailing comment taken for an argument."""
    page = tmp_path / "p.md"
    page.write_text("```python\na = 1\n```\n\n<!-- snippet: continues, slow -->\n"
                    "```python\nb = a\n```\n<!-- snippet: fragment -->\n```python\nc\n```\n"
                    "```bash\nX=1 jaxil envs && jaxil data list   # all\n```\n")
    blocks = blocks_of(page)
    assert [b.marks for b in blocks] == [set(), {"continues", "slow"}, {"fragment"}, set()]
    assert [[b.line for b in t] for t in python_tests(blocks)] == [[1, 6]]
    assert shell_commands(blocks[3].code) == [["jaxil", "envs"], ["jaxil", "data", "list"]]
    page.write_text("<!-- snippet: fragmnet -->\n```python\nx\n```\n")
    with pytest.raises(ValueError, match="unknown snippet mark"):
        blocks_of(page)
    page.write_text("<!-- snippet: slow -->\n\n```python\nx\n```\n")
    with pytest.raises(ValueError, match="just above a code fence"):
        blocks_of(page)


@pytest.mark.parametrize("group", [_param(g, g[0].name) for g in PY])
def test_python_block_runs(group, workdir):
    """Bug caught: a documented snippet that fails as written."""
    ns: dict = {"__name__": "__main__"}
    for b in group:
        exec(compile(b.code, b.name, "exec"), ns)  # noqa: S102 - the docs' own code


@pytest.fixture(scope="module")
def cli_parser():
    from jaxil.cli.main import build_parser

    return build_parser()


@pytest.mark.parametrize("block", [pytest.param(b, id=b.name) for b in SH])
def test_shell_block_commands_parse(block, cli_parser, capsys):
    """Bug caught: a documented ``jaxil`` command with a subcommand or flag
    the CLI no longer has, or a ``python`` script that is not where the page
    says."""
    for cmd in shell_commands(block.code):
        if cmd[0] == "jaxil":
            try:
                cli_parser.parse_args(cmd[1:])
            except SystemExit as e:
                err = capsys.readouterr().err.strip().splitlines()
                pytest.fail(f"{block.name}: `{shlex.join(cmd)}` does not parse "
                            f"(exit {e.code}): {err[-1] if err else ''}")
        elif cmd[0] in ("python", "python3") and cmd[1].endswith(".py"):
            assert (ROOT / cmd[1]).is_file(), f"{block.name}: no script {cmd[1]}"
        elif cmd[0] == "bash" and cmd[1].endswith(".sh"):
            assert (ROOT / cmd[1]).is_file(), f"{block.name}: no script {cmd[1]}"


@pytest.mark.slow
@pytest.mark.parametrize("block", [pytest.param(b, id=b.name) for b in SH
                                   if "slow" in b.marks])
def test_slow_shell_block_runs(block, workdir):
    """Bug caught: a documented command that parses but fails when run."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(["bash", "-e", "-c", block.code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, f"{block.name}: exit {r.returncode}\n{r.stderr[-2000:]}"


def test_the_environment_table_is_what_jaxil_envs_prints():
    """The table on the environments page against ``jaxil envs``'s rows.
    Bug caught: a documented width that the adapter no longer has (the
    Cleaner's observation was documented 100 wider than it is)."""
    from jaxil.cli.environments import env_table

    text = (ROOT / "docs" / "concepts" / "environments.md").read_text()
    rows = re.findall(r"^\| `([\w:.-]+)` \| (\d+) \| (\d+) \| (\d+) \| ([^|]+) \| (\d+) \| (\S+) \|$",
                      text, re.M)
    assert len(rows) >= 10, "the environments page lost its table"
    actual = {r["id"]: r for r in env_table([r[0] for r in rows])}
    for eid, agents, obs, state, action, steps, win in rows:
        a = actual[eid]
        if "note" in a:  # an optional extra that is not installed
            continue
        assert (int(agents), int(obs), int(state), action.strip(), int(steps),
                win == "yes") == (a["agents"], a["obs"], a["state"], a["action"],
                                  a["max_steps"], a["win"]), eid
