"""The documentation site as a reader gets it, and the docstring style it renders.

One `mkdocs build --strict` of the repository (session-scoped, about 10 s)
is shared by the site tests; they are skipped when mkdocs is not installed
(the `docs` extra). The docstring-style tests read the sources and always run.
"""

from __future__ import annotations

import ast
import functools
import html
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HAVE_MKDOCS = importlib.util.find_spec("mkdocs") is not None
needs_mkdocs = pytest.mark.skipif(not HAVE_MKDOCS, reason="mkdocs is not installed (pip install -e '.[docs]')")

# reST the site does not render: a role (`:func:`x``, `:py:class:`x``), a
# double-backtick literal, a `::` that opens a literal block.
REST_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|obj|exc|const|ref):`")
DOUBLE_BACKTICK = re.compile(r"(?<!`)``(?!`)")
LITERAL_MARK = re.compile(r"::\s*$")


def _build(site: Path, project: Path = ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=project, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    if not HAVE_MKDOCS:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    r = _build(out)
    if r.returncode != 0:
        warnings = [l for l in (r.stdout + r.stderr).splitlines() if not l.startswith("INFO")]
        pytest.fail("mkdocs build --strict failed:\n" + "\n".join(warnings[-30:]))
    return out


def _pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if p.name != "404.html")


def _prose(page_html: str) -> str:
    """The page's HTML without its code (pre and code elements)."""
    return re.sub(r"<(pre|code)\b.*?</\1>", "", page_html, flags=re.S)


# ----------------------------------------------------------------------------- maths


def _formulas_in_sources() -> int:
    """`$...$` and `$$...$$` formulas of the docs pages, outside code."""
    n = 0
    for md in (ROOT / "docs").rglob("*.md"):
        text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
        text = re.sub(r"`[^`\n]*`", "", text)
        n += len(re.findall(r"\$\$.+?\$\$", text, flags=re.S))
        text = re.sub(r"\$\$.+?\$\$", "", text, flags=re.S)
        n += len(re.findall(r"(?<![\\$])\$(?!\s)[^$\n]+?(?<!\s)\$", text))
    return n


@needs_mkdocs
def test_maths_is_rendered_at_build_time(site):
    """Every formula of the docs is MathML in the built pages: no `\\(` or
    `\\[` is left for a script to find (the bug: maths shown as raw TeX when
    the MathJax CDN cannot be reached, or a formula the build hook misses)
    and latex2mathml reported no error (`<merror>`)."""
    raw, maths, errors = [], 0, []
    for page in _pages(site):
        text = _prose(page.read_text())
        raw += [f"{page.relative_to(site)}: {m.group(0)!r}"
                for m in re.finditer(r"\\[(\[].{0,30}", text)]
        maths += len(re.findall(r"<math\b", text))
        errors += [str(page.relative_to(site))] * text.count("<merror")
    assert not raw, f"{len(raw)} raw TeX delimiters in the built site:\n" + "\n".join(raw[:20])
    assert not errors, f"formulas latex2mathml could not read, on: {sorted(set(errors))}"
    expected = _formulas_in_sources()
    assert expected > 150, expected  # the algorithm pages' maths, counted from the sources
    assert maths >= expected, f"{maths} <math> elements for {expected} formulas in docs/*.md"


@needs_mkdocs
def test_site_loads_nothing_from_the_network(site):
    """No page loads a script, a stylesheet or a font from another host (the
    bug: the MathJax CDN script or Google Fonts, which leave an offline or
    firewalled reader with raw maths and a font request that hangs)."""
    remote = re.compile(r"""<(?:script|link|img)\b[^>]*\b(?:src|href)=["'](?:https?:)?//""", re.I)
    found = [f"{p.relative_to(site)}: {m.group(0)}" for p in _pages(site) for m in remote.finditer(p.read_text())]
    assert not found, "\n".join(found[:20])
    css = "".join(p.read_text() for p in site.rglob("*.css"))
    assert "fonts.googleapis" not in css and "fonts.gstatic" not in css


def test_maths_hook_escapes_text_and_keeps_the_tex():
    """`\\texttt{<eot>}` becomes text, not an `<eot>` element that the
    browser swallows (latex2mathml copies text-mode arguments unescaped),
    and the TeX stays as the formula's alttext."""
    if importlib.util.find_spec("latex2mathml") is None:
        pytest.skip("latex2mathml is not installed (pip install -e '.[docs]')")
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import hooks
    finally:
        sys.path.remove(str(ROOT / "docs"))
    out = hooks.render_maths('<p><span class="arithmatex">\\(\\texttt{&lt;eot&gt;} &lt; x_1\\)</span></p>', "t.md")
    assert "<eot>" not in out and "&lt;eot&gt;" in out, out
    assert 'alttext="\\texttt{&lt;eot&gt;} &lt; x_1"' in out, out
    assert '<math ' in out and 'display="inline"' in out and "\\(" not in out
    block = hooks.render_maths('<div class="arithmatex">\\[\n\\sum_i x_i\n\\]</div>', "t.md")
    assert 'display="block"' in block and "&#x02211;" in block, block
    # \lvert/\rvert are fences, not relations; \log before a letter gets TeX's thin space
    fence = hooks.tex_to_mathml(r"\lvert x \rvert", display=False)
    assert '<mo form="prefix" fence="true" stretchy="false">&#x0007C;</mo><mi>x</mi>' in fence, fence
    assert '<mo form="postfix"' in fence, fence
    assert '<mi>log</mi><mspace width="0.1667em"/><mi>d</mi>' in hooks.tex_to_mathml(r"\log d", display=False)
    assert "mspace" not in hooks.tex_to_mathml(r"\exp(x)", display=False)
    # 𝟙 as its own character; a display formula's \min_d puts d under the operator
    assert "<mn>&#x1D7D9;</mn>" in hooks.tex_to_mathml(r"\mathbb{1}[t]", display=False)
    limit = hooks.tex_to_mathml(r"\min_{d} x_{j}", display=True)
    assert "<munder><mo>min</mo><mrow><mi>d</mi></mrow></munder><msub><mi>x</mi>" in limit, limit
    assert "<msub><mo>min</mo>" in hooks.tex_to_mathml(r"\min_{d} x", display=False)


# ----------------------------------------------------------------------------- reference


def _exports() -> dict:
    tree = ast.parse((ROOT / "jaxil" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "_EXPORTS":
            return ast.literal_eval(node.value)
    raise AssertionError("jaxil/__init__.py has no _EXPORTS")


@needs_mkdocs
def test_reference_lists_every_export_with_signature_and_docstring(site):
    """The `jaxil` reference page has an entry for every name of the lazy
    export table, each function with its signature and each entry with its
    docstring's first line (the bug: griffe cannot see `__getattr__`
    exports, so the page showed the package docstring and no members)."""
    import griffe

    loader = griffe.GriffeLoader(search_paths=[str(ROOT / ".docs-src")])
    loader.load("jaxil.envs")  # through the build's mirror; loads jaxil too
    page = (site / "reference" / "jaxil" / "index.html").read_text()
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    text = " ".join(text.split())
    missing = []
    for name, (module, attr) in _exports().items():
        if attr is None:
            if f'href="../{module.split(".", 1)[1]}/#{module}"' not in page and f"#{module}\"" not in page:
                missing.append(f"{name}: no link to the module {module}")
            continue
        if f'id="jaxil.{name}"' not in page:
            missing.append(f"{name}: no entry")
            continue
        obj = loader.modules_collection[f"{module}.{attr}"]
        while obj.is_alias:
            obj = obj.final_target
        if obj.is_function and f"{name}(" not in text:
            missing.append(f"{name}: no signature")
        if obj.docstring is None:
            if not obj.is_attribute:
                missing.append(f"{name}: no docstring in {obj.path}")
            continue
        first = " ".join(html.unescape(re.sub(r"\[([^\]]*)\]\[[^\]]*\]", r"\1",
                                              obj.docstring.value.split("\n\n")[0])).split())
        first = first.replace("`", "")[:40]
        if first not in text:
            missing.append(f"{name}: docstring {first!r} not shown")
    assert not missing, "\n".join(missing)
    assert 'id="jaxil.make_learner"' in page and 'id="jaxil.expand_grid"' in page


@needs_mkdocs
def test_algorithms_reference_is_one_page_per_subpackage(site):
    """`jaxil.algorithms` is split into one reference page per subpackage,
    each holding its own modules (the bug: one 534 KB page of 256 headings)."""
    pages = {sub: (sub, f"jaxil.algorithms.{sub}")
             for sub in ("offline", "rl", "labelling", "interactive", "irl", "lm")}
    # the LM track's reward modules have a page of their own
    pages["lm-rewards"] = ("lm", "jaxil.algorithms.lm.reward")
    for name, (sub, heading) in pages.items():
        page = site / "reference" / "algorithms" / name / "index.html"
        assert page.exists(), page
        ids = set(re.findall(r'id="(jaxil\.algorithms\.[\w.]+)"', page.read_text()))
        assert heading in ids
        others = {i.split(".")[2] for i in ids} - {sub}
        assert not others, f"{sub}'s page documents {others}"
        assert page.stat().st_size < 400_000, (sub, page.stat().st_size)


@needs_mkdocs
def test_no_rest_markup_on_any_page(site):
    """No built page shows a raw reST role (`:func:` and friends before a
    code span) or a reST double-backtick literal outside code (the bug: the
    reference showed about 600 of them as text)."""
    shown = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|obj|exc):(?:<code>|`)")
    found = []
    for page in _pages(site):
        text = _prose(page.read_text())
        found += [f"{page.relative_to(site)}: {m.group(0)}" for m in shown.finditer(text)]
        found += [f"{page.relative_to(site)}: ``" for _ in DOUBLE_BACKTICK.finditer(html.unescape(text))]
    assert not found, "\n".join(found[:20])


@needs_mkdocs
def test_no_docstring_line_becomes_a_heading(site):
    """The tables of contents of the reference hold only object and section
    names (the bug: an ExternalOracle docstring line starting with `#2 side y)`
    was a heading)."""
    bad = []
    for page in (site / "reference").rglob("index.html"):
        for title in re.findall(r'<h[1-6][^>]*>(.*?)</h[1-6]>', page.read_text(), flags=re.S):
            t = html.unescape(re.sub(r"<[^>]+>", "", title)).strip()
            if re.match(r"\d", t) or "side y" in t:
                bad.append(f"{page.relative_to(site)}: {t!r}")
    assert not bad, "\n".join(bad)


# ----------------------------------------------------------------------------- figures, code


@needs_mkdocs
def test_figures_open_full_size_and_code_wraps(site):
    """Each figure of the pages is a link to its own image file, and the
    site's stylesheet wraps long code lines (the bugs: plots squeezed into the
    text column with no way to open them full size; code behind a
    horizontal scroll bar)."""
    figures = 0
    for page in _pages(site):
        content = page.read_text()
        body = content.split('<article', 1)[-1].split("</article>", 1)[0]
        for m in re.finditer(r"<img\b[^>]*>", body):
            src = re.search(r'src="([^"]+)"', m.group(0)).group(1)
            before = body[:m.start()]
            assert before.rstrip().endswith(f'<a class="jaxil-figure" href="{src}" title="Open the full-size image">'), \
                f"{page.relative_to(site)}: {src} is not linked to itself"
            target = (page.parent / src).resolve()
            assert target.is_file(), f"{page.relative_to(site)}: {src} does not exist"
            figures += 1
    assert figures >= 5, figures
    css = (site / "stylesheets" / "extra.css").read_text()
    rule = re.search(r"\.md-typeset pre > code\s*\{([^}]*)\}", css)
    assert rule and "white-space: pre-wrap" in rule.group(1), "long code lines do not wrap"
    assert 'stylesheets/extra.css' in (site / "index.html").read_text()


# ----------------------------------------------------------------------------- anchors


@needs_mkdocs
def test_broken_anchor_fails_the_build(tmp_path):
    """A link to a heading that does not exist fails `mkdocs build --strict`
    with the site's own validation settings (the bug: without
    `validation: anchors: warn`, `[x](engine.md#no-such-anchor)` built with
    exit 0); the same project with a correct anchor builds."""
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    project = tmp_path / "project"
    (project / "docs").mkdir(parents=True)
    (project / "mkdocs.yml").write_text(yaml.safe_dump({
        "site_name": "anchors", "docs_dir": "docs", "strict": True,
        "markdown_extensions": ["toc"], "validation": config["validation"],
    }))
    (project / "docs" / "engine.md").write_text("# Engine\n\n## Programs\n\ntext\n")
    (project / "docs" / "index.md").write_text("# Home\n\nSee [programs](engine.md#programs).\n")
    ok = _build(tmp_path / "site-ok", project)
    assert ok.returncode == 0, ok.stderr
    (project / "docs" / "index.md").write_text("# Home\n\nSee [x](engine.md#no-such-anchor).\n")
    bad = _build(tmp_path / "site-bad", project)
    assert bad.returncode != 0
    assert "no-such-anchor" in bad.stderr + bad.stdout


# ----------------------------------------------------------------------------- docstring style


def _python_files() -> list[Path]:
    return sorted(p for d in ("jaxil", "envs") for p in (ROOT / d).rglob("*.py"))


@functools.lru_cache(maxsize=None)
def _docstrings_and_comments(path: Path) -> tuple[tuple[int, str, str], ...]:
    """(line, text, kind) of each docstring (any string statement) and comment."""
    src = path.read_text()
    out = [(node.lineno, node.value.value, "docstring") for node in ast.walk(ast.parse(src))
           if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
           and isinstance(node.value.value, str)]
    out += [(tok.start[0], tok.string, "comment")
            for tok in tokenize.generate_tokens(iter(src.splitlines(keepends=True)).__next__)
            if tok.type == tokenize.COMMENT]
    return tuple(out)


def rest_markup(text: str) -> list[str]:
    """The reST constructs of one docstring or comment that Markdown shows raw."""
    found = [m.group(0) for m in REST_ROLE.finditer(text)]
    in_fence = False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        found += ["``" for _ in DOUBLE_BACKTICK.finditer(line)]
        if LITERAL_MARK.search(line) and not line.strip().startswith("#"):
            found.append("::")
    return found


def test_rest_markup_check_catches_what_it_is_for():
    """The style check finds each reST construct and passes Markdown."""
    assert rest_markup("See :func:`jaxil.train`.") == [":func:`"]
    assert rest_markup("A :py:class:`~jaxil.data.Dataset`.") == [":py:class:`"]
    assert rest_markup("the ``--out`` flag") == ["``", "``"]
    assert rest_markup("Usage::\n\n    jaxil train") == ["::"]
    md = "See [`train`][jaxil.algorithms.offline.train.train], `--out`.\n\n```python\nx = {'a': 1}\n```\n"
    assert rest_markup(md) == []
    assert rest_markup("```text\nsplit on ``::``\n```") == []  # literal text inside a fence


def test_docstrings_and_comments_are_markdown():
    """Every docstring and comment of `jaxil/` and `envs/` is Markdown: no reST
    role, double-backtick literal or `::` literal-block marker (the bug: the
    site and `--help` show them as raw text)."""
    bad = []
    for path in _python_files():
        for line, text, kind in _docstrings_and_comments(path):
            for what in rest_markup(text):
                bad.append(f"{path.relative_to(ROOT)}:{line} ({kind}): {what}")
    assert not bad, f"{len(bad)} reST constructs (write Markdown, `[name][jaxil.module.name]`):\n" + "\n".join(bad[:40])


def test_no_docstring_line_starts_a_heading():
    """No docstring line outside a code fence starts with `#`, which Markdown
    makes a heading (the bug: ExternalOracle's `#2 side y)` line in the table
    of contents)."""
    bad = []
    for path in _python_files():
        for line, text, kind in _docstrings_and_comments(path):
            if kind != "docstring":
                continue
            in_fence = False
            for n, l in enumerate(inspect.cleandoc(text).splitlines()):
                if l.strip().startswith("```"):
                    in_fence = not in_fence
                elif not in_fence and l.startswith(("#", " #", "  #", "   #")):
                    # (four spaces or more: an indented code block, no heading)
                    bad.append(f"{path.relative_to(ROOT)}:{line + n}: {l.strip()}")
    assert not bad, "\n".join(bad)


def _helps(parser, prog="jaxil"):
    yield prog, parser.format_help()
    for action in parser._actions:
        choices = getattr(action, "choices", None)
        for name, sub in (choices.items() if isinstance(choices, dict) else ()):
            if hasattr(sub, "format_help"):
                yield from _helps(sub, f"{prog} {name}")


def test_cli_help_has_no_rest_markup():
    """No `--help` text of the `jaxil` command (many are module docstrings)
    shows a reST role, a double-backtick literal or a `::` marker."""
    from jaxil.cli.main import build_parser

    bad = []
    helps = dict(_helps(build_parser()))
    assert "jaxil lm" in helps and "jaxil train" in helps, sorted(helps)[:10]
    for prog, text in helps.items():
        bad += [f"{prog}: {what}" for what in rest_markup(text)]
    assert not bad, "\n".join(bad)
