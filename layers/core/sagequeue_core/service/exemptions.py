"""Exemptions from governance: honoured only when an admin granted them.

Anyone with `sagemaker:AddTags` on a training job can tag it exempt, so the tag alone proves nothing: an
exemption counts when an admin submitted the queue entry with the exempt tag (the API refuses that tag from
anyone else) or recorded one through the API. Governance and the idle stop both ask here; the API records
grants here. Light on purpose: each handler that imports it pays only for the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from sagequeue_core.domain import tags_to_dict
from sagequeue_core.events import EventType, Publisher
from sagequeue_core.observability import logger
from sagequeue_core.store import Repository

EXEMPTION_CLAIM = "exemption"  # an admin exempted this training job (recorded by the API)
#: an admin exempted this queue entry (recorded by the API): it covers the entry's current attempt, whatever
#: its training job name (`<job>--<n>`, a fallback name), and no other training job of the entry's name
ENTRY_EXEMPTION_CLAIM = "exemption-entry"
IGNORED_EXEMPTION_CLAIM = "governance-exemption-ignored"  # reported once per training job


def exemption_granted(store: Repository, training_job_name: str, exempt_tag: str) -> bool:
    """Whether an admin exempted this training job: an admin submitted the queue entry whose current attempt
    it is with the exempt tag (the API refuses that tag from anyone else) or exempted that entry through the
    API, or an admin exempted this very training job by its name (one that is no queue entry's name)."""
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
    return store.get_claim(EXEMPTION_CLAIM, training_job_name) is not None


def is_exempt_tagged(tags: Mapping[str, str], exempt_tag: str) -> bool:
    return tags.get(exempt_tag, "").strip().lower() == "true"


def honoured_tags(
    store: Repository,
    publisher: Publisher,
    training_job_name: str,
    tags: Mapping[str, str],
    exempt_tag: str,
) -> dict[str, str]:
    """The job's tags as governance may trust them: an exempt tag that no admin granted is dropped (anyone
    with sagemaker:AddTags on the job can set it), and reported once."""
    trusted = dict(tags)
    if not is_exempt_tagged(trusted, exempt_tag) or exemption_granted(store, training_job_name, exempt_tag):
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


def grant_exemption(store: Repository, name: str, admin: str, at: datetime) -> bool:
    """Record an admin's exemption of a queue entry or training job (False if one was recorded already)."""
    return store.claim(exemption_claim_kind(store, name), name, {"by": admin, "at": at.isoformat()})
