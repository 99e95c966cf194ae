"""The data files shipped inside the launcher's packages (the slime backend's model presets and
flag list), read through importlib.resources: the installed package's own copy wherever it
lives (a wheel in the training image, a zip), never a path beside the checkout."""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

from services.base.errors import RuntimeFailure


def read_json(package: str, name: str) -> dict[str, Any]:
    """One JSON document of `package`; a missing file names itself and the package it was
    looked for in (an install without its data files), never a bare FileNotFoundError."""
    resource = files(package).joinpath(name)
    try:
        text = resource.read_text(encoding="utf-8")
    except FileNotFoundError as error:
        raise RuntimeFailure(
            f"{name}: not in the installed {package} package ({resource}); the install lacks its "
            "data files (pyproject.toml's package-data)"
        ) from error
    document: dict[str, Any] = json.loads(text)
    return document
