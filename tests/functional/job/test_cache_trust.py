"""Writer trust in a cache several teams share, on S3 (moto's server) and the Hub test server: a job
restores only entries of the writers it trusts, `verify` names the others, and `cache rm` removes one."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import HUB_TOKEN, STANDINS, VERSION, Cache, job_requests_in, make_cache, run_wrapper
from support import iam_check
from support.hub_server import DEFAULT_USER, HubServer

from sagequeue.cli import main
from sagequeue.job import neuron, sync
from sagequeue.job.backends import open_remote
from sagequeue.job.remote import Deadline, RemoteCache, Trust

# every request of the job image here is judged by the documented job role of the team it writes as
pytestmark = pytest.mark.usefixtures("job_requests_allowed_by_the_documented_role")


def _local(root: Path, module: str, neff: bytes) -> None:
    path = root / neuron.version_dir(VERSION) / module
    path.mkdir(parents=True)
    (path / "model.neff").write_bytes(neff)
    (path / "model.done").touch()


def _as_writer(cache: Cache, hub_server: HubServer, team: str) -> tuple[RemoteCache, str]:
    """The cache as another team's job sees it: S3 with its writer folder (the only one IAM lets it
    write), the Hub with its own machine user's token. Returns the handle and the writer name."""
    if cache.kind == "s3":
        return open_remote(cache.url, writer=team), team
    token = hub_server.add_user(team)
    return open_remote(cache.url, endpoint=hub_server.url, token=token, backoff_base=0.05), team


def _publish(remote: RemoteCache, tmp_path: Path, module: str, neff: bytes) -> None:
    root = tmp_path / f"publish-{module}"
    _local(root, module, neff)
    assert sync.upload(remote, root, VERSION, deadline=Deadline(None)).result.published


@pytest.fixture
def cli(base_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    for key in ("SAGEQUEUE_CONFIG_DIR", "HF_ENDPOINT", "HF_HOME"):
        monkeypatch.setenv(key, base_env[key])
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", base_env["HF_ENDPOINT"])
    return CliRunner()


def test_a_job_restores_only_its_trusted_writers_and_verify_names_a_planted_entry(
    cache: Cache, hub_server: HubServer, tmp_path: Path, cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, me = _as_writer(cache, hub_server, "team-a")
    if cache.kind == "hub":
        mine, me = open_remote(cache.url, endpoint=hub_server.url, token=HUB_TOKEN), DEFAULT_USER
    theirs, _ = _as_writer(cache, hub_server, "team-b")
    _publish(mine, tmp_path, "MODULE_1+aaaa", os.urandom(300))
    # another team publishes the graph this job needs next, with checksums that match its bytes
    _publish(theirs, tmp_path, "MODULE_2+aaaa", b"planted NEFF")

    root = tmp_path / "job"
    report = sync.restore(mine, root, VERSION, progress=False, trust=Trust.parse(me))

    assert report.restored == [neuron.entry_key(VERSION, "MODULE_1+aaaa")]
    assert report.untrusted == {neuron.entry_key(VERSION, "MODULE_2+aaaa"): "team-b"}
    assert not (root / neuron.version_dir(VERSION) / "MODULE_2+aaaa").exists()
    # the job image does the same with the trust list in its environment
    job = run_wrapper(
        [
            "run",
            "--cache",
            cache.url,
            "--cache-dir",
            str(tmp_path / "wrapped"),
            "--restore",
            "all",
            "--no-progress",
            "--",
            "true",
        ],
        dict(cache.env, SAGEQUEUE_NEFF_CACHE_TRUST=me),
    )
    assert job.returncode == 0, job.stderr
    assert f"restoring only entries written by {me}" in job.stderr
    assert "not restoring 1 entries of writers this job does not trust" in job.stderr
    assert {e.module for e in neuron.scan(tmp_path / "wrapped", VERSION)} == {"MODULE_1+aaaa"}
    # trusting the other team too (or any writer) takes its entry
    both = sync.restore(mine, root, VERSION, progress=False, trust=Trust.parse(f"{me},team-b"))
    assert both.restored == [neuron.entry_key(VERSION, "MODULE_2+aaaa")]

    if cache.kind == "hub":
        monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    verified = cli.invoke(main, ["cache", "verify", "--cache", cache.url, "--trust", me])
    assert verified.exit_code == 1, verified.output
    assert f"untrusted {neuron.entry_key(VERSION, 'MODULE_2+aaaa')}: written by team-b" in verified.output
    assert "1 of untrusted writers" in verified.output

    dry = cli.invoke(main, ["cache", "rm", "--cache", cache.url, neuron.entry_key(VERSION, "MODULE_2+aaaa")])
    assert dry.exit_code == 0, dry.output
    assert set(mine.entries(VERSION)) == {"MODULE_1+aaaa", "MODULE_2+aaaa"}
    removed = cli.invoke(
        main, ["cache", "rm", "--cache", cache.url, neuron.entry_key(VERSION, "MODULE_2+aaaa"), "--yes"]
    )
    assert removed.exit_code == 0, removed.output
    assert set(mine.entries(VERSION)) == {"MODULE_1+aaaa"}
    again = cli.invoke(main, ["cache", "verify", "--cache", cache.url, "--trust", me])
    assert again.exit_code == 0, again.output
    missing = cli.invoke(
        main, ["cache", "rm", "--cache", cache.url, neuron.entry_key(VERSION, "MODULE_9+aaaa")]
    )
    assert missing.exit_code == 1
    assert "no such entry" in missing.output


def test_an_entry_whose_writer_the_cache_cannot_name_is_not_trusted(
    cache: Cache, hub_server: HubServer, tmp_path: Path
) -> None:
    # S3: published without a writer folder (as before writers were recorded, or by hand); the Hub: a
    # commit whose author the Hub does not report
    if cache.kind == "s3":
        anonymous = open_remote(cache.url)
        _publish(anonymous, tmp_path, "MODULE_3+aaaa", b"NEFF")
    else:
        hub_server.plant(
            cache.url[len("hf://") :],
            {
                f"{neuron.entry_key(VERSION, 'MODULE_3+aaaa')}/model.neff": b"NEFF",
                f"{neuron.entry_key(VERSION, 'MODULE_3+aaaa')}/model.done": b"",
            },
            author="",
        )
    report = sync.restore(
        cache.remote, tmp_path / "job", VERSION, progress=False, trust=Trust.parse("team-a")
    )
    assert report.untrusted == {neuron.entry_key(VERSION, "MODULE_3+aaaa"): "unknown"}
    assert report.restored == []
    anyone = sync.restore(cache.remote, tmp_path / "job", VERSION, progress=False, trust=Trust.parse("*"))
    assert anyone.restored == [neuron.entry_key(VERSION, "MODULE_3+aaaa")]


def test_a_writer_name_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError, match="not a writer name"):
        Trust.parse("team-a,../team-b")
    with pytest.raises(ValueError, match="not a writer name"):
        open_remote("s3://bucket/cache", writer="a/b")


def test_a_teams_job_publishes_within_its_role_and_the_same_requests_exceed_another_teams(
    base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    """The job role check is live: a real `sagequeue-job` publishing as team-a has its requests recorded
    (PutObject under `writers/team-a/`) and allowed by team-a's documented role, and the same requests
    judged as team-b's role are refused, naming the statement that grants the writer folder."""
    cache = make_cache("s3", base_env, hub_server)
    train = [str(STANDINS / "standin-train"), "--graphs", "g-team-a", "--steps", "1"]
    job = run_wrapper(
        [
            "run",
            "--cache",
            cache.url,
            "--cache-dir",
            str(tmp_path / "wrapped"),
            "--no-progress",
            "--",
            *train,
        ],
        dict(base_env, SAGEQUEUE_NEFF_CACHE_WRITER="team-a"),
    )
    assert job.returncode == 0, job.stderr
    made = job_requests_in(Path(base_env[iam_check.JOB_LOG_ENV]))
    puts = [r for r in made if r.operation == "PutObject"]
    assert any("/writers/team-a/" in str(r.params.get("Key")) for r in puts), made
    assert {r.writer for r in made} == {"team-a"}
    where = iam_check.Where("us-east-1", iam_check.DEFAULT_ACCOUNT)
    assert iam_check.job_denials(made, where) == []
    as_team_b = [replace(r, writer="team-b") for r in made]
    refused = iam_check.job_denials(as_team_b, where)
    assert refused
    assert all("the job role of team team-b" in m and "s3:PutObject" in m for m in refused), refused
    assert any("/writers/team-a/" in m and "WriteOwnFolderOnly" in m for m in refused), refused
