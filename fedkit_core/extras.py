"""The optional libraries behind fedkit's extras (pyproject.toml): import one where a feature
needs it, or fail with a user error that names the extra installing it."""

from __future__ import annotations

import importlib
from types import ModuleType

from fedkit_core.errors import FedkitError

#: the extra that installs each optional top-level module (``pip install 'fedkit[extra]'``)
EXTRA_OF = {
    "timm": "timm",
    "open_clip": "clip",
    "monai": "monai",
    "nibabel": "nifti",
    "pydicom": "dicom",
}


def require(
    module: str, purpose: str, extra: str | None = None, alternative: str = ""
) -> ModuleType:
    """Import ``module`` (a dotted name too) for ``purpose``; when it is missing, a
    FedkitError naming ``extra`` (default: :data:`EXTRA_OF` its top-level package) and, if
    given, an ``alternative`` way to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        top = module.partition(".")[0]
        hint = f" ({alternative})" if alternative else ""
        raise FedkitError(
            f"{purpose} needs the `{top}` package: pip install "
            f"'fedkit[{extra or EXTRA_OF[top]}]'{hint} [{err}]"
        ) from None
