"""The source text of ``jaxil/`` and ``envs/`` describes the library, not how
it was made.

Every ``.py`` file under ``jaxil/`` and ``envs/`` is read as text (docstrings,
comments and strings alike) and each line is checked against a few tight
patterns. The bug these tests catch: a docstring or comment that cites an
issue number ("issue 12", "issue 16, section 4", "(#14)"), a document outside
the repository (``DESIGN.md``, ``../shared/REFERENCES.md``), the machine it
was measured on ("the 2-core development VM", "H200"), or a narrative of the
code's history ("jaxil before:", "until now", "the old code") lands again. A
reader of the installed package has none of those issues, documents or
machines; the text should say what the code does and why, in the present
tense. Facts about file compatibility ("runs written by earlier jaxil versions
are converted on load") are library facts and are not matched.

The patterns are deliberately narrow, so that library text never matches:
``#1``/``#2`` (the preference-judge answers) are not issue references,
"machine epsilon" and "machine-readable" are not machines, "session" (a
resumed run's sessions) and "no longer" ("brax is no longer maintained") are
not history. :func:`test_patterns_match_what_they_are_for` pins both sides.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("jaxil", "envs")

I = re.IGNORECASE

#: name -> patterns; a line matching any of them is reported under ``name``.
PATTERNS: dict[str, tuple[re.Pattern, ...]] = {
    # "issue 12", "issues 12 and 14", "issue #16, section 4"; a bare "issue"
    # without a number is ordinary English.
    "issue reference": (
        re.compile(r"\bissues?\s*#?\d+", I),
        # "(#14)", "see #14", "PR #14", "fixes #14", "gh-14": GitHub-style
        # references. A bare "#1" is not matched: "#1"/"#2" are the answers
        # of the preference judge (jaxil.algorithms.labelling).
        re.compile(r"\(#\d+\)"),
        re.compile(r"\b(?:see|per|fixes|closes|PR)\s*#\d+\b", I),
        re.compile(r"\bgh-\d+\b", I),
    ),
    # Documents that are not part of the repository.
    "document outside the repository": (
        re.compile(r"\bDESIGN\.md\b", I),
        re.compile(r"\bREFERENCES\.md\b", I),
        re.compile(r"\.\./shared/"),
    ),
    # The machine something ran or was measured on. Case-sensitive "VM" so
    # that identifiers containing "vm" (vmap, a `vm` variable) never match.
    "machine reference": (
        re.compile(r"\bVMs?\b"),
        re.compile(r"\b\d+-core\b", I),
        re.compile(r"\bH[12]00\b"),
        re.compile(r"\b(?:development|dev) (?:machine|box|host|VM)\b", I),
    ),
    # Narratives of how the code came to be; each phrase has no reading that
    # describes what the library does now.
    "development history": (
        re.compile(r"\buntil now\b", I),
        re.compile(r"\bthe old (?:code|implementation|behaviou?r)\b", I),
        re.compile(r"\bbefore (?:this|the) change\b", I),
        re.compile(r"\bwe (?:changed|renamed|moved|removed|replaced|switched|fixed)\b", I),
        # "(XQL's form; jaxil before)", "jaxil's before)": the previous
        # behaviour of jaxil, not a statement about the library.
        re.compile(r"\bjaxil(?:'s)? before(?=\s*[:;,)])", I),
        re.compile(r"\b(?:this|the) (?:PR|pull request)\b"),
    ),
}

# Paths like ``experiments/misodice_table/README.md`` or ``data_report.md``.
MD_PATH = re.compile(r"(?<![\w/.-])((?:\.\./|[\w.-]+/)*[\w.-]*\w\.md)\b")


def _source_files() -> list[Path]:
    files = sorted({p.resolve() for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")})
    assert files, f"no .py files under {FOLDERS} in {ROOT}"
    return files


def _lines():
    for path in _source_files():
        rel = path.relative_to(ROOT)
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            yield f"{rel}:{no}", line


def _hits(patterns: tuple[re.Pattern, ...]) -> list[str]:
    return [f"{where}: {line.strip()}" for where, line in _lines()
            if any(p.search(line) for p in patterns)]


@pytest.mark.parametrize("kind", sorted(PATTERNS))
def test_sources_have_no(kind):
    hits = _hits(PATTERNS[kind])
    assert not hits, (f"{len(hits)} line(s) with a {kind}; say what the library does "
                      f"and why, in the present tense:\n" + "\n".join(hits))


def test_referenced_markdown_files_exist():
    """A ``*.md`` path named in the source exists in the repository (relative
    to its root, or to the folder of the file that names it); a path that
    leaves the repository (``../shared/...``) counts as missing even where it
    exists on this computer."""
    def in_repo(p: Path) -> bool:
        p = p.resolve()
        return p.is_relative_to(ROOT) and p.exists()

    missing = []
    for path in _source_files():
        rel = path.relative_to(ROOT)
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name in MD_PATH.findall(line):
                if not (in_repo(ROOT / name) or in_repo(path.parent / name)):
                    missing.append(f"{rel}:{no}: {name} ({line.strip()})")
    assert not missing, "references to documents that are not in the repository:\n" + "\n".join(missing)


BAD = {
    "issue reference": ["Rewards learned from demonstrations (issue 12).",
                        "as issue 16, section 4 asks", "see issue #7", "fixed in (#14)",
                        "see #3", "gh-21"],
    "document outside the repository": ['(DESIGN.md "Behaviour cloning")',
                                        "``../shared/REFERENCES.md``"],
    "machine reference": ["6-21 minutes each on the 2-core development VM",
                          "measured on the H200", "on the development machine"],
    "development history": ["(XQL's form; jaxil before)", "XQL's form and jaxil's before)",
                            "until now this was", "the old code sampled", "we changed it",
                            "before this change"],
}
GOOD = [
    'the judge answers "#1" or "#2"', "``#1``, ``# 2``, ``Trajectory #1``",
    "float32 machine epsilon", "machine-readable output", "machine_info()",
    "over resumed sessions", "the first chunk of this session",
    "brax says it is no longer actively maintained", "the old key is dropped",
    "runs written by an earlier jaxil (actor_format 1) are converted on load",
    "jax.vmap(fn)", "vm = make()", "TF32 tensor cores", "usable cores",
    "before importing envs or jaxil.algorithms.offline.train",
    "an issue with the data",
]


def test_patterns_match_what_they_are_for():
    for kind, lines in BAD.items():
        for line in lines:
            assert any(p.search(line) for p in PATTERNS[kind]), (kind, line)
    every = [p for ps in PATTERNS.values() for p in ps]
    for line in GOOD:
        assert not any(p.search(line) for p in every), line
    assert MD_PATH.findall("see ``../shared/REFERENCES.md``; data_report.md") == [
        "../shared/REFERENCES.md", "data_report.md"]
    assert MD_PATH.findall("(experiments/misodice_table/README.md measures)") == [
        "experiments/misodice_table/README.md"]
