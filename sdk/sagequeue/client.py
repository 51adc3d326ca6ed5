"""A signed HTTP client for the sagequeue API.

    from sagequeue import QueueClient
    queue = QueueClient()                      # SAGEQUEUE_ENDPOINT, SAGEQUEUE_STACK_NAME or `sagequeue local`
    job = queue.submit(create_training_job_request, priority=100)
    print(queue.job(job.name).position)

Requests are signed with SigV4 for API Gateway (service `execute-api`) with the caller's AWS credentials,
so the server knows who submitted from its request context, never from the body.

botocore and urllib3 are imported on first use, and boto3 only when a stack or profile must be looked up:
`import sagequeue.client` costs a few milliseconds and never imports the SageMaker SDK.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlsplit

from sagequeue.config import (
    API_ID_ENV,
    API_URL_OUTPUT,
    ENDPOINT_ENV,
    STACK_NAME_ENV,
    LocalConnection,
    load_local_connection,
)
from sagequeue.exceptions import (
    ApiError,
    ConfigurationError,
    Conflict,
    CredentialsError,
    EndpointUnreachable,
    Forbidden,
    NotFound,
    NotTheQueue,
    SageQueueError,
    ServerError,
    Throttled,
    ValidationError,
    api_error,
)
from sagequeue_core.quotas import QuotaError, check_stored_team_name, check_team_name
from sagequeue_core.retry import (
    BACKOFF_BASE_SECONDS,
    BACKOFF_MAX_SECONDS,
    CONNECT_TIMEOUT_SECONDS,
    MAX_ATTEMPTS,
    READ_TIMEOUT_SECONDS,
    http_retry,
)

if TYPE_CHECKING:  # pragma: no cover
    import boto3
    import urllib3

__all__ = [
    "ApiError",
    "ConfigurationError",
    "Conflict",
    "CredentialsError",
    "EndpointUnreachable",
    "Forbidden",
    "HistoryEntry",
    "Identity",
    "Job",
    "NotFound",
    "Pool",
    "QueueClient",
    "SageQueueError",
    "ServerError",
    "Throttled",
    "ValidationError",
]

# States as the API names them (sagequeue_core.domain.JobState); kept as strings here so a client keeps
# working when a newer server reports a state it does not know.
WAITING_STATES = frozenset({"queued", "held"})
LIVE_STATES = frozenset({"starting", "running", "preempting", "stopping"})
TERMINAL_STATES = frozenset({"completed", "failed", "cancelled", "idle_stopped"})

_EXECUTE_API_HOST = re.compile(r"^[a-z0-9]+\.execute-api(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com", re.I)
_VPCE_HOST = re.compile(r"\.execute-api\.([a-z0-9-]+)\.vpce\.amazonaws\.com$", re.I)
_USER_AGENT = "sagequeue-sdk/0.1"


# --- Results -------------------------------------------------------------------------------------------------


def _parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    if isinstance(value, datetime):
        return value
    text = str(value)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def _int(value: Any, default: int = 0) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


@dataclass(frozen=True)
class HistoryEntry:
    """One state change of a job: when, to which state, during which attempt, and why."""

    at: datetime | None
    state: str
    attempt: int
    reason: str | None

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> HistoryEntry:
        return cls(
            at=_parse_time(data.get("at")),
            state=str(data.get("state", "")),
            attempt=_int(data.get("attempt")),
            reason=data.get("reason"),
        )


@dataclass(frozen=True)
class Job:
    """A queue entry as the API reports it.

    `position`, `attempts` and `history` are filled by `QueueClient.job()` (the detail route); listings
    leave them empty. `raw` keeps the answer as received, including fields newer servers add.
    """

    name: str
    state: str
    priority: int
    pool: str
    attempt: int
    training_job_name: str | None
    owner: str
    submitted_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    reason: str | None
    preemptions: int
    retries: int
    instances: int
    #: times its lender stopped an attempt that ran on loan, to take the capacity back (apart from preemptions)
    loans_taken_back: int = 0
    position: int | None = None
    attempts: tuple[str, ...] = ()
    history: tuple[HistoryEntry, ...] = ()
    #: attempts that ran on SageMaker and ended, and their seconds in SageMaker's Training phase (totals the
    #: bounded history does not hold)
    attempts_ended: int = 0
    seconds_trained: int = 0
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def last_checkpoint_at(self) -> datetime | None:
        """When the live attempt's last checkpoint was complete (the API's `checkpoint.at`); None: none
        seen yet, no live attempt, or a server that does not report checkpoints."""
        checkpoint = self.raw.get("checkpoint")
        return _parse_time(checkpoint.get("at")) if isinstance(checkpoint, Mapping) else None

    @property
    def checkpoint_interval_seconds(self) -> float | None:
        """Seconds between the live attempt's checkpoints (the API's `checkpoint.interval_seconds`); None
        until two were seen, or when the value is not a positive finite number."""
        checkpoint = self.raw.get("checkpoint")
        value = checkpoint.get("interval_seconds") if isinstance(checkpoint, Mapping) else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value) if math.isfinite(value) and value > 0 else None

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> Job:
        if not isinstance(data, Mapping) or not data.get("name"):
            raise ServerError(f"the API answered with something that is not a job: {data!r}", status=200)
        position = data.get("position")
        return cls(
            name=str(data["name"]),
            state=str(data.get("state", "")),
            priority=_int(data.get("priority")),
            pool=str(data.get("pool") or ""),
            attempt=_int(data.get("attempt")),
            training_job_name=data.get("training_job_name") or None,
            owner=str(data.get("owner") or ""),
            submitted_at=_parse_time(data.get("submitted_at")),
            started_at=_parse_time(data.get("started_at")),
            ended_at=_parse_time(data.get("ended_at")),
            reason=data.get("reason"),
            preemptions=_int(data.get("preemptions")),
            loans_taken_back=_int(data.get("loans_taken_back")),
            retries=_int(data.get("retries")),
            instances=_int(data.get("instances"), 1),
            position=None if position is None else _int(position),
            attempts=tuple(str(a) for a in data.get("attempts") or ()),
            attempts_ended=_int(data.get("attempts_ended")),
            seconds_trained=_int(data.get("seconds_trained")),
            history=tuple(
                HistoryEntry.from_api(h) for h in data.get("history") or () if isinstance(h, Mapping)
            ),
            raw=dict(data),
        )

    @property
    def waiting(self) -> bool:
        """In the queue, with no attempt holding instances (queued or held)."""
        return self.state in WAITING_STATES

    @property
    def live(self) -> bool:
        """An attempt exists on SageMaker and holds instances."""
        return self.state in LIVE_STATES

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def to_dict(self) -> dict[str, Any]:
        """The job as the API sent it (JSON-ready)."""
        return dict(self.raw)

    @property
    def forecast(self) -> StoredForecast | None:
        """The stack's forecast of when this waiting job starts, as GET /jobs/{name} gave it (made by the
        forecast function, at most 15 minutes old); None when it gave none."""
        return StoredForecast.from_api(self.raw.get("forecast"))


@dataclass(frozen=True)
class StoredForecast:
    """When a waiting job starts, as the stack last forecast it: P50 and the P10-P90 range (`p90` None:
    later than the forecast's horizon), made at `made_at` over `runs` runs of the queue forward."""

    p10: datetime | None
    p50: datetime | None
    p90: datetime | None
    made_at: datetime
    runs: int

    @classmethod
    def from_api(cls, data: Any) -> StoredForecast | None:
        if not isinstance(data, Mapping):
            return None
        made_at = _parse_time(data.get("made_at"))
        if made_at is None:
            return None
        return cls(
            p10=_parse_time(data.get("p10")),
            p50=_parse_time(data.get("p50")),
            p90=_parse_time(data.get("p90")),
            made_at=made_at,
            runs=_int(data.get("runs")),
        )


@dataclass(frozen=True)
class Pool:
    """One instance type the queue fills: its capacity and how much of it is in use, queued and warm."""

    instance_type: str
    capacity: int
    used: int
    queued: int
    warm: int
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    #: the account's warm-pool quota as the scheduler last saw it (a pool SageMaker did not retain); None:
    #: not seen (AWS's default is 0 per instance type)
    warm_quota: int | None = None

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> Pool:
        if not isinstance(data, Mapping) or not data.get("instance_type"):
            raise ServerError(f"the API answered with something that is not a pool: {data!r}", status=200)
        return cls(
            instance_type=str(data["instance_type"]),
            capacity=_int(data.get("capacity")),
            used=_int(data.get("used")),
            queued=_int(data.get("queued")),
            warm=_int(data.get("warm")),
            raw=dict(data),
            warm_quota=None if data.get("warm_quota") is None else _int(data.get("warm_quota")),
        )

    @property
    def free(self) -> int:
        return max(self.capacity - self.used, 0)

    def to_dict(self) -> dict[str, Any]:
        """The pool as the API sent it, with `free` (capacity not in use) as the table shows it."""
        return {**self.raw, "free": self.free}


@dataclass(frozen=True)
class Identity:
    """Who the API sees: the caller's IAM ARN and whether it may change pools."""

    arn: str
    admin: bool

    @property
    def account(self) -> str | None:
        parts = self.arn.split(":")
        return parts[4] if len(parts) > 5 and parts[4] else None


# --- Endpoint and credentials --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Credentials:
    """Static credentials to sign with (the local stack's, or ones the caller passes)."""

    access_key: str
    secret_key: str = field(repr=False)
    token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Resolved:
    """Where the client sends requests, and where that came from (for messages)."""

    endpoint: str
    region: str
    origin: str
    local: LocalConnection | None = None


def region_from_endpoint(endpoint: str) -> str | None:
    """The region in an execute-api host name (public or VPC endpoint), if it has one."""
    host = urlsplit(endpoint).hostname or ""
    match = _EXECUTE_API_HOST.match(host) or _VPCE_HOST.search(host)
    return match.group(1) if match else None


def _check_endpoint(endpoint: str, origin: str) -> str:
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            f"the sagequeue endpoint from {origin} must be an http(s) URL such as "
            f"https://abc123.execute-api.us-east-1.amazonaws.com/prod, got {endpoint!r}"
        )
    return endpoint.rstrip("/")


def stack_outputs(stack_name: str, session: boto3.Session, region: str | None = None) -> dict[str, str]:
    """The outputs of a deployed stack, by key."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        cloudformation = session.client("cloudformation", region_name=region or session.region_name)
        stacks = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise ConfigurationError(
            f"cannot read the outputs of stack {stack_name!r} in {region or session.region_name}: "
            f"{error.get('Code', 'Error')}: {error.get('Message', exc)}"
        ) from exc
    except BotoCoreError as exc:
        raise ConfigurationError(f"cannot read the outputs of stack {stack_name!r}: {exc}") from exc
    return (
        {
            str(o.get("OutputKey")): str(o.get("OutputValue"))
            for o in (stacks[0].get("Outputs") or [])
            if o.get("OutputKey")
        }
        if stacks
        else {}
    )


def stack_endpoint(stack_name: str, session: boto3.Session, region: str | None = None) -> str:
    """The `ApiUrl` output of a deployed sagequeue stack."""
    outputs = stack_outputs(stack_name, session, region)
    url = outputs.get(API_URL_OUTPUT)
    if not url:
        raise ConfigurationError(
            f"stack {stack_name!r} has no {API_URL_OUTPUT} output; is it a sagequeue stack? "
            f"(outputs: {', '.join(sorted(outputs)) or 'none'})"
        )
    return str(url)


# --- The client ----------------------------------------------------------------------------------------------


#: Variables that name credentials: when one is set, it wins over the saved local stack's keys.
_CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_PROFILE")


def _retry_after(value: str | None, retry: Any) -> float | None:
    """Seconds a Retry-After asks for: a number (fractions too) or an HTTP date; None if absent or bad."""
    import urllib3

    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        return float(retry.parse_retry_after(value))
    except urllib3.exceptions.InvalidHeader:
        return None


@dataclass(frozen=True)
class _Status:
    """What Retry.increment reads of an answer: its status (sagequeue never follows redirects)."""

    status: int

    def get_redirect_location(self) -> bool:
        return False


class QueueClient:
    """Signed client for the sagequeue API.

    The endpoint comes from, in order: `endpoint`, `stack_name` (the stack's ApiUrl output), the
    SAGEQUEUE_ENDPOINT and SAGEQUEUE_STACK_NAME variables, and the stack `sagequeue local` saved. Requests
    are signed with `credentials` if given, else the `profile`'s or `boto_session`'s, else the environment's
    (AWS_ACCESS_KEY_ID, AWS_PROFILE), else the saved local stack's when talking to it, else the default AWS
    credential chain: explicit flags > environment > local.json. A private API reached through a
    VPC endpoint's own DNS name needs `api_id` (or SAGEQUEUE_API_ID). HTTP(S)_PROXY and NO_PROXY apply.

    Throttling (429) is retried with exponential backoff and jitter, `max_attempts` tries in all, and so
    are gateway errors (502-504) of requests that are harmless to repeat (not a submit, which may have
    gone through); connection failures are retried a few times, then raise EndpointUnreachable.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        stack_name: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        boto_session: boto3.Session | None = None,
        credentials: Credentials | tuple[str, str] | tuple[str, str, str | None] | None = None,
        api_id: str | None = None,
        timeout: float = READ_TIMEOUT_SECONDS,
        max_attempts: int = MAX_ATTEMPTS,
        backoff_base: float = BACKOFF_BASE_SECONDS,
        backoff_cap: float = BACKOFF_MAX_SECONDS,
        http: urllib3.PoolManager | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self._profile = profile
        self._boto_session = boto_session
        self._resolved = self._resolve(endpoint, stack_name, region)
        self.api_id = api_id or os.environ.get(API_ID_ENV) or None
        if self.api_id is None and _VPCE_HOST.search(urlsplit(self.endpoint).hostname or ""):
            raise ConfigurationError(
                f"{self.endpoint} is a VPC endpoint's own name: API Gateway needs the API's id to route "
                f"the request; pass api_id= (CLI: --api-id) or set {API_ID_ENV}"
            )
        self._credentials_source = self._pick_credentials(credentials)
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self._http = http
        self._sleep: Callable[[float], None] = time.sleep
        #: The server's clock at its last answer (its Date header), so durations shown are on its time.
        self.server_time: datetime | None = None

    # -- configuration ------------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return self._resolved.endpoint

    @property
    def region(self) -> str:
        return self._resolved.region

    @property
    def endpoint_origin(self) -> str:
        """Where the endpoint came from (an argument, a variable, a stack, the saved local stack)."""
        return self._resolved.origin

    def __repr__(self) -> str:
        return f"QueueClient(endpoint={self.endpoint!r}, region={self.region!r})"

    def _session(self) -> boto3.Session:
        if self._boto_session is None:
            import boto3
            from botocore.exceptions import ProfileNotFound

            try:
                self._boto_session = boto3.Session(profile_name=self._profile)
            except ProfileNotFound as exc:
                raise ConfigurationError(f"AWS profile {self._profile!r} is not configured") from exc
        return self._boto_session

    def _resolve(self, endpoint: str | None, stack_name: str | None, region: str | None) -> Resolved:
        local: LocalConnection | None = None
        if endpoint:
            url, origin = _check_endpoint(endpoint, "the endpoint argument"), "the endpoint argument"
        elif stack_name:
            url, origin = self._stack_url(stack_name, region), f"stack {stack_name}"
        elif os.environ.get(ENDPOINT_ENV):
            url = _check_endpoint(os.environ[ENDPOINT_ENV], ENDPOINT_ENV)
            origin = ENDPOINT_ENV
        elif os.environ.get(STACK_NAME_ENV):
            name = os.environ[STACK_NAME_ENV]
            url, origin = self._stack_url(name, region), f"stack {name} ({STACK_NAME_ENV})"
        else:
            local = load_local_connection()
            if local is None:
                raise ConfigurationError(
                    "no sagequeue endpoint: pass endpoint= (CLI: --endpoint), set "
                    f"{ENDPOINT_ENV}, name a deployed stack with stack_name= (CLI: --stack-name) or "
                    f"{STACK_NAME_ENV}, or start a local stack with `sagequeue local`"
                )
            url, origin = _check_endpoint(local.endpoint, "the saved local stack"), "the saved local stack"
        if local is None:
            # an explicit endpoint that is the saved local stack still signs with the stack's keys
            saved = _load_local_quietly()
            if saved is not None and saved.endpoint.rstrip("/") == url:
                local = saved
        chosen_region = (
            region
            or region_from_endpoint(url)
            or (local.region if local else None)
            or self._default_region()
            or "us-east-1"
        )
        return Resolved(endpoint=url, region=chosen_region, origin=origin, local=local)

    def _default_region(self) -> str | None:
        if self._boto_session is not None:
            return self._boto_session.region_name
        return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")

    def _stack_url(self, stack_name: str, region: str | None) -> str:
        url = stack_endpoint(stack_name, self._session(), region)
        return _check_endpoint(url, f"stack {stack_name}")

    def _pick_credentials(self, credentials: Any) -> Credentials | None:
        """Static credentials when they are known now; None means 'ask the AWS chain at each request'."""
        if credentials is not None:
            if isinstance(credentials, Credentials):
                return credentials
            if isinstance(credentials, tuple) and len(credentials) in (2, 3):
                return Credentials(*credentials)
            raise TypeError(
                "credentials must be sagequeue.client.Credentials or (access_key, secret_key[, token])"
            )
        # flags (credentials, profile, session) > the environment > the saved local stack's keys
        explicit = self._profile is not None or self._boto_session is not None
        from_environment = any(os.environ.get(name) for name in _CREDENTIAL_ENV)
        if not explicit and not from_environment and self._resolved.local is not None:
            local = self._resolved.local
            return Credentials(local.access_key_id, local.secret_access_key)
        return None

    def _signing_credentials(self) -> Any:
        if self._credentials_source is not None:
            return self._credentials_source
        found = self._session().get_credentials()
        if found is None:
            raise CredentialsError(
                "no AWS credentials to sign sagequeue requests with: configure a profile "
                "(aws configure, AWS_PROFILE) or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            )
        # refreshable credentials (SSO, assumed roles) are frozen per request so a refresh mid-sign is safe
        return found.get_frozen_credentials()

    # -- HTTP -----------------------------------------------------------------------------------------------

    def _pool(self) -> urllib3.PoolManager:
        if self._http is None:
            import urllib3

            # a few connections per host: a session waiting in one thread while the caller works in another
            options: dict[str, Any] = {
                "num_pools": 4,
                "maxsize": 8,
                "headers": {"User-Agent": _USER_AGENT},
                "retries": False,
            }
            proxy = _proxy_for(self.endpoint)
            self._http = urllib3.ProxyManager(proxy, **options) if proxy else urllib3.PoolManager(**options)
        return self._http

    def _signed_headers(self, method: str, url: str, body: bytes | None) -> dict[str, str]:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        headers = {"Accept": "application/json"}
        if self.api_id:
            headers["x-apigw-api-id"] = self.api_id
        if body is not None:
            headers["Content-Type"] = "application/json"
        request = AWSRequest(method=method, url=url, data=body or b"", headers=headers)
        SigV4Auth(self._signing_credentials(), "execute-api", self.region).add_auth(request)
        return dict(request.headers.items())

    def retry_policy(self) -> urllib3.Retry:
        """The retry policy of every request (`sagequeue_core.retry.http_retry`) with this client's tries
        and backoff: throttling for every method, gateway errors and broken answers only for methods that
        are harmless to repeat (not a submit, which may have gone through), full jitter, Retry-After."""
        return http_retry(attempts=self.max_attempts, base=self.backoff_base, cap=self.backoff_cap)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        query: Mapping[str, Any] | None = None,
    ) -> Any:
        """Send one signed request (retrying as documented) and return the decoded JSON answer."""
        import urllib3

        method = method.upper()
        url = self.endpoint + path
        params = {k: v for k, v in (query or {}).items() if v is not None}
        if params:
            url += "?" + urlencode(sorted(params.items()))
        payload = None if body is None else json.dumps(body, default=_json_default).encode()
        retry = self.retry_policy()
        while True:
            # signed afresh for every try: a retry after a long wait must not carry a stale date
            headers = self._signed_headers(method, url, payload)
            try:
                response = self._pool().request(
                    method,
                    url,
                    body=payload,
                    headers=headers,
                    timeout=urllib3.Timeout(
                        connect=min(self.timeout, CONNECT_TIMEOUT_SECONDS), read=self.timeout
                    ),
                    retries=False,
                    redirect=False,
                )
            except urllib3.exceptions.HTTPError as exc:
                # a refused or timed-out connection reached nothing: any method is retried, a few times so a
                # wrong endpoint is reported in about a second; after that the request may have been
                # processed, so only what is harmless to repeat is repeated (the policy decides both)
                try:
                    retry = retry.increment(method, url, error=exc)
                except Exception as final:
                    raise EndpointUnreachable(self.endpoint, _reason(exc)) from final
                self._sleep(retry.get_backoff_time())
                continue
            status = response.status
            if retry.is_retry(method, status):
                try:
                    retry = retry.increment(method, url, response=_Status(status))  # type: ignore[arg-type]
                except urllib3.exceptions.MaxRetryError:
                    pass  # out of tries: the answer stands
                else:
                    after = _retry_after(response.headers.get("Retry-After"), retry)
                    self._sleep(
                        min(after, self.backoff_cap) if after is not None else retry.get_backoff_time()
                    )
                    continue
            self._note_server_time(response.headers.get("Date"))
            return self._decode(status, response.data, method, path)

    def _note_server_time(self, header: str | None) -> None:
        if not header:
            return
        from email.utils import parsedate_to_datetime

        try:
            when = parsedate_to_datetime(header)
        except (TypeError, ValueError):
            return
        self.server_time = when if when.tzinfo else when.replace(tzinfo=UTC)

    def _decode(self, status: int, data: bytes, method: str, path: str) -> Any:
        text = data.decode("utf-8", errors="replace") if data else ""
        try:
            decoded: Any = json.loads(text) if text else None
        except json.JSONDecodeError:
            decoded = None
        if status >= 400:
            snippet = text.strip().replace("\n", " ")[:200]
            raise api_error(
                status, decoded, f"{method} {path} answered HTTP {status}: {snippet or 'no body'}"
            )
        if decoded is None and text:
            raise ServerError(
                f"{method} {path} answered HTTP {status} with a body that is not JSON: {text[:200]!r}",
                status=status,
            )
        return decoded

    # -- the API --------------------------------------------------------------------------------------------

    def submit(self, request: Mapping[str, Any], priority: int | None = None) -> Job:
        """Queue a CreateTrainingJob request. Without `priority`, the server takes the request's
        `priority` tag, else its default. Every other field (tags, keep-alive, checkpoints, training
        plan) is sent as given."""
        if not isinstance(request, Mapping):
            raise TypeError(f"request must be a CreateTrainingJob mapping, got {type(request).__name__}")
        body = dict(request)
        if priority is not None:
            if isinstance(priority, bool) or not isinstance(priority, int):
                raise TypeError(f"priority must be an int, got {priority!r}")
            body["priority"] = priority
        return Job.from_api(self.request("POST", "/jobs", body=body))

    def iter_jobs(
        self,
        state: str | None = None,
        pool: str | None = None,
        owner: str | None = None,
        page_size: int | None = None,
        order: str | None = None,
    ) -> Iterator[Job]:
        """Every job matching the filters, page by page, in submission order: `order` "oldest" (the
        default) or "newest" first."""
        token: str | None = None
        while True:
            answer = self.request(
                "GET",
                "/jobs",
                query={
                    "state": state,
                    "pool": pool,
                    "owner": owner,
                    "limit": page_size,
                    "next_token": token,
                    "order": order,
                },
            )
            if (
                not isinstance(answer, Mapping)
                or not isinstance(answer.get("jobs"), list)
                or "next_token" not in answer
            ):
                # the API always answers both keys (docs/contracts.md); another service's answer, such as
                # moto's `{"jobs": []}` on its own route, would otherwise read as an empty queue
                raise NotTheQueue(
                    self.endpoint, f"GET /jobs answered {str(answer)[:120]!r}, not a page of jobs"
                )
            for item in answer["jobs"]:
                yield Job.from_api(item)
            token = answer.get("next_token")
            if not token:
                return

    def jobs(
        self,
        state: str | None = None,
        pool: str | None = None,
        owner: str | None = None,
        limit: int | None = None,
        order: str | None = None,
    ) -> list[Job]:
        """Jobs matching the filters (all pages, or the first `limit`), in submission order: `order`
        "oldest" (the default) or "newest" first."""
        out: list[Job] = []
        for job in self.iter_jobs(state=state, pool=pool, owner=owner, page_size=limit, order=order):
            out.append(job)
            if limit is not None and len(out) >= limit:
                break
        return out

    def job(self, name: str) -> Job:
        """One job with its queue position, attempts and history."""
        return Job.from_api(self.request("GET", _job_path(name)))

    def cancel(self, name: str) -> Job:
        """Cancel a job: removed from the queue, or its attempt stopped (state `stopping` until it is)."""
        return Job.from_api(self.request("DELETE", _job_path(name)))

    def set_priority(self, name: str, priority: int) -> Job:
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority must be an int, got {priority!r}")
        return Job.from_api(self.request("PATCH", _job_path(name), body={"priority": priority}))

    def hold(self, name: str) -> Job:
        """Keep a queued job from starting until released."""
        return Job.from_api(self.request("PATCH", _job_path(name), body={"held": True}))

    def release(self, name: str) -> Job:
        return Job.from_api(self.request("PATCH", _job_path(name), body={"held": False}))

    def pools(self) -> list[Pool]:
        answer = self.request("GET", "/pools")
        if not isinstance(answer, Mapping):
            raise ServerError(f"GET /pools answered {answer!r}, not a list of pools", status=200)
        return [Pool.from_api(p) for p in answer.get("pools") or ()]

    def set_capacity(self, instance_type: str, instances: int) -> Pool:
        """Set how many instances of `instance_type` the queue may use (admins only)."""
        if isinstance(instances, bool) or not isinstance(instances, int):
            raise TypeError(f"instances must be an int, got {instances!r}")
        path = "/pools/" + quote(instance_type, safe="")
        return Pool.from_api(self.request("PUT", path, body={"capacity": instances}))

    def teams(self) -> list[dict[str, Any]]:
        """Every team's quota and usage per pool: nominal, used, borrowed, lent, borrowable, waiting."""
        answer = self.request("GET", "/teams")
        if not isinstance(answer, Mapping):
            raise ServerError(f"GET /teams answered {answer!r}", status=200)
        return [dict(q) for q in answer.get("quotas") or ()]

    def team_quotas(self, team: str) -> list[dict[str, Any]]:
        """A team's quota and usage per pool: nominal, used, borrowed, lent, borrowable."""
        answer = self.request("GET", _team_path(team))
        if not isinstance(answer, Mapping):
            raise ServerError(f"GET /teams/{team}/quotas answered {answer!r}", status=200)
        return [dict(q) for q in answer.get("quotas") or ()]

    def set_team_quota(
        self,
        team: str,
        pool: str,
        nominal: int | None,
        *,
        borrowing_limit: int | None = None,
        lending_limit: int | None = None,
    ) -> dict[str, Any]:
        """Set `team`'s quota in `pool` (admins only); limits None are unlimited, nominal None removes it
        (remove_team_quota). The answer's `warning` says when the nominal quotas in the pool sum to more
        than its capacity."""
        path = _team_path(team, stored=nominal is None)
        body = {
            "pool": pool,
            "nominal": nominal,
            "borrowing_limit": borrowing_limit,
            "lending_limit": lending_limit,
        }
        return dict(self.request("PUT", path, body=body))

    def remove_team_quota(self, team: str, pool: str) -> dict[str, Any]:
        """Remove `team`'s quota in `pool` (admins only), whatever name it was stored under: one stored
        before the team-name rule ("-ops", "none") too. The answer has `removed`; the API refuses a name the
        rule refuses when no quota is stored under it."""
        return self.set_team_quota(team, pool, None)

    def forecast_score(self, hours: int | None = None) -> dict[str, Any]:
        """How the stack's past start forecasts did, per pool, over the last `hours` (the API's default when
        None): forecasts, scored (their jobs started), covered (inside P10-P90), coverage and the P50's median
        absolute error in seconds (None below the `minimum` of scored forecasts), overdue (still waiting past
        their P90)."""
        path = "/forecasts/score" if hours is None else f"/forecasts/score?{urlencode({'hours': hours})}"
        answer = self.request("GET", path)
        if not isinstance(answer, Mapping) or not isinstance(answer.get("pools"), list):
            raise ServerError(f"GET /forecasts/score answered {str(answer)[:120]!r}", status=200)
        return dict(answer)

    def forecast_calibration(self) -> dict[str, Any]:
        """How the stack calibrates its forecasts' ranges, per pool, as its forecast function last learnt it
        from its past forecasts (`sagequeue.forecast.calibrate.Calibration.from_api` reads it, bounded)."""
        answer = self.request("GET", "/forecasts/calibration")
        if not isinstance(answer, Mapping) or not isinstance(answer.get("pools"), Mapping):
            raise ServerError(f"GET /forecasts/calibration answered {str(answer)[:120]!r}", status=200)
        return dict(answer)

    def whoami(self) -> Identity:
        answer = self.request("GET", "/whoami")
        if not isinstance(answer, Mapping) or "arn" not in answer:
            raise ServerError(f"GET /whoami answered {answer!r}", status=200)
        return Identity(arn=str(answer["arn"]), admin=bool(answer.get("admin")))

    def wait(
        self,
        name: str,
        *,
        poll: float = 10.0,
        timeout: float | None = None,
        until: Callable[[Job], bool] | None = None,
        on_change: Callable[[Job], None] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> Job:
        """Poll a job until `until(job)` holds (default: it ended); `on_change` sees each new state or
        position. Raises TimeoutError after `timeout` seconds."""
        done = until or (lambda j: j.terminal)
        pause = sleep or time.sleep
        deadline = None if timeout is None else time.monotonic() + timeout
        seen: tuple[str, int, int | None] | None = None
        while True:
            job = self.job(name)
            key = (job.state, job.attempt, job.position)
            if on_change is not None and key != seen:
                on_change(job)
            seen = key
            if done(job):
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {name} is still {job.state} after {timeout:g} s")
            pause(poll)


def _job_path(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError("a job name is required")
    return "/jobs/" + quote(name, safe="")


def _team_path(team: str, *, stored: bool = False) -> str:
    """A team's quotas' path; a name the API would refuse is refused here, naming the rule. `stored`: for
    removing a quota, a name one may be stored under (check_stored_team_name), but never '.' or '..', which
    a URL cannot carry as a segment (they are read as a path's dot segments)."""
    if not stored:
        return "/teams/" + quote(check_team_name(team), safe="") + "/quotas"
    if team in (".", ".."):
        raise QuotaError(f"team name {team!r} cannot be sent in a URL: it is a path's dot segment")
    return "/teams/" + quote(check_stored_team_name(team), safe="") + "/quotas"


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    raise TypeError(f"cannot send a {type(value).__name__} in a sagequeue request: {value!r}")


def _reason(exc: BaseException) -> str:
    text = str(getattr(exc, "reason", None) or exc)
    # urllib3 prefixes the cause with the connection's repr; the cause is what a person can act on
    for marker in ("Failed to establish a new connection: ", "Failed to resolve ", "): "):
        if marker in text:
            tail = text.partition(marker)[2]
            return (marker.strip() + " " + tail) if marker.startswith("Failed to resolve") else tail
    return text


def _proxy_for(endpoint: str) -> str | None:
    """The proxy the environment names for this endpoint (HTTPS_PROXY, HTTP_PROXY), unless NO_PROXY
    exempts its host, as boto3 and curl behave."""
    from urllib.request import getproxies, proxy_bypass

    parts = urlsplit(endpoint)
    proxy = getproxies().get(parts.scheme)
    if not proxy or proxy_bypass(parts.netloc):
        return None
    return proxy


def _load_local_quietly() -> LocalConnection | None:
    try:
        return load_local_connection()
    except ConfigurationError:
        return None
