"""Who this container is: the training job and host SageMaker started it as."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sagequeue_core.defaults import host_dimension_value

#: SageMaker writes the cluster layout here; `current_host` is "algo-<n>".
RESOURCE_CONFIG_PATH = "/opt/ml/input/config/resourceconfig.json"
#: Overrides RESOURCE_CONFIG_PATH (tests, or running the wrapper outside SageMaker).
RESOURCE_CONFIG_ENV = "SAGEQUEUE_RESOURCE_CONFIG"
#: SageMaker sets the training job's name in the container's environment.
TRAINING_JOB_NAME_ENV = "TRAINING_JOB_NAME"
#: SageMaker's training toolkit sets the instance type.
INSTANCE_TYPE_ENV = "SM_CURRENT_INSTANCE_TYPE"


class HostIdentityError(RuntimeError):
    """The container does not say which training job or host it is."""


@dataclass(frozen=True)
class HostIdentity:
    training_job_name: str
    host_index: int
    instance_type: str | None = None

    @property
    def dimension_value(self) -> str:
        return host_dimension_value(self.training_job_name, self.host_index)


def host_index_of(current_host: str) -> int:
    prefix, _, number = current_host.rpartition("-")
    if prefix != "algo" or not number.isdigit() or int(number) < 1:
        raise HostIdentityError(f"current_host {current_host!r} is not of the form algo-<n> (n from 1)")
    return int(number)


def resolve(env: Mapping[str, str] | None = None) -> HostIdentity:
    environment = os.environ if env is None else env
    name = environment.get(TRAINING_JOB_NAME_ENV)
    if not name:
        raise HostIdentityError(
            f"{TRAINING_JOB_NAME_ENV} is not set: not running in a SageMaker training job"
        )
    path = Path(environment.get(RESOURCE_CONFIG_ENV) or RESOURCE_CONFIG_PATH)
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise HostIdentityError(f"{path} does not exist: cannot tell which host this is") from exc
    except ValueError as exc:
        raise HostIdentityError(f"{path} is not JSON: {exc}") from exc
    current = config.get("current_host") if isinstance(config, dict) else None
    if not isinstance(current, str):
        raise HostIdentityError(f"{path} has no current_host")
    instance_type = environment.get(INSTANCE_TYPE_ENV) or config.get("current_instance_type")
    return HostIdentity(
        name, host_index_of(current), instance_type if isinstance(instance_type, str) else None
    )
