"""Where QueueClient finds the queue, and the saved local-stack connection it reads."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from sagequeue.client import QueueClient, region_from_endpoint
from sagequeue.config import (
    LocalConnection,
    load_local_connection,
    local_connection_path,
    remove_local_connection,
    save_local_connection,
)
from sagequeue.exceptions import ConfigurationError

LOCAL = LocalConnection(
    endpoint="http://127.0.0.1:8765",
    region="eu-central-1",
    access_key_id="AKLOCAL",
    secret_access_key="sk-local",
)


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "sqhome"
    monkeypatch.setenv("SAGEQUEUE_HOME", str(home))
    monkeypatch.delenv("SAGEQUEUE_ENDPOINT", raising=False)
    monkeypatch.delenv("SAGEQUEUE_STACK_NAME", raising=False)
    return home


def test_the_connection_file_round_trips_and_is_private(isolated_home: Path) -> None:
    path = save_local_connection(LOCAL)

    assert path == isolated_home / "local.json" == local_connection_path()
    assert json.loads(path.read_text()) == {
        "endpoint": "http://127.0.0.1:8765",
        "region": "eu-central-1",
        "access_key_id": "AKLOCAL",
        "secret_access_key": "sk-local",
    }
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_local_connection() == LOCAL
    assert list(isolated_home.iterdir()) == [path]  # no temporary file left behind


def test_no_saved_connection_is_none() -> None:
    assert load_local_connection() is None


def test_a_broken_connection_file_names_the_file_and_the_problem(isolated_home: Path) -> None:
    isolated_home.mkdir()
    (isolated_home / "local.json").write_text("{not json")
    with pytest.raises(ConfigurationError, match=r"local\.json is not valid JSON"):
        load_local_connection()
    (isolated_home / "local.json").write_text(json.dumps({"endpoint": "http://x"}))
    with pytest.raises(ConfigurationError, match="lacks region, access_key_id, secret_access_key"):
        load_local_connection()


def test_remove_only_removes_the_named_endpoints_file() -> None:
    save_local_connection(LOCAL)
    assert remove_local_connection(endpoint="http://127.0.0.1:9999") is False
    assert load_local_connection() == LOCAL
    assert remove_local_connection(endpoint=LOCAL.endpoint) is True
    assert load_local_connection() is None
    assert remove_local_connection() is False


def test_without_any_endpoint_the_error_lists_every_way_to_give_one() -> None:
    with pytest.raises(ConfigurationError) as raised:
        QueueClient()
    message = str(raised.value)
    for hint in (
        "--endpoint",
        "SAGEQUEUE_ENDPOINT",
        "--stack-name",
        "SAGEQUEUE_STACK_NAME",
        "sagequeue local",
    ):
        assert hint in message


@pytest.fixture
def no_aws_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("no_aws_keys")
def test_the_saved_local_stack_gives_endpoint_region_and_signing_keys() -> None:
    save_local_connection(LOCAL)
    client = QueueClient()
    assert client.endpoint == "http://127.0.0.1:8765"
    assert client.region == "eu-central-1"
    assert client.endpoint_origin == "the saved local stack"
    assert client._signing_credentials().access_key == "AKLOCAL"


@pytest.mark.usefixtures("no_aws_keys")
def test_naming_the_saved_endpoint_explicitly_still_signs_with_its_keys() -> None:
    save_local_connection(LOCAL)
    client = QueueClient("http://127.0.0.1:8765/")
    assert client.endpoint == "http://127.0.0.1:8765"
    assert client._signing_credentials().secret_key == "sk-local"


def test_keys_in_the_environment_win_over_the_saved_stack_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """flags > environment > local.json: keys exported as `sagequeue local env --identity admin` prints
    them sign, though local.json names the user's."""
    save_local_connection(LOCAL)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKADMIN")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "sk-admin")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_SECURITY_TOKEN", raising=False)
    client = QueueClient()
    assert client.endpoint_origin == "the saved local stack"
    signing = client._signing_credentials()
    assert (signing.access_key, signing.secret_key) == ("AKADMIN", "sk-admin")
    # an explicit flag wins over both
    explicit = QueueClient(credentials=("AKFLAG", "sk-flag"))
    assert explicit._signing_credentials().access_key == "AKFLAG"


def test_a_profile_in_the_environment_wins_over_the_saved_stack_s(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    save_local_connection(LOCAL)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    credentials = tmp_path / "credentials"
    credentials.write_text("[ops]\naws_access_key_id = AKPROFILE\naws_secret_access_key = sk-profile\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_PROFILE", "ops")
    assert QueueClient()._signing_credentials().access_key == "AKPROFILE"
    monkeypatch.delenv("AWS_PROFILE")
    assert QueueClient()._signing_credentials().access_key == "AKLOCAL"


def test_the_environment_variable_wins_over_the_saved_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    save_local_connection(LOCAL)
    monkeypatch.setenv(
        "SAGEQUEUE_ENDPOINT", "https://q1w2e3r4t5.execute-api.ap-southeast-2.amazonaws.com/prod/"
    )
    client = QueueClient()
    assert client.endpoint == "https://q1w2e3r4t5.execute-api.ap-southeast-2.amazonaws.com/prod"
    assert client.region == "ap-southeast-2"
    assert client.endpoint_origin == "SAGEQUEUE_ENDPOINT"
    # not the local stack: the default AWS chain signs (the test environment's keys)
    assert client._signing_credentials().access_key == "testing"


def test_the_argument_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGEQUEUE_ENDPOINT", "http://127.0.0.1:1")
    client = QueueClient("http://127.0.0.1:2", region="us-west-2")
    assert (client.endpoint, client.region) == ("http://127.0.0.1:2", "us-west-2")


def test_an_endpoint_that_is_not_a_url_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGEQUEUE_ENDPOINT", "abc123.execute-api.us-east-1.amazonaws.com")
    with pytest.raises(ConfigurationError, match="SAGEQUEUE_ENDPOINT must be an http"):
        QueueClient()


@pytest.mark.parametrize(
    ("endpoint", "region"),
    [
        ("https://abc123.execute-api.us-east-2.amazonaws.com/prod", "us-east-2"),
        ("https://vpce-0a1b2c3d-4e5f6a7b.execute-api.eu-west-3.vpce.amazonaws.com/prod", "eu-west-3"),
        ("http://127.0.0.1:8765", None),
    ],
)
def test_region_from_endpoint(endpoint: str, region: str | None) -> None:
    assert region_from_endpoint(endpoint) == region


def test_secrets_stay_out_of_reprs() -> None:
    from sagequeue.client import Credentials

    assert "sk-local" not in repr(LOCAL)
    assert "s3cr3t" not in repr(Credentials("AKID", "s3cr3t", "t0ken"))
    assert "t0ken" not in repr(Credentials("AKID", "s3cr3t", "t0ken"))
