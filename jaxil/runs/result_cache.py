"""Finished pieces of a long experiment, kept on disk so a killed run resumes.

`ResultCache` is a JSON file of `key -> result`; every `put` rewrites it
atomically (temporary file + rename), so a crash never leaves it half written.
Entries are grouped by key prefix, and each group names the settings its
results depend on: when any of those settings differ from the ones stored in
the file, that group's entries are dropped and the others are kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jaxil.runs.io_atomic import atomic_write_text


class ResultCache:
    def __init__(self, path: str | Path, settings: dict, groups: dict[str, tuple[str, ...]]):
        """`settings`: JSON-able values; `groups`: key prefix -> the names in
        `settings` its entries depend on."""
        unknown = sorted({n for names in groups.values() for n in names} - set(settings))
        if unknown:
            raise KeyError(f"ResultCache groups name settings that were not given: {unknown}")
        self.path = Path(path)
        settings = json.loads(json.dumps(settings))  # tuples -> lists, as stored
        try:
            self.data = json.loads(self.path.read_text()) if self.path.exists() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"{self.path} is not valid JSON ({e}); delete it to start the "
                             "experiment from scratch") from e
        old = self.data.get("settings", {})
        for prefix, names in groups.items():
            if any(old.get(n) != settings[n] for n in names):
                self.data = {k: v for k, v in self.data.items() if not k.startswith(prefix)}
        self.data["settings"] = settings

    def get(self, key: str) -> Any:
        return self.data.get(key)

    def put(self, key: str, value: Any) -> Any:
        self.data[key] = value
        atomic_write_text(self.path, json.dumps(self.data))
        return value
