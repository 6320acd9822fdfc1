"""mkdocs hooks of the jaxil site.

- The committed plots of ``experiments/`` join the site: every PNG under
  ``experiments/*/results*/`` is added as ``experiments/<path>``, so a page in
  ``docs/algorithms/`` shows one as
  ``../experiments/<experiment>/results/<plot>.png``.
- The API reference reads the source statically (griffe). The repository
  keeps the environments in its top-level ``envs/`` folder, installed as
  ``jaxil.envs`` (pyproject's ``package-dir``), which a static reader cannot
  follow. ``.docs-src/jaxil`` (git-ignored, rebuilt on every build) mirrors
  the installed layout with symbolic links: every entry of ``jaxil/`` and
  ``envs/`` as ``jaxil/envs``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
MIRROR = ROOT / ".docs-src"


def _mirror() -> None:
    shutil.rmtree(MIRROR, ignore_errors=True)
    (MIRROR / "jaxil").mkdir(parents=True)
    for entry in (ROOT / "jaxil").iterdir():
        if entry.name != "__pycache__":
            (MIRROR / "jaxil" / entry.name).symlink_to(entry)
    (MIRROR / "jaxil" / "envs").symlink_to(ROOT / "envs")


# Built when mkdocs loads this hook, before any plugin reads the source.
_mirror()


def on_files(files, config):
    for png in sorted(ROOT.glob("experiments/*/results*/**/*.png")):
        files.append(File(str(png.relative_to(ROOT)), src_dir=str(ROOT),
                          dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    return files
