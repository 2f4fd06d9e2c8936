"""torch's functional API, imported when a reference or a baseline first needs it (importing the catalogue
must not import torch)."""
from __future__ import annotations

from typing import Any


def functional() -> Any:
    import torch.nn.functional as F

    return F
