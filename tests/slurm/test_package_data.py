"""The package's data files are read through importlib.resources (slurm/package_data.py); one
missing from an install is named, with where it was looked for."""

from __future__ import annotations

import pytest

from services.base.errors import RuntimeFailure
from slurm.backends.slime import DATA_PACKAGE
from slurm.package_data import read_json


def test_each_data_file_reads_as_its_document() -> None:
    assert "qwen2.5-32B" in read_json(DATA_PACKAGE, "presets.json")["presets"]
    assert "--num-layers" in read_json(DATA_PACKAGE, "flags.json")["flags"]


def test_a_missing_data_file_is_named_not_a_bare_file_not_found() -> None:
    with pytest.raises(
        RuntimeFailure, match=r"absent\.json: not in the installed slurm\.backends\.slime package"
    ):
        read_json(DATA_PACKAGE, "absent.json")
