"""Which remote cache backend a URL names.

Kept apart from `remote` (the interface both backends implement), so the backends import the interface and
nothing imports back: `remote` <- `hub`, `s3` <- `backends`.
"""

from __future__ import annotations

from typing import Any

from sagequeue.job.remote import RemoteCache


def open_remote(url: str, **options: Any) -> RemoteCache:
    """The backend for `hf://<org>/<repo>` or `s3://<bucket>/<prefix>`."""
    if url.startswith("hf://"):
        from sagequeue.job.hub import HubCache

        return HubCache(url, **options)
    if url.startswith("s3://"):
        from sagequeue.job.s3 import S3Cache

        return S3Cache(url, **options)
    raise ValueError(f"unknown NEFF cache URL {url!r}: expected hf://<org>/<repo> or s3://<bucket>/<prefix>")
