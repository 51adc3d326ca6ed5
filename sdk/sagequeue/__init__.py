"""sagequeue: queue SageMaker training jobs by priority on the capacity you hold.

    from sagequeue import QueueSession          # SDK v2: estimator.fit() goes to the queue
    import sagequeue; sagequeue.install(client)  # SDK v3 / boto3: CreateTrainingJob goes to the queue
    from sagequeue import QueueClient           # the API, signed with your AWS credentials

Names are imported on first use, so `import sagequeue` stays cheap and never imports the SageMaker SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "QueueClient": "sagequeue.client",
    "QueueSession": "sagequeue.session",
    "install": "sagequeue.hook",
    "uninstall": "sagequeue.hook",
}

if TYPE_CHECKING:  # pragma: no cover
    from sagequeue.client import QueueClient
    from sagequeue.hook import install, uninstall
    from sagequeue.session import QueueSession

__all__ = ["QueueClient", "QueueSession", "__version__", "install", "uninstall"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sagequeue' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
