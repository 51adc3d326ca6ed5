"""Exemptions from governance: honoured only when an admin granted them.

Anyone with `sagemaker:AddTags` on a training job can tag it exempt, so the tag alone proves nothing: an
exemption counts when an admin submitted the queue entry with the exempt tag (the API refuses that tag from
anyone else) or recorded one through the API. Governance and the idle stop both ask here; the API records
grants here. Light on purpose: each handler that imports it pays only for the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from sagequeue_core.defaults import EXEMPTION_WINDOW_SECONDS
from sagequeue_core.domain import parse_time, tags_to_dict
from sagequeue_core.events import EventType, Publisher
from sagequeue_core.observability import logger
from sagequeue_core.store import Repository

EXEMPTION_CLAIM = "exemption"  # an admin exempted this training job (recorded by the API)
#: an admin exempted this queue entry (recorded by the API): it covers the entry's current attempt, whatever
#: its training job name (`<job>--<n>`, a fallback name), and no other training job of the entry's name
ENTRY_EXEMPTION_CLAIM = "exemption-entry"
IGNORED_EXEMPTION_CLAIM = "governance-exemption-ignored"  # reported once per training job
#: the one training job a grant by training job name covers, by its CreationTime: bound when the grant is
#: made if the job exists then, else by the first job of that name governance or the idle stop meets
EXEMPTION_BOUND_CLAIM = "exemption-bound"


def exemption_granted(
    store: Repository, training_job_name: str, exempt_tag: str, created: datetime | None = None
) -> bool:
    """Whether an admin exempted this training job (created at `created`, its CreationTime): an admin
    submitted the queue entry whose current attempt it is with the exempt tag (the API refuses that tag
    from anyone else) or exempted that entry through the API, or an admin exempted this very training job
    by its name (one that is no queue entry's name; see `name_grant_covers`)."""
    job = store.find_job_by_training_job(training_job_name)
    if job is not None:
        if is_exempt_tagged(tags_to_dict(job.request.get("Tags")), exempt_tag):
            return True
        if store.get_claim(ENTRY_EXEMPTION_CLAIM, job.name) is not None:
            return True
    elif store.find_job(training_job_name) is not None:
        # A training job named like a queue entry, and not its attempt: someone else's (created ahead under
        # the entry's name). A grant of that name was the entry's.
        return False
    grant = store.get_claim(EXEMPTION_CLAIM, training_job_name)
    return grant is not None and name_grant_covers(store, training_job_name, grant, created)


def name_grant_covers(
    store: Repository, training_job_name: str, grant: Mapping[str, object], created: datetime | None
) -> bool:
    """Whether a grant by training job name covers the training job of that name created at `created`.

    A name is not a job: SageMaker frees a name when its training job is deleted, and anyone allowed
    CreateTrainingJob can create a job under a name an admin exempted ahead of it. So a grant covers one
    training job, told by its CreationTime: the job that had the name when the grant was made, or, when
    none had, the first job of that name met after the grant that was created within
    EXEMPTION_WINDOW_SECONDS of it. The binding is a conditional write, so two handlers meeting two jobs
    bind one. A job whose creation time is unknown is not covered."""
    if created is None:
        return False
    bound = grant.get("creation_time") or (
        store.get_claim(EXEMPTION_BOUND_CLAIM, training_job_name) or {}
    ).get("creation_time")
    if bound is None:
        granted = parse_time(grant.get("at"))
        if granted is None or created > granted + timedelta(seconds=EXEMPTION_WINDOW_SECONDS):
            return False
        store.claim(EXEMPTION_BOUND_CLAIM, training_job_name, {"creation_time": created.isoformat()})
        bound = (store.get_claim(EXEMPTION_BOUND_CLAIM, training_job_name) or {}).get("creation_time")
    return parse_time(bound) == created


def is_exempt_tagged(tags: Mapping[str, str], exempt_tag: str) -> bool:
    return tags.get(exempt_tag, "").strip().lower() == "true"


def honoured_tags(
    store: Repository,
    publisher: Publisher,
    training_job_name: str,
    tags: Mapping[str, str],
    exempt_tag: str,
    created: datetime | None = None,
) -> dict[str, str]:
    """The job's tags as governance may trust them: an exempt tag that no admin granted is dropped (anyone
    with sagemaker:AddTags on the job can set it), and reported once. `created` is the training job's
    CreationTime, which tells which job of its name a grant by name covers."""
    trusted = dict(tags)
    if not is_exempt_tagged(trusted, exempt_tag) or exemption_granted(
        store, training_job_name, exempt_tag, created
    ):
        return trusted
    del trusted[exempt_tag]
    record = {"training_job_name": training_job_name, "tag": exempt_tag, "reason": "exemption not granted"}
    if store.claim(IGNORED_EXEMPTION_CLAIM, training_job_name, record):
        logger.warning("ignoring an exempt tag no admin granted", extra=record)
        publisher.publish(
            EventType.POLICY_VIOLATION,
            {**record, "rules": ["exemption"], "violations": [f"{exempt_tag}=true was not set by an admin"]},
        )
    return trusted


def exemption_claim_kind(store: Repository, name: str) -> str:
    """Where an exemption of `name` is recorded: on the queue entry of that name when there is one (it then
    covers the entry's attempts, not a training job someone else creates under the entry's name), else on
    the training job name."""
    return ENTRY_EXEMPTION_CLAIM if store.find_job(name) is not None else EXEMPTION_CLAIM


def grant_exemption(
    store: Repository, name: str, admin: str, at: datetime, created: datetime | None = None
) -> bool:
    """Record an admin's exemption of a queue entry or training job (False if one was recorded already).
    `created`: the CreationTime of the training job that has the name now, to which a grant by training job
    name is bound (None: no job has it yet; the first created within the window after `at` is covered)."""
    detail = {"by": admin, "at": at.isoformat()}
    kind = exemption_claim_kind(store, name)
    if kind == EXEMPTION_CLAIM and created is not None:
        detail["creation_time"] = created.isoformat()
    return store.claim(kind, name, detail)
