"""`sagequeue teams`, `sagequeue quota` and the team in `ls`, as a user runs them against a local stack."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_cli import POOL, request, sagequeue

from sagequeue.config import save_local_connection
from sagequeue.local import LocalStack


@pytest.fixture(scope="module")
def stack() -> Iterator[Any]:
    with LocalStack(settings={"capacity": {POOL: 4}}, teams={"user": "vision"}) as running:
        yield running


@pytest.fixture(scope="module")
def home(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("user-home")
    save_local_connection(stack.connection(), path / "local.json")
    return path


def admin_env(stack: Any) -> dict[str, str]:
    admin = stack.identity("admin")
    return {
        "AWS_ACCESS_KEY_ID": admin.access_key_id,
        "AWS_SECRET_ACCESS_KEY": admin.secret_access_key,
        "AWS_SESSION_TOKEN": "",
        "AWS_SECURITY_TOKEN": "",
    }


def test_quota_teams_and_ls_show_who_holds_what(stack: Any, home: Path, tmp_path: Path) -> None:
    # GIVEN no quotas, `teams` says how to set one, and a user may not set one
    none = sagequeue("teams", home=home)
    assert none.code == 0, none.err
    assert "sagequeue quota TEAM POOL N" in none.out
    refused = sagequeue("quota", "vision", POOL, "2", home=home)
    assert refused.code != 0
    assert "only an admin may set a team's quota" in refused.err
    # WHEN an admin sets two quotas, one lending nothing
    env = admin_env(stack)
    endpoint = ("--endpoint", stack.endpoint)
    set_a = sagequeue("quota", "vision", POOL, "2", "--borrow-limit", "1", *endpoint, home=tmp_path, env=env)
    assert set_a.code == 0, set_a.err
    assert "vision" in set_a.out
    set_b = sagequeue(
        "quota", "speech", POOL, "2", "--lend-limit", "0", "--json", *endpoint, home=tmp_path, env=env
    )
    assert set_b.code == 0, set_b.err
    assert set_b.json["lending_limit"] == 0
    # AND vision submits four jobs
    queue = stack.client()
    for i in range(4):
        queue.submit(request(stack, f"vision-{i}", Tags=[{"Key": "team", "Value": "vision"}]))
    stack.run_until_idle()
    # THEN vision runs its two, borrows nothing (speech lends nothing), and two wait naming the quota
    listed = sagequeue("teams", "--json", home=home)
    assert listed.code == 0, listed.err
    rows = {(r["team"], r["pool"]): r for r in listed.json["teams"]}
    vision = rows[("vision", POOL)]
    assert (vision["nominal"], vision["used"], vision["borrowed"], vision["waiting"]) == (2, 2, 0, 2)
    assert rows[("speech", POOL)]["lent"] == 0
    table = sagequeue("teams", home=home).out.splitlines()
    assert table[0].split() == [
        "TEAM",
        "POOL",
        "NOMINAL",
        "BORROW_LIMIT",
        "LEND_LIMIT",
        "USED",
        "BORROWED",
        "LENT",
        "WAITING",
    ]
    assert table[1].split() == ["speech", POOL, "2", "-", "0", "0", "0", "0", "0"]
    assert table[2].split() == ["vision", POOL, "2", "1", "-", "2", "0", "0", "2"]
    ls = sagequeue("ls", home=home)
    assert ls.code == 0, ls.err
    assert "TEAM" in ls.out.splitlines()[0]
    assert all("vision" in line for line in ls.out.splitlines()[1:])
    assert "team vision at its quota of 2" in ls.out
    # AND a bad quota is refused with one clear line
    bad = sagequeue("quota", "vision", "ml.p5.48xlarge", "1", *endpoint, home=tmp_path, env=env)
    assert bad.code != 0
    assert "not a pool sagequeue manages" in bad.err
    assert "Traceback" not in bad.out + bad.err


def test_quota_says_when_quotas_sum_above_the_pool_and_refuses_bad_team_names(
    stack: Any, home: Path, tmp_path: Path
) -> None:
    env = admin_env(stack)
    endpoint = ("--endpoint", stack.endpoint)
    # GIVEN quotas that fill the pool of 4 (vision 2, speech 2; set here too, so the test stands alone)
    for team in ("vision", "speech"):
        assert sagequeue("quota", team, POOL, "2", *endpoint, home=tmp_path, env=env).code == 0
    # WHEN an admin gives a third team a quota of 1
    above = sagequeue("quota", "audio", POOL, "1", *endpoint, home=tmp_path, env=env)
    # THEN it is set, the table shows it, and a warning on stderr says the quotas sum above the pool
    assert above.code == 0, above.err
    assert above.out.splitlines()[1].split()[:3] == ["audio", POOL, "1"]
    assert above.err.strip() == (
        f"warning: the nominal quotas of all teams in {POOL} sum to 5, above its capacity of 4: "
        "not every team can hold its nominal quota at once"
    )
    as_json = sagequeue("quota", "audio", POOL, "1", "--json", *endpoint, home=tmp_path, env=env)
    assert as_json.json["warning"].startswith(f"the nominal quotas of all teams in {POOL} sum to 5")
    # AND `teams` says it once, below the table
    listed = sagequeue("teams", home=home)
    assert listed.code == 0, listed.err
    assert listed.err.count("warning: ") == 1
    # WHEN the third quota is lowered to 0, the quotas fit again: no warning
    fits = sagequeue("quota", "audio", POOL, "0", *endpoint, home=tmp_path, env=env)
    assert (fits.code, fits.err) == (0, "")
    # AND team names that would break the table's columns, a URL or the word for jobs without a team are
    # refused as usage errors naming the rule, before any request
    for team, rule in [
        ("none", "TEAM: team name 'none' is reserved: 'none' stands for jobs without a team"),
        ("..", "TEAM: team name '..' must start with a letter or a digit"),
        ("a b", "TEAM: team name 'a b' may hold only ASCII letters, digits, '-', '_' and '.'"),
    ]:
        bad = sagequeue("quota", team, POOL, "1", *endpoint, home=tmp_path, env=env)
        assert (bad.code, bad.err.strip()) == (2, f"error: {rule}")
    rows = sagequeue("teams", "--json", home=home).json["teams"]
    assert sorted(r["team"] for r in rows) == ["audio", "speech", "vision"]


def test_quota_remove_takes_out_a_quota_stored_under_a_name_the_rule_now_refuses(
    stack: Any, home: Path, tmp_path: Path
) -> None:
    env = admin_env(stack)
    endpoint = ("--endpoint", stack.endpoint)
    # GIVEN a quota stored before the team-name rule under "-ops" (the item as the API then wrote it)
    stack.aws_client("dynamodb").put_item(
        TableName=stack.settings.table_name,
        Item={"pk": {"S": "POOLS"}, "sk": {"S": f"TEAM#-ops#{POOL}"}, "nominal": {"N": "1"}},
    )
    assert "-ops" in {r["team"] for r in sagequeue("teams", "--json", home=home).json["teams"]}
    # WHEN an admin sets it, THEN the rule refuses it before any request
    refused = sagequeue("quota", *endpoint, "--", "-ops", POOL, "2", home=tmp_path, env=env)
    assert (refused.code, refused.err.strip()) == (
        2,
        "error: TEAM: team name '-ops' must start with a letter or a digit",
    )
    # WHEN a user who is not an admin removes it, THEN the API refuses
    user = sagequeue("quota", "--remove", "--", "-ops", POOL, home=home)
    assert user.code != 0
    assert "only an admin may set a team's quota" in user.err
    # WHEN an admin removes it
    removed = sagequeue("quota", "--remove", *endpoint, "--", "-ops", POOL, home=tmp_path, env=env)
    # THEN it is gone, and `teams` no longer lists it
    assert (removed.code, removed.out.strip()) == (0, f"removed the quota of team -ops in {POOL}"), (
        removed.err
    )
    assert "-ops" not in {r["team"] for r in sagequeue("teams", "--json", home=home).json["teams"]}
    # AND removing it again answers the rule and that nothing is stored, in one line
    again = sagequeue("quota", "--remove", *endpoint, "--", "-ops", POOL, home=tmp_path, env=env)
    assert again.code != 0
    assert again.err.strip().endswith(
        f"team: team name '-ops' must start with a letter or a digit; no quota of team '-ops' in {POOL} is "
        "stored to remove"
    )
    assert len(again.err.strip().splitlines()) == 1
    # AND --remove goes alone, N without --remove is required, and '..' never reaches a URL
    for args, message in [
        (("vision", POOL, "2", "--remove"), "error: --remove takes no N, --borrow-limit or --lend-limit"),
        (
            ("vision", POOL),
            "error: N is required: instances guaranteed to TEAM (or --remove to remove its quota)",
        ),
        (
            ("..", POOL, "--remove"),
            "error: TEAM: team name '..' cannot be sent in a URL: it is a path's dot segment",
        ),
        (
            ("a b", POOL, "--remove"),
            "error: TEAM: team name 'a b' may hold only ASCII letters, digits, '-', '_' and '.'",
        ),
    ]:
        bad = sagequeue("quota", *args, *endpoint, home=tmp_path, env=env)
        assert (bad.code, bad.err.strip()) == (2, message)
    # AND a quota under a name the rule accepts is removed the same way
    assert sagequeue("quota", "audio", POOL, "1", *endpoint, home=tmp_path, env=env).code == 0
    gone = sagequeue("quota", "audio", POOL, "--remove", "--json", *endpoint, home=tmp_path, env=env)
    assert (gone.code, gone.json["removed"]) == (0, True), gone.err
    assert "audio" not in {r["team"] for r in sagequeue("teams", "--json", home=home).json["teams"]}
    # AND removing it again says there was nothing to remove, not that it removed something
    again = sagequeue("quota", "audio", POOL, "--remove", *endpoint, home=tmp_path, env=env)
    assert (again.code, again.out.strip()) == (0, f"team audio had no quota in {POOL}: nothing to remove")
