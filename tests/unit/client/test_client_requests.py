"""QueueClient without a network: a recording transport stands in for urllib3's pool, so these tests see
exactly what the client signs and sends, and how it reads every kind of answer."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import urllib3

from sagequeue.client import Credentials, Job, QueueClient
from sagequeue.exceptions import (
    Conflict,
    EndpointUnreachable,
    Forbidden,
    NotFound,
    ServerError,
    Throttled,
    ValidationError,
)

ENDPOINT = "https://abc123defg.execute-api.eu-west-1.amazonaws.com/prod"


@dataclass
class Answer:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def data(self) -> bytes:
        if self.body is None:
            return b""
        return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()


@dataclass
class Sent:
    method: str
    url: str
    body: bytes | None
    headers: dict[str, str]

    @property
    def json(self) -> Any:
        return json.loads(self.body or b"null")

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(self.url).query)


class RecordingPool:
    """Answers each request with the next scripted answer (or raises it, for transport errors)."""

    def __init__(self, *answers: Answer | Exception) -> None:
        self.answers = list(answers)
        self.sent: list[Sent] = []

    def request(self, method: str, url: str, body: bytes | None = None, headers: Any = None, **_: Any) -> Any:
        self.sent.append(Sent(method, url, body, dict(headers or {})))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def job_body(name: str = "bert-1", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "state": "queued",
        "priority": 100,
        "pool": "ml.trn1.32xlarge",
        "attempt": 0,
        "training_job_name": None,
        "owner": "arn:aws:iam::123456789012:user/data-scientist",
        "submitted_at": "2026-11-22T04:00:00+00:00",
        "started_at": None,
        "ended_at": None,
        "reason": None,
        "preemptions": 0,
        "retries": 0,
        "instances": 2,
    }
    body.update(extra)
    return body


def make_client(pool: RecordingPool, **kwargs: Any) -> tuple[QueueClient, list[float]]:
    client = QueueClient(ENDPOINT, credentials=("AKIDEXAMPLE", "secret"), http=pool, **kwargs)  # type: ignore[arg-type]
    sleeps: list[float] = []
    client._sleep = sleeps.append
    return client, sleeps


def test_requests_are_signed_for_execute_api_in_the_endpoints_region() -> None:
    pool = RecordingPool(
        Answer(200, {"arn": "arn:aws:iam::123456789012:user/data-scientist", "admin": False})
    )
    client, _ = make_client(pool)

    identity = client.whoami()

    sent = pool.sent[0]
    assert identity.arn.endswith("user/data-scientist")
    assert identity.account == "123456789012"
    assert client.region == "eu-west-1"
    assert sent.url == ENDPOINT + "/whoami"
    auth = sent.headers["Authorization"]
    assert auth.startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/eu-west-1/execute-api/aws4_request" in auth
    assert "host" in auth.split("SignedHeaders=")[1].split(",")[0].split(";")
    assert "X-Amz-Date" in sent.headers


def test_a_different_secret_gives_a_different_signature() -> None:
    signatures = []
    for secret in ("one", "two"):
        pool = RecordingPool(Answer(200, {"pools": []}))
        client = QueueClient(ENDPOINT, credentials=Credentials("AKIDEXAMPLE", secret), http=pool)  # type: ignore[arg-type]
        client.pools()
        signatures.append(pool.sent[0].headers["Authorization"].split("Signature=")[1])
    assert signatures[0] != signatures[1]


def test_session_token_is_sent_with_temporary_credentials() -> None:
    pool = RecordingPool(Answer(200, {"pools": []}))
    client = QueueClient(ENDPOINT, credentials=("ASIAEXAMPLE", "secret", "token-1"), http=pool)  # type: ignore[arg-type]
    client.pools()
    assert pool.sent[0].headers["X-Amz-Security-Token"] == "token-1"


def test_submit_sends_the_request_whole_with_the_priority_on_top() -> None:
    request = {
        "TrainingJobName": "bert-1",
        "RoleArn": "arn:aws:iam::123456789012:role/train",
        "ResourceConfig": {
            "InstanceType": "ml.trn1.32xlarge",
            "InstanceCount": 2,
            "VolumeSizeInGB": 100,
            "KeepAlivePeriodInSeconds": 1800,
            "TrainingPlanArn": "arn:aws:sagemaker:eu-west-1:123456789012:training-plan/p1",
        },
        "CheckpointConfig": {"S3Uri": "s3://bucket/ckpt", "LocalPath": "/opt/ml/checkpoints"},
        "Tags": [{"Key": "team", "Value": "nlp"}, {"Key": "priority", "Value": "5"}],
    }
    pool = RecordingPool(Answer(201, job_body()))
    client, _ = make_client(pool)

    job = client.submit(request, priority=100)

    sent = pool.sent[0]
    assert (sent.method, sent.url) == ("POST", ENDPOINT + "/jobs")
    assert sent.headers["Content-Type"] == "application/json"
    assert sent.json == {**request, "priority": 100}
    assert job.name == "bert-1"
    assert job.priority == 100


def test_submit_without_priority_leaves_it_to_the_server() -> None:
    pool = RecordingPool(Answer(201, job_body()))
    client, _ = make_client(pool)
    client.submit({"TrainingJobName": "bert-1"})
    assert "priority" not in pool.sent[0].json


def test_a_job_has_the_apis_fields_typed() -> None:
    detail = job_body(
        state="running",
        attempt=2,
        training_job_name="bert-1-2",
        started_at="2026-11-22T04:10:00Z",
        preemptions=1,
        position=None,
        attempts=["bert-1", "bert-1-2"],
        history=[{"at": "2026-11-22T04:05:00+00:00", "state": "queued", "attempt": 1, "reason": "preempted"}],
        future_field="kept",
    )
    pool = RecordingPool(Answer(200, detail))
    client, _ = make_client(pool)

    job = client.job("bert-1")

    assert pool.sent[0].url == ENDPOINT + "/jobs/bert-1"
    assert job.state == "running"
    assert job.live
    assert not job.waiting
    assert not job.terminal
    assert job.training_job_name == "bert-1-2"
    assert job.started_at == datetime(2026, 11, 22, 4, 10, tzinfo=UTC)
    assert job.attempts == ("bert-1", "bert-1-2")
    assert job.history[0].reason == "preempted"
    assert job.history[0].at == datetime(2026, 11, 22, 4, 5, tzinfo=UTC)
    assert job.instances == 2
    assert job.to_dict()["future_field"] == "kept"


def test_changes_use_the_contracts_routes() -> None:
    pool = RecordingPool(
        Answer(200, job_body(state="cancelled")),
        Answer(200, job_body(priority=7)),
        Answer(200, job_body(state="held")),
        Answer(200, job_body(state="queued")),
        Answer(
            200,
            {"instance_type": "ml.trn1.32xlarge", "capacity": 4, "used": 1, "queued": 3, "warm": 1},
        ),
    )
    client, _ = make_client(pool)

    assert client.cancel("bert-1").state == "cancelled"
    assert client.set_priority("bert-1", 7).priority == 7
    assert client.hold("bert-1").state == "held"
    assert client.release("bert-1").state == "queued"
    capacity = client.set_capacity("ml.trn1.32xlarge", 4)

    calls = [(s.method, s.url.removeprefix(ENDPOINT), s.body and s.json) for s in pool.sent]
    assert calls == [
        ("DELETE", "/jobs/bert-1", None),
        ("PATCH", "/jobs/bert-1", {"priority": 7}),
        ("PATCH", "/jobs/bert-1", {"held": True}),
        ("PATCH", "/jobs/bert-1", {"held": False}),
        ("PUT", "/pools/ml.trn1.32xlarge", {"capacity": 4}),
    ]
    assert (capacity.capacity, capacity.free, capacity.warm) == (4, 3, 1)


def test_jobs_follows_next_token_to_the_last_page_and_sends_filters() -> None:
    pool = RecordingPool(
        Answer(200, {"jobs": [job_body("a"), job_body("b")], "next_token": "t1"}),
        Answer(200, {"jobs": [job_body("c")], "next_token": None}),
    )
    client, _ = make_client(pool)

    jobs = client.jobs(state="queued", pool="ml.trn1.32xlarge")

    assert [j.name for j in jobs] == ["a", "b", "c"]
    assert pool.sent[0].query == {"state": ["queued"], "pool": ["ml.trn1.32xlarge"]}
    assert pool.sent[1].query["next_token"] == ["t1"]


def test_jobs_stops_at_the_limit() -> None:
    pool = RecordingPool(Answer(200, {"jobs": [job_body("a"), job_body("b")], "next_token": "more"}))
    client, _ = make_client(pool)
    assert [j.name for j in client.jobs(limit=2)] == ["a", "b"]
    assert len(pool.sent) == 1
    assert pool.sent[0].query["limit"] == ["2"]


def test_newest_first_is_asked_for_and_every_page_keeps_the_order() -> None:
    pool = RecordingPool(
        Answer(200, {"jobs": [job_body("c"), job_body("b")], "next_token": "t1"}),
        Answer(200, {"jobs": [job_body("a")], "next_token": None}),
    )
    client, _ = make_client(pool)
    assert [j.name for j in client.jobs(state="completed", order="newest")] == ["c", "b", "a"]
    assert [s.query["order"] for s in pool.sent] == [["newest"], ["newest"]]


@pytest.mark.parametrize(
    ("status", "body", "error", "message"),
    [
        (
            400,
            {"message": "InstanceCount must be at least 1", "code": "ValidationError"},
            ValidationError,
            "InstanceCount must be at least 1",
        ),
        (
            403,
            {"message": "only admins may change capacity", "code": "Forbidden"},
            Forbidden,
            "only admins may change capacity",
        ),
        (
            403,
            {"Message": "The request signature we calculated does not match"},
            Forbidden,
            "The request signature we calculated does not match",
        ),
        (404, {"message": "no job named x", "code": "NotFound"}, NotFound, "no job named x"),
        (
            409,
            {"message": "a completed job cannot be held", "code": "Conflict"},
            Conflict,
            "a completed job cannot be held",
        ),
        (500, {"message": "boom", "code": "InternalError"}, ServerError, "boom"),
        (500, b"<html>oops</html>", ServerError, "GET /jobs/x answered HTTP 500: <html>oops</html>"),
    ],
)
def test_errors_are_named_and_carry_the_servers_message(
    status: int, body: Any, error: type[Exception], message: str
) -> None:
    pool = RecordingPool(Answer(status, body))
    client, _ = make_client(pool)
    with pytest.raises(error) as raised:
        client.job("x")
    assert str(raised.value) == message
    assert raised.value.status == status  # type: ignore[attr-defined]


def test_throttling_is_retried_with_backoff_honouring_retry_after() -> None:
    pool = RecordingPool(
        Answer(429, {"message": "slow down", "code": "Throttled"}, {"Retry-After": "1.5"}),
        Answer(503, {"message": "unavailable"}),
        Answer(200, job_body()),
    )
    client, sleeps = make_client(pool, backoff_base=0.5)

    job = client.job("bert-1")

    assert job.name == "bert-1"
    assert len(pool.sent) == 3
    assert sleeps[0] == 1.5
    assert 0 <= sleeps[1] <= 1.0  # full jitter under base * 2**1


def test_each_retry_is_signed_afresh() -> None:
    pool = RecordingPool(Answer(429, {"message": "slow down"}), Answer(200, job_body()))
    client, _ = make_client(pool)
    client.job("bert-1")
    assert all("Authorization" in s.headers for s in pool.sent)


def test_throttling_that_persists_raises_throttled_after_max_attempts() -> None:
    pool = RecordingPool(*[Answer(429, {"message": "rate exceeded", "code": "Throttled"})] * 3)
    client, sleeps = make_client(pool, max_attempts=3)
    with pytest.raises(Throttled, match="rate exceeded"):
        client.submit({"TrainingJobName": "bert-1"})
    assert len(pool.sent) == 3
    assert len(sleeps) == 2


def test_refused_connections_raise_endpoint_unreachable_after_a_few_tries() -> None:
    refused = urllib3.exceptions.NewConnectionError(
        None, "Failed to establish a new connection: [Errno 111] Connection refused"
    )  # type: ignore[arg-type]
    pool = RecordingPool(refused, refused, refused, refused)
    client, _ = make_client(pool)
    with pytest.raises(EndpointUnreachable) as raised:
        client.pools()
    assert len(pool.sent) == 3
    assert raised.value.endpoint == ENDPOINT
    assert "Connection refused" in str(raised.value)


def test_a_submit_that_may_have_arrived_is_not_sent_twice() -> None:
    timeout = urllib3.exceptions.ReadTimeoutError(None, ENDPOINT, "Read timed out.")  # type: ignore[arg-type]
    pool = RecordingPool(timeout, Answer(201, job_body()))
    client, _ = make_client(pool)
    with pytest.raises(EndpointUnreachable, match="Read timed out"):
        client.submit({"TrainingJobName": "bert-1"})
    assert len(pool.sent) == 1


def test_a_read_that_timed_out_is_retried() -> None:
    timeout = urllib3.exceptions.ReadTimeoutError(None, ENDPOINT, "Read timed out.")  # type: ignore[arg-type]
    pool = RecordingPool(timeout, Answer(200, job_body()))
    client, _ = make_client(pool)
    assert client.job("bert-1").name == "bert-1"
    assert len(pool.sent) == 2


def test_names_are_quoted_into_the_path() -> None:
    pool = RecordingPool(Answer(404, {"message": "no job", "code": "NotFound"}))
    client, _ = make_client(pool)
    with pytest.raises(NotFound):
        client.job("a/b c")
    assert pool.sent[0].url == ENDPOINT + "/jobs/a%2Fb%20c"


def test_an_answer_that_is_not_a_job_is_a_server_error() -> None:
    pool = RecordingPool(Answer(200, {"unexpected": True}))
    client, _ = make_client(pool)
    with pytest.raises(ServerError, match="not a job"):
        client.job("bert-1")


def test_wait_polls_until_the_job_ends_and_reports_each_change() -> None:
    pool = RecordingPool(
        Answer(200, job_body(position=2)),
        Answer(200, job_body(position=2)),
        Answer(200, job_body(position=1)),
        Answer(200, job_body(state="running", attempt=1, training_job_name="bert-1")),
        Answer(200, job_body(state="completed", attempt=1, training_job_name="bert-1")),
    )
    client, _ = make_client(pool)
    seen: list[tuple[str, int | None]] = []
    pauses: list[float] = []

    job = client.wait(
        "bert-1", poll=3, on_change=lambda j: seen.append((j.state, j.position)), sleep=pauses.append
    )

    assert job.state == "completed"
    assert seen == [("queued", 2), ("queued", 1), ("running", None), ("completed", None)]
    assert pauses == [3, 3, 3, 3]


def test_job_from_api_needs_a_name() -> None:
    with pytest.raises(ServerError):
        Job.from_api({"state": "queued"})


def test_the_api_id_is_sent_and_signed_for_a_private_api() -> None:
    pool = RecordingPool(Answer(200, {"pools": []}))
    vpce = "https://vpce-0a1b2c3d4e5f6a7b8-abcdefgh.execute-api.eu-west-1.vpce.amazonaws.com/v1"
    client = QueueClient(vpce, api_id="a1b2c3d4e5", credentials=("AKIDEXAMPLE", "secret"), http=pool)  # type: ignore[arg-type]

    client.pools()

    sent = pool.sent[0]
    assert sent.headers["x-apigw-api-id"] == "a1b2c3d4e5"
    signed = sent.headers["Authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")
    assert "x-apigw-api-id" in signed
    assert client.region == "eu-west-1"


def test_a_vpc_endpoint_name_without_the_api_id_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sagequeue.exceptions import ConfigurationError

    monkeypatch.delenv("SAGEQUEUE_API_ID", raising=False)
    vpce = "https://vpce-0a1b2c3d4e5f6a7b8-abcdefgh.execute-api.eu-west-1.vpce.amazonaws.com/v1"
    with pytest.raises(ConfigurationError, match="SAGEQUEUE_API_ID"):
        QueueClient(vpce, credentials=("AKIDEXAMPLE", "secret"))
    monkeypatch.setenv("SAGEQUEUE_API_ID", "a1b2c3d4e5")
    assert QueueClient(vpce, credentials=("AKIDEXAMPLE", "secret")).api_id == "a1b2c3d4e5"


def test_the_environments_proxy_is_used_unless_no_proxy_exempts_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.corp.example:3128")

    proxied = QueueClient(ENDPOINT, credentials=("AKIDEXAMPLE", "secret"))._pool()
    assert isinstance(proxied, urllib3.ProxyManager)
    assert proxied.proxy is not None
    assert proxied.proxy.host == "proxy.corp.example"

    monkeypatch.setenv("NO_PROXY", ".amazonaws.com")
    direct = QueueClient(ENDPOINT, credentials=("AKIDEXAMPLE", "secret"))._pool()
    assert not isinstance(direct, urllib3.ProxyManager)


def test_a_gateway_error_on_submit_is_not_repeated() -> None:
    pool = RecordingPool(Answer(504, {"message": "Endpoint request timed out"}), Answer(201, job_body()))
    client, sleeps = make_client(pool)
    with pytest.raises(ServerError, match="Endpoint request timed out"):
        client.submit({"TrainingJobName": "bert-1"})
    assert len(pool.sent) == 1
    assert sleeps == []


def test_the_servers_clock_is_kept_from_its_date_header() -> None:
    pool = RecordingPool(
        Answer(200, {"pools": []}, {"Date": "Mon, 05 Jan 2026 09:30:00 GMT"}),
        Answer(200, {"pools": []}, {"Date": "not a date"}),
    )
    client, _ = make_client(pool)
    assert client.server_time is None
    client.pools()
    assert client.server_time == datetime(2026, 1, 5, 9, 30, tzinfo=UTC)
    client.pools()
    assert client.server_time == datetime(2026, 1, 5, 9, 30, tzinfo=UTC)
