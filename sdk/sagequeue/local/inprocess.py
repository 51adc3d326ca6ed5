"""moto in this process, without HTTP: the AWS requests of the stack's own clients handed to moto's handlers.

`sagequeue demo` runs every AWS call of its stack in one process, and over HTTP most of a call is the trip
through sockets, the HTTP server, Flask and moto's host dispatch rather than moto's own work. An
`InProcessMoto` hooks botocore's `before-send` event of each client it is attached to: a request for the
stack's moto endpoint goes to the handler moto's server would route it to (the same request and response
classes, the same backends, the stack's account), and the answer comes back as the HTTP response botocore
would have parsed. Everything above the transport is unchanged: botocore serializes, signs, retries and
parses as it does over HTTP, and the functions cannot tell.

Only the demo uses it (docs/adr/0013-the-demo-serves-aws-in-process.md); `sagequeue local` and the tests
keep moto's server over real HTTP, which other processes reach.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable
from io import BytesIO
from typing import Any

#: The endpoint an in-process stack gives its clients. `.invalid` never resolves (RFC 2606): a client that
#: was not attached fails at once instead of reaching some other server.
IN_PROCESS_ENDPOINT = "http://moto.sagequeue.invalid"

_Handler = Callable[[Any, str, Any], tuple[int, dict[str, str], Any]]


class ResponseBody(BytesIO):
    """A response body botocore can read or stream."""

    def stream(self, **_: Any) -> Any:
        chunk = self.read()
        while chunk:
            yield chunk
            chunk = self.read()


class InProcessMoto:
    """Serves requests for `endpoint` from moto's backends in this process, in account `account_id`."""

    def __init__(self, account_id: str, region: str, endpoint: str = IN_PROCESS_ENDPOINT) -> None:
        self.account_id = account_id
        self.region = region
        self.endpoint = endpoint.rstrip("/")
        self._routes: dict[str, list[tuple[re.Pattern[str], _Handler]]] = {}
        self._lock = threading.Lock()

    def attach(self, client: Any) -> Any:
        """Serve `client`'s requests for the endpoint in process; returns the client."""
        host = self._host(client.meta.service_model.endpoint_prefix)
        client.meta.events.register("before-send", functools.partial(self._send, host=host))
        return client

    def _host(self, prefix: str) -> str:
        if prefix == "s3":
            return "s3.amazonaws.com"
        return f"{prefix}.{self.region}.amazonaws.com"

    def _send(self, request: Any, host: str, **_: Any) -> Any:
        url = str(request.url)
        if not url.startswith(self.endpoint):
            return None
        from botocore.awsrequest import AWSPreparedRequest, AWSResponse
        from moto.core.exceptions import HTTPException
        from moto.core.request import normalize_request

        aws_url = f"https://{host}{url[len(self.endpoint) :]}"
        headers = request.headers.copy()
        headers["x-moto-account-id"] = self.account_id
        moto_request = normalize_request(
            AWSPreparedRequest(
                method=request.method, url=aws_url, headers=headers, body=request.body, stream_output=False
            )
        )
        handler = self._route(host, aws_url.split("?", 1)[0])
        answer: tuple[Any, Any, Any]
        try:
            answer = handler(moto_request, moto_request.raw_url, moto_request.headers)
        except HTTPException as exc:
            answer = exc.code, exc.get_headers(), exc.get_body()
        status, answer_headers, body = answer
        if isinstance(body, str):
            body = body.encode("utf-8")
        return AWSResponse(aws_url, int(status or 500), dict(answer_headers or {}), ResponseBody(body or b""))

    def _route(self, host: str, clean_url: str) -> _Handler:
        routes = self._routes.get(host)
        if routes is None:
            with self._lock:
                routes = self._routes.get(host) or self._load_routes(host)
                self._routes[host] = routes
        for pattern, handler in routes:
            if pattern.match(clean_url):
                return handler
        raise LookupError(f"moto has no handler for {clean_url}")

    @staticmethod
    def _load_routes(host: str) -> list[tuple[re.Pattern[str], _Handler]]:
        import moto.backend_index as backend_index
        import moto.backends as backends
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.core.base_backend import BackendDict

        base = f"https://{host}"
        service = next(
            (name for name, pattern in backend_index.backend_url_patterns if pattern.match(base)), None
        )
        if service is None:
            raise LookupError(f"moto serves no service at {host}")
        backend_dict: Any = backends.get_backend(service)  # type: ignore[call-overload]
        if isinstance(backend_dict, BackendDict):
            regions = backend_dict[DEFAULT_ACCOUNT_ID]
            backend = regions["us-east-1"] if "us-east-1" in regions else regions["aws"]
        else:
            backend = backend_dict["global"]
        return [(re.compile(url), handler) for url, handler in backend.urls.items()]
