import json

import pytest

from jaxil.runs.result_cache import ResultCache

SETTINGS = dict(seeds=4, updates=100, hidden=(64, 64), dataset="abc")


def test_entries_survive_a_restart_and_only_stale_groups_are_dropped(tmp_path):
    path = tmp_path / "c.json"
    groups = {"fit:": ("seeds",), "row:": ("seeds", "updates", "hidden", "dataset")}
    c = ResultCache(path, SETTINGS, groups)
    assert c.get("fit:1") is None
    c.put("fit:1", {"x": 1.5})
    c.put("row:a", [1, 2])
    again = ResultCache(path, SETTINGS, groups)  # same settings (tuple vs stored list)
    assert again.get("fit:1") == {"x": 1.5} and again.get("row:a") == [1, 2]
    changed = ResultCache(path, dict(SETTINGS, updates=200), groups)
    assert changed.get("fit:1") == {"x": 1.5}  # does not depend on updates
    assert changed.get("row:a") is None
    changed.put("row:b", 3)
    on_disk = json.loads(path.read_text())
    assert "row:a" not in on_disk and on_disk["row:b"] == 3 and on_disk["settings"]["updates"] == 200
    assert not list(tmp_path.glob(".*.tmp"))  # atomic write leaves no temporary file


def test_corrupt_file_and_unknown_setting_are_named(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"settings": {"seeds": 4}, "row:a": [1, ')  # killed mid-write by hand
    with pytest.raises(ValueError, match="not valid JSON.*delete it"):
        ResultCache(path, SETTINGS, {"row:": ("seeds",)})
    with pytest.raises(KeyError, match="lr"):
        ResultCache(tmp_path / "d.json", SETTINGS, {"row:": ("seeds", "lr")})
