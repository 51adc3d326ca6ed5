"""`sagequeue ls`, `show` and `pools` when SageMaker, not the pool, is short (docs/adr/0017): a job accepted
but waiting for EC2 capacity says so, with since when; the warm-pool quota SageMaker showed is listed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_cli import POOL, request, sagequeue, unique

from sagequeue.config import save_local_connection
from sagequeue.local import LocalStack


@pytest.fixture(scope="module")
def stack() -> Iterator[Any]:
    # GIVEN a pool of 2 in a region that can launch 1 for the account
    with LocalStack(settings={"capacity": {POOL: 2}}, emulator={"capacity": {POOL: 1}}) as running:
        yield running


def test_ls_and_show_say_a_job_waits_for_ec2_capacity(stack: Any, tmp_path: Path) -> None:
    home = tmp_path / "home"
    save_local_connection(stack.connection(), home / "local.json")
    queue = stack.client()
    first, second = unique("first"), unique("second")
    queue.submit(request(stack, first), priority=5)
    queue.submit(request(stack, second), priority=5)
    stack.advance(60)
    table = sagequeue("ls", "--format", "name,state,reason", home=home)
    assert table.code == 0, table.err
    (line,) = [row for row in table.out.splitlines() if row.startswith(second)]
    assert "starting" in line
    assert "waiting for EC2 capacity since" in line
    shown = sagequeue("show", second, home=home)
    assert shown.code == 0, shown.err
    assert "waiting for EC2 capacity since" in shown.out
    pools = sagequeue("pools", home=home)
    assert pools.code == 0, pools.err
    assert "WARM_QUOTA" in pools.out.splitlines()[0]
