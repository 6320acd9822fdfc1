"""mkdocs hooks of the jaxil site.

- The committed plots of `experiments/` join the site: every PNG under
  `experiments/*/results*/` is added as `experiments/<path>`, so a page in
  `docs/algorithms/` shows one as
  `../experiments/<experiment>/results/<plot>.png`.
- The API reference reads the source statically (griffe). The repository
  keeps the environments in its top-level `envs/` folder, installed as
  `jaxil.envs` (pyproject's `package-dir`), which a static reader cannot
  follow. `.docs-src/jaxil` (git-ignored, rebuilt on every build) mirrors
  the installed layout with symbolic links: every entry of `jaxil/` and
  `envs/` as `jaxil/envs`, and an `__init__.py` in which the lazy exports
  of `jaxil` are static imports (`_static_init`).
- The `jaxil` reference page lists every lazy export, generated from the
  same table (`exports_markdown`).
- Maths is rendered at build time: every formula that `pymdownx.arithmatex`
  found (`$...$`, `$$...$$`) becomes MathML (latex2mathml), which browsers
  draw natively, so the site needs no script and no network for it
  (`render_maths`); the site serves its math font, STIX Two Math
  (`math_font`).
- Every figure of a page links to its image file, so a click opens it at
  full size (`link_figures`).
"""

from __future__ import annotations

import ast
import html
import re
import shutil
from pathlib import Path

import latex2mathml.converter

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
MIRROR = ROOT / ".docs-src"


def exports() -> dict[str, tuple[str, str | None]]:
    """`jaxil._EXPORTS` (public name -> (module, attribute)), read statically."""
    tree = ast.parse((ROOT / "jaxil" / "__init__.py").read_text())
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and getattr(node.targets[0], "id", None) == "_EXPORTS"):
            return ast.literal_eval(node.value)
    raise RuntimeError("jaxil/__init__.py has no _EXPORTS table")


def _static_init() -> str:
    """`jaxil/__init__.py` with its lazy exports spelled as imports griffe reads.

    `jaxil.__getattr__` loads the names of `_EXPORTS` on first use, which a
    static reader cannot see; the mirror's `__init__.py` appends one
    `from module import attribute as name` per function or class, under
    `if TYPE_CHECKING:`, and a literal `__all__`, so the `jaxil` reference page
    renders each export with its signature and docstring straight from the
    table (a new export appears there on the next build). Exported modules
    (`jaxil.envs`) are listed in the page's text instead of being rendered
    twice.
    """
    lines = ["", "", "# Static form of the lazy exports, for the API reference.",
             "from typing import TYPE_CHECKING", "", "if TYPE_CHECKING:"]
    names = []
    for name, (module, attr) in exports().items():
        if attr is not None:
            lines.append(f"    from {module} import {attr} as {name}")
            names.append(name)
    lines.append(f"__all__ = {names!r}")
    return (ROOT / "jaxil" / "__init__.py").read_text() + "\n".join(lines) + "\n"


def _mirror() -> None:
    shutil.rmtree(MIRROR, ignore_errors=True)
    (MIRROR / "jaxil").mkdir(parents=True)
    for entry in (ROOT / "jaxil").iterdir():
        if entry.name not in ("__pycache__", "__init__.py"):
            (MIRROR / "jaxil" / entry.name).symlink_to(entry)
    (MIRROR / "jaxil" / "__init__.py").write_text(_static_init())
    (MIRROR / "jaxil" / "envs").symlink_to(ROOT / "envs")


# Built when mkdocs loads this hook, before any plugin reads the source.
_mirror()


def math_font() -> Path:
    """STIX Two Math (SIL Open Font License 1.1), as the `ziamath` package
    ships it: the site serves it, so formulas have a math font (large
    operators, stretchy delimiters, script sizes) on any reader's machine."""
    import importlib.util

    spec = importlib.util.find_spec("ziamath")
    if spec is None or spec.origin is None:
        raise RuntimeError("the docs need ziamath for its math font: pip install -e '.[docs]'")
    return Path(spec.origin).parent / "fonts" / "STIXTwoMath-Regular.ttf"


def on_files(files, config):
    files.append(File.generated(config, "assets/fonts/STIXTwoMath-Regular.ttf",
                                abs_src_path=str(math_font())))
    for png in sorted(ROOT.glob("experiments/*/results*/**/*.png")):
        files.append(File(str(png.relative_to(ROOT)), src_dir=str(ROOT),
                          dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    return files


# What pymdownx.arithmatex (generic mode) writes: `<span class="arithmatex">\(x\)</span>`
# inline, `<div class="arithmatex">\[x\]</div>` for a display formula.
_ARITHMATEX = re.compile(
    r'<(span|div) class="arithmatex">\s*\\([(\[])(.*?)\\[)\]]\s*</\1>', re.S)
# Text-mode arguments, whose characters latex2mathml copies into <mtext> as
# they are: `\texttt{<eot>}` must not become an HTML element.
_TEXT_ARG = re.compile(r"\\(text|texttt|textrm|textit|textbf|mathrm|mathtt|operatorname)\{([^{}]*)\}")
_LT, _GT, _AMP = "\ue000", "\ue001", "\ue002"
# Delimiters latex2mathml writes as plain <mo>/<mi>, which a browser spaces as
# a relation or an identifier: each goes through as a private-use character
# and comes out as an opening or closing fence.
_FENCES = {
    "lvert": ("\ue010", "&#x0007C;", "prefix"), "rvert": ("\ue011", "&#x0007C;", "postfix"),
    "lVert": ("\ue012", "&#x02016;", "prefix"), "rVert": ("\ue013", "&#x02016;", "postfix"),
    "lfloor": ("\ue014", "&#x0230A;", "prefix"), "rfloor": ("\ue015", "&#x0230B;", "postfix"),
    "lceil": ("\ue016", "&#x02308;", "prefix"), "rceil": ("\ue017", "&#x02309;", "postfix"),
}
_FENCE_TEX = re.compile(r"\\(%s)(?![A-Za-z])" % "|".join(_FENCES))
# A function name (`\log d`) takes a thin space before its argument, unless
# a parenthesis or bracket follows, as in TeX.
_FUNCTION = re.compile(
    r"(?<!<msub>)(?<!<msup>)(?<!<msubsup>)(<mi>(?:log|exp|ln|lg|sin|cos|tan|tanh|arg|det|Pr)</mi>)"
    r"(?!<mo[^>]*>(?:&#x00028;|&#x0005B;|\(|\[))(?=<)")


_DOUBLE_STRUCK_DIGIT = re.compile(r'<mn mathvariant="double-struck">(\d)</mn>')
_LIMIT_SUB = re.compile(r"<msub><mo>(min|max|lim|sup|inf|argmin|argmax)</mo>")


def _limits_below(mathml: str) -> str:
    """In a display formula, `\\min_d` puts `d` under the operator, as TeX
    does (latex2mathml writes a subscript)."""
    while (m := _LIMIT_SUB.search(mathml)) is not None:
        depth, i = 1, m.end()
        for tag in re.finditer(r"<(/?)msub>", mathml[i:]):
            depth += -1 if tag.group(1) else 1
            if depth == 0:
                close = i + tag.start()
                break
        else:
            return mathml
        mathml = (mathml[:m.start()] + f"<munder><mo>{m.group(1)}</mo>" + mathml[m.end():close]
                  + "</munder>" + mathml[close + len("</msub>"):])
    return mathml


def tex_to_mathml(tex: str, display: bool) -> str:
    """One TeX formula as a `<math>` element (`display="block"` for a display formula)."""
    tex = _TEXT_ARG.sub(lambda m: "\\%s{%s}" % (m.group(1), m.group(2).replace(
        "&", _AMP).replace("<", _LT).replace(">", _GT)), tex)
    tex = _FENCE_TEX.sub(lambda m: " " + _FENCES[m.group(1)][0] + " ", tex)
    out = latex2mathml.converter.convert(tex.strip(), display="block" if display else "inline")
    for char, entity, form in _FENCES.values():
        out = out.replace(f"<mi>{char}</mi>", f'<mo form="{form}" fence="true" stretchy="false">{entity}</mo>')
    out = _FUNCTION.sub(r'\1<mspace width="0.1667em"/>', out)
    # Chromium draws no mathvariant but "normal": 𝟙 is its own character
    out = _DOUBLE_STRUCK_DIGIT.sub(lambda m: "<mn>&#x%X;</mn>" % (0x1D7D8 + int(m.group(1))), out)
    if display:
        out = _limits_below(out)
    return out.replace(_LT, "&lt;").replace(_GT, "&gt;").replace(_AMP, "&amp;")


def render_maths(content: str, where: str) -> str:
    """`content` with every arithmatex formula replaced by its MathML.

    The TeX source stays in the page as the `alttext` of each formula (what
    a screen reader or a copy of the formula gets). A formula latex2mathml
    cannot read fails the build, naming the page and the formula.
    """
    def sub(m: re.Match) -> str:
        tag, opener, tex = m.group(1), m.group(2), html.unescape(m.group(3))
        try:
            mathml = tex_to_mathml(tex, display=opener == "[")
        except Exception as e:  # latex2mathml raises many types
            raise ValueError(f"{where}: cannot render the formula {tex!r} ({e})") from None
        alt = html.escape(" ".join(tex.split()), quote=True)
        mathml = mathml.replace("<math ", f'<math alttext="{alt}" ', 1)
        return f'<{tag} class="arithmatex">{mathml}</{tag}>'
    return _ARITHMATEX.sub(sub, content)


_IMG = re.compile(r"<img\b[^>]*>")
_LINKED = re.compile(r"<a\b[^>]*>.*?</a>", re.S)
_SRC = re.compile(r'\bsrc="([^"]+)"')


def link_figures(content: str) -> str:
    """`content` with each image that is not already inside a link wrapped in
    a link to its own file (`class="jaxil-figure"`)."""
    linked = [m.span() for m in _LINKED.finditer(content)]

    def sub(m: re.Match) -> str:
        if any(a <= m.start() < b for a, b in linked):
            return m.group(0)
        src = _SRC.search(m.group(0))
        if src is None:
            return m.group(0)
        return (f'<a class="jaxil-figure" href="{src.group(1)}" '
                f'title="Open the full-size image">{m.group(0)}</a>')
    return _IMG.sub(sub, content)


def on_page_content(html_text, page, config, files):
    return link_figures(render_maths(html_text, page.file.src_uri))


EXPORTS_MARKER = "<!-- jaxil-exports -->"


def exports_markdown() -> str:
    """The `jaxil` reference page's list of exports, in the table's order:
    each function or class rendered from its alias `jaxil.<name>` (signature
    and docstring, its members left to the module's page, which the entry
    links to), each exported module as a link."""
    parts = []
    for name, (module, attr) in exports().items():
        if attr is None:
            parts.append(f"### {name}\n\n`jaxil.{name}` is the module "
                         f"[`{module}`][{module}].\n")
            continue
        parts.append(f"::: jaxil.{name}\n"
                     "    options:\n"
                     "      heading_level: 3\n"
                     "      show_root_full_path: false\n"
                     "      members: false\n"
                     "      show_if_no_docstring: true\n\n"
                     f"Defined in [`{module}`][{module}.{attr}].\n")
    return "\n".join(parts)


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "reference/jaxil.md":
        if EXPORTS_MARKER not in markdown:
            raise ValueError(f"docs/reference/jaxil.md lost its {EXPORTS_MARKER} line")
        markdown = markdown.replace(EXPORTS_MARKER, exports_markdown())
    return markdown
