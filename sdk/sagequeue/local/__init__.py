"""The embedded stack: sagequeue without an AWS account.

    from sagequeue.local import SageMakerEmulator, VirtualClock, LocalStack

Names are imported on first use, so `import sagequeue.local` costs nothing until one is needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "SageMakerEmulator": "sagequeue.local.emulator",
    "VirtualClock": "sagequeue.local.clock",
    "RealClock": "sagequeue.local.clock",
    "Clock": "sagequeue.local.clock",
    "LocalStack": "sagequeue.local.stack",
}

if TYPE_CHECKING:  # pragma: no cover
    from sagequeue.local.clock import Clock, RealClock, VirtualClock
    from sagequeue.local.emulator import SageMakerEmulator
    from sagequeue.local.stack import LocalStack

__all__ = ["Clock", "LocalStack", "RealClock", "SageMakerEmulator", "VirtualClock"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sagequeue.local' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
