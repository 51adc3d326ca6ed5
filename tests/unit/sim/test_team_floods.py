"""Equal-priority floods from two teams in the simulator: usage converges to each team's share."""

from __future__ import annotations

from collections import Counter

from sagequeue.sim.engine import SimSettings, Simulation
from sagequeue.sim.metrics import summarize, team_usage_by_interval
from sagequeue.sim.schedulers import SagequeuePolicy
from sagequeue.sim.trace import Trace, TraceJob
from sagequeue_core.quotas import TeamQuota

POOL = "ml.trn1.32xlarge"
HOUR = 3600.0


def flood(team: str, start: float, jobs: int) -> list[TraceJob]:
    return [
        TraceJob(
            name=f"{team}-{i}",
            submit_seconds=start + i,
            priority=5,
            instance_type=POOL,
            instance_count=1,
            duration_seconds=HOUR,
            checkpoint_minutes=10.0,
            team=team,
        )
        for i in range(jobs)
    ]


def run(
    quotas: tuple[TeamQuota, ...], jobs: list[TraceJob], until: float, policy: SagequeuePolicy | None = None
) -> tuple[list[Counter[str]], dict[str, object]]:
    """Instance-seconds each team held, per hour of the simulation, and the run's summary."""
    sim = Simulation(
        Trace(tuple(jobs)),
        policy or SagequeuePolicy(),
        SimSettings(capacity={POOL: 4}, team_quotas=quotas, min_runtime_before_preemption_seconds=600),
        horizon_seconds=until,
    )
    recorder = sim.run()
    hours = [Counter(h) for h in team_usage_by_interval(recorder, HOUR)]
    return hours, summarize(recorder, stop_grace_seconds=120, provisioning_seconds=480)


def test_a_flood_that_borrowed_everything_gives_back_half_when_the_other_team_floods() -> None:
    # GIVEN quotas of 2 + 2 on a pool of 4, team a floods first and borrows the whole pool
    quotas = (TeamQuota("a", POOL, 2), TeamQuota("b", POOL, 2))
    hours, summary = run(quotas, flood("a", 0, 60) + flood("b", 2 * HOUR, 60), until=14 * HOUR)
    assert hours[1]["a"] == 4 * HOUR  # alone, a holds all four
    # WHEN b floods at equal priority, THEN from the next hour on the pool is shared 50/50
    for hour in hours[4:12]:
        assert hour["a"] == hour["b"] == 2 * HOUR, hour
    # AND the report has per-team waits and usage
    by_team = summary["by_team"]
    assert isinstance(by_team, dict)
    assert set(by_team) == {"a", "b"}
    assert by_team["a"]["jobs"] == by_team["b"]["jobs"] == 60
    assert by_team["a"]["usage_share"] > by_team["b"]["usage_share"]  # a's two hours alone
    assert by_team["b"]["wait"]["n"] == 60


def test_without_nominal_quotas_fair_share_alone_converges_to_half_each() -> None:
    # GIVEN both teams with a nominal quota of 0 (nothing guaranteed, everything borrowed): only fair share
    # orders them, and team a floods two hours before team b
    quotas = (TeamQuota("a", POOL, 0), TeamQuota("b", POOL, 0))
    policy = SagequeuePolicy()
    hours, _ = run(quotas, flood("a", 0, 80) + flood("b", 2 * HOUR, 80), until=16 * HOUR, policy=policy)
    # THEN b, which used nothing, goes first when it arrives, even though a's flood fills the pool's window
    assert hours[2]["b"] > hours[2]["a"]
    # AND once b has caught up with a's head start, the pool is shared 50/50 over the following hours
    # (hour by hour it swings: all jobs last an hour, and the team behind takes each round), and the
    # decayed usage counters come within a tenth of each other
    later = sum(hours[4:16], Counter[str]())
    assert abs(later["a"] - later["b"]) <= 0.1 * (later["a"] + later["b"]), later
    assert policy.usage is not None
    counters = policy.usage.hours
    assert abs(counters["a"] - counters["b"]) <= 0.1 * max(counters.values()), counters


def test_without_teams_the_report_is_unchanged() -> None:
    jobs = [TraceJob(f"j{i}", float(i), 5, POOL, 1, HOUR) for i in range(6)]
    sim = Simulation(Trace(tuple(jobs)), SagequeuePolicy(), SimSettings(capacity={POOL: 4}))
    recorder = sim.run()
    assert "by_team" not in summarize(recorder, stop_grace_seconds=120, provisioning_seconds=480)
    assert recorder.team_timeline == []


def test_traces_carry_teams_and_the_cli_reads_team_quotas() -> None:
    import pytest

    from sagequeue.sim.cli import BadInput, parse_team_quota
    from sagequeue.sim.trace import TraceError, parse_jsonl

    trace = Trace((*flood("vision", 0, 2), TraceJob("anon", 5.0, 5, POOL, 1, HOUR)))
    again = parse_jsonl(trace.to_jsonl())
    assert [j.team for j in again.jobs] == ["vision", "vision", None]
    with pytest.raises(TraceError, match="team name 'a b'"):
        parse_jsonl(
            '{"submit": 0, "priority": 1, "instance_type": "ml.trn1.32xlarge", '
            '"instance_count": 1, "duration_seconds": 60, "team": "a b"}\n'
        )
    assert parse_team_quota("vision/ml.trn1.32xlarge=2,borrow=1,lend=0") == TeamQuota("vision", POOL, 2, 1, 0)
    assert parse_team_quota("vision/plan:my-plan=3") == TeamQuota("vision", "plan:my-plan", 3)
    for bad in (
        "vision=2",
        "vision/ml.trn1.32xlarge=two",
        "vision/ml.trn1.32xlarge=2,steal=1",
        "vision/ml.trn1.32xlarge=2,borrow=1,borrow=2",
    ):
        with pytest.raises(BadInput, match="--team-quota"):
            parse_team_quota(bad)


def test_team_quota_flags_that_cannot_be_are_refused_naming_the_flag() -> None:
    import pytest

    from sagequeue.sim.cli import BadInput, parse_team_quota

    for bad, problem in [
        ("vision/ml.trn1.32xlarge=-1", "N must not be negative, got -1"),
        ("vision/ml.trn1.32xlarge=2,borrow=-3", "borrow must not be negative, got -3"),
        ("vision/ml.trn1.32xlarge=2,lend=1.5", "lend must be a whole number of instances, got '1.5'"),
        ("vision/=2", "must be TEAM/TYPE=N"),
        ("/ml.trn1.32xlarge=2", "a team name is 1 to 64 characters, got ''"),
        ("none/ml.trn1.32xlarge=2", "team name 'none' is reserved"),
        ("../ml.trn1.32xlarge=2", "team name '..' must start with a letter or a digit"),
    ]:
        with pytest.raises(BadInput) as refused:
            parse_team_quota(bad)
        assert str(refused.value).startswith(f"--team-quota {bad!r}: {problem}")


def test_the_simulate_command_checks_team_quotas_against_the_runs_pools() -> None:
    from click.testing import CliRunner

    from sagequeue.cli import main

    def simulate(*quotas: str) -> tuple[int, str, str]:
        flags = [f"--team-quota={q}" for q in quotas]
        args = ["simulate", "--capacity", f"{POOL}=4", *flags, "--jobs", "4", "--days", "1"]
        result = CliRunner().invoke(main, [*args, "--policies", "sagequeue", "--drain-days", "1"])
        return result.exit_code, result.stdout, result.stderr

    error = "sagequeue simulate: error: "
    # an unknown pool, a quota no team could hold, a limit above the pool, a team given twice: refused
    for quotas, problem in [
        (
            ["a/ml.trn2.48xlarge=1"],
            f"--team-quota a/ml.trn2.48xlarge: ml.trn2.48xlarge is not a pool of the run "
            f"(--capacity: {POOL}=4)",
        ),
        ([f"a/{POOL}=5"], f"--team-quota a/{POOL}: N=5 is above the pool's capacity of 4"),
        (
            [f"a/{POOL}=2,borrow=100"],
            f"--team-quota a/{POOL}: borrow=100 is above the pool's capacity of 4; "
            "leave borrow= out for no limit",
        ),
        ([f"a/{POOL}=1", f"a/{POOL}=2"], f"--team-quota a/{POOL}: given twice; one quota per team and pool"),
        ([f"a/{POOL}=-1"], f"--team-quota 'a/{POOL}=-1': N must not be negative, got -1"),
    ]:
        code, out, err = simulate(*quotas)
        assert (code, out, err.strip()) == (2, "", error + problem)
    # quotas that sum above the pool run, with a note that says so
    code, out, err = simulate(f"a/{POOL}=3", f"b/{POOL}=2")
    assert code == 0, err
    assert out.splitlines()[-1] == (
        f"note: the nominal quotas of all teams in {POOL} sum to 5, above its capacity of 4: "
        "not every team can hold its nominal quota at once"
    )
