"""What the handlers run with: settings, a clock, the repository, the adapters, built once per process.

In Lambda, `dependencies()` builds everything from the environment on the first call of a cold start and
returns the same objects afterwards. The embedded stack builds its own with `build(...)` (moto and the
SageMaker emulator as endpoints, a shared virtual clock) and `install()`s them, so the very same handlers
run locally without touching the process environment; `reset()` undoes that.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import botocore.session

from sagequeue_core.config import Settings
from sagequeue_core.events import EventBridgePublisher, Publisher
from sagequeue_core.observability import metrics as default_metrics
from sagequeue_core.retry import botocore_config
from sagequeue_core.sagemaker import SageMakerAdapter
from sagequeue_core.store import Repository

#: Boto3 service names an `endpoints` mapping may redirect.
SERVICES = ("dynamodb", "events", "sagemaker", "cloudwatch", "sns", "sqs", "s3")

Clock = Callable[[], datetime]

#: Every AWS client of the functions: the one retry policy (sagequeue_core.retry).
CLIENT_CONFIG = botocore_config()


def _utc_now() -> datetime:
    return datetime.now(UTC)


def as_clock(clock: Any) -> Clock:
    """A `now()` callable from a callable or from an object with a `now()` method (VirtualClock, RealClock)."""
    if clock is None:
        return _utc_now
    now = getattr(clock, "now", None)
    if callable(now):
        return now
    if callable(clock):
        return clock
    raise TypeError(f"a clock is a callable returning a datetime or has now(); got {clock!r}")


@dataclass
class Dependencies:
    settings: Settings
    clock: Clock
    store: Repository
    sagemaker: SageMakerAdapter
    publisher: Publisher
    metrics: Any = default_metrics
    #: AWS clients by service name; `client()` creates the missing ones once.
    clients: dict[str, Any] = field(default_factory=dict)
    #: room for the governance parts (idle alarms, notifications)
    alarms: Any = None
    notifier: Any = None
    endpoints: Mapping[str, str] = field(default_factory=dict)
    region: str = "us-east-1"
    _session: Any = None
    _pools_seeded: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def now(self) -> datetime:
        return self.clock()

    def client(self, service: str) -> Any:
        """The one client of `service` (created on first use, with the configured endpoint)."""
        with self._lock:
            existing = self.clients.get(service)
            if existing is None:
                session = self._session or _session(self.region)
                existing = _client(session, service, self.region, self.endpoints.get(service))
                self.clients[service] = existing
            return existing

    def ensure_pools(self) -> None:
        """Create the configured pools once per process (capacity changed at runtime is kept)."""
        if self._pools_seeded:
            return
        self.store.seed_pools(self.settings.capacity)
        self._pools_seeded = True


def build(
    settings: Settings,
    *,
    clock: Any = None,
    endpoints: Mapping[str, str] | None = None,
    region: str | None = None,
    clients: Mapping[str, Any] | None = None,
    publisher: Publisher | None = None,
) -> Dependencies:
    """Everything the handlers need. `endpoints` maps boto3 service names to endpoint URLs (moto, the
    emulator); `clients` injects ready-made clients; `publisher` replaces the EventBridge publisher."""
    endpoints = dict(endpoints or {})
    unknown = set(endpoints) - set(SERVICES)
    if unknown:
        raise ValueError(f"endpoints for unknown services {sorted(unknown)}; known: {', '.join(SERVICES)}")
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    now = as_clock(clock)
    session = _session(region)
    made: dict[str, Any] = dict(clients or {})
    for service in ("sagemaker", "events"):
        if service not in made:
            made[service] = _client(session, service, region, endpoints.get(service))
    store = Repository(settings.table_name, host=endpoints.get("dynamodb"), region=region)
    return Dependencies(
        settings=settings,
        clock=now,
        store=store,
        sagemaker=SageMakerAdapter(made["sagemaker"]),
        publisher=publisher or EventBridgePublisher(made["events"], settings.event_bus_name, clock=now),
        clients=made,
        endpoints=endpoints,
        region=region,
        _session=session,
    )


_sessions: dict[str, Any] = {}
_sessions_lock = threading.Lock()


def _session(region: str) -> Any:
    """One botocore session per region per process: a session loads each service model once, and the
    SageMaker model alone takes tens of milliseconds to parse. botocore's session rather than boto3's:
    the clients are the same, and boto3's import (s3transfer, resources) costs a cold start about 15%
    more than botocore's for nothing the handlers use (docs/adr/0004-cold-start-budget.md)."""
    with _sessions_lock:
        session = _sessions.get(region)
        if session is None:
            session = _sessions[region] = botocore.session.Session()
            session.set_config_variable("region", region)
        return session


def _client(session: Any, service: str, region: str, endpoint: str | None) -> Any:
    return session.create_client(service, region_name=region, endpoint_url=endpoint, config=CLIENT_CONFIG)


_installed: Dependencies | None = None
_install_lock = threading.Lock()


def dependencies() -> Dependencies:
    """The process's dependencies: those installed, else built once from the environment (cold start)."""
    global _installed
    if _installed is None:
        with _install_lock:
            if _installed is None:
                _installed = build(Settings.from_env())
    return _installed


def install(deps: Dependencies) -> None:
    """Use `deps` for every handler call in this process (the embedded stack, tests)."""
    global _installed
    with _install_lock:
        _installed = deps


def reset() -> None:
    """Forget installed or built dependencies; the next `dependencies()` builds from the environment."""
    global _installed
    with _install_lock:
        _installed = None
