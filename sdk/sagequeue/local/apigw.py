"""A localhost stand-in for API Gateway's REST API with IAM authorization and Lambda proxy integration.

Each HTTP request is authorized from its SigV4 signature (the access key names a local identity, the
signature is checked with that identity's secret), matched to a route declared by the template's `Api`
events, turned into the proxy event (format 1.0) the `api` function receives on AWS, and answered with the
function's response. Identity travels only in `requestContext.identity`, as on AWS.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.message import Message
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from sagequeue.local.identities import Identity, IdentityTable
from sagequeue.local.template import RouteSpec

logger = logging.getLogger("sagequeue.local.api")

#: Invokes a function of the stack with an event and returns what the handler returned.
Invoker = Callable[[str, dict[str, Any]], Any]

_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256\s+Credential=(?P<key>[^/\s,]+)/(?P<date>\d{8})/(?P<region>[^/]+)/(?P<service>[^/]+)"
    r"/aws4_request,\s*SignedHeaders=(?P<headers>[^,\s]+),\s*Signature=(?P<signature>[0-9a-f]{64})"
)
_MAX_BODY = 10 * 1024 * 1024  # API Gateway's payload limit
#: How far a SigV4 timestamp may be from now, either way, as AWS allows.
SIGNATURE_MAX_AGE = timedelta(minutes=15)


class ApiGatewayError(Exception):
    """A request refused before it reaches the function, as API Gateway refuses it."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


@dataclass(frozen=True)
class Route:
    method: str
    resource: str  # the template's path, e.g. /jobs/{name}
    function: str
    pattern: re.Pattern[str]

    @classmethod
    def from_spec(cls, spec: RouteSpec) -> Route:
        parts = []
        for segment in spec.path.strip("/").split("/"):
            if not segment:
                continue
            match = re.fullmatch(r"\{(\w+)(\+?)\}", segment)
            if match and match.group(2):
                parts.append(f"(?P<{match.group(1)}>.+)")
            elif match:
                parts.append(f"(?P<{match.group(1)}>[^/]+)")
            else:
                parts.append(re.escape(segment))
        pattern = re.compile("^/" + "/".join(parts) + "/?$")
        return cls(spec.method.upper(), spec.path, spec.function, pattern)


class Router:
    """The API's routes; literal segments win over path parameters, as in API Gateway."""

    def __init__(self, specs: list[RouteSpec]) -> None:
        routes = [Route.from_spec(spec) for spec in specs]
        # A route with fewer parameters is more specific: /jobs/mine before /jobs/{name}.
        self.routes = sorted(routes, key=lambda r: (r.resource.count("{"), -len(r.resource)))

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        allowed: list[str] = []
        for route in self.routes:
            found = route.pattern.match(path)
            if not found:
                continue
            if route.method in (method, "ANY"):
                return route, {key: unquote(value) for key, value in found.groupdict().items()}
            allowed.append(route.method)
        if allowed:
            raise ApiGatewayError(
                405, f"{method} is not allowed on {path}; allowed: {', '.join(sorted(allowed))}", "NotFound"
            )
        known = ", ".join(sorted({f"{r.method} {r.resource}" for r in self.routes}))
        raise ApiGatewayError(404, f"no route for {method} {path}; the API has {known}", "NotFound")


@dataclass(frozen=True)
class SignedRequest:
    method: str
    raw_path: str
    raw_query: str
    headers: Mapping[str, str]  # lower-case names
    body: bytes


def authorize(
    request: SignedRequest,
    identities: IdentityTable,
    region: str,
    *,
    wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> Identity:
    """The identity whose secret signed `request`, or ApiGatewayError(403) saying what is wrong.

    As API Gateway does: the signature is at most SIGNATURE_MAX_AGE old (or ahead), on the wall clock (not
    the stack's virtual one: clients sign with real time), and a signed body hash must be the body's."""
    header = request.headers.get("authorization")
    if not header:
        raise ApiGatewayError(403, "Missing Authentication Token: sign the request with SigV4", "Forbidden")
    found = _AUTHORIZATION.match(header)
    if not found:
        raise ApiGatewayError(
            403,
            "Authorization header is not a SigV4 signature (AWS4-HMAC-SHA256 Credential=...)",
            "Forbidden",
        )
    identity = identities.by_key(found.group("key"))
    if identity is None:
        raise ApiGatewayError(
            403,
            f"The security token included in the request is invalid: access key {found.group('key')} is not "
            "a local identity (see `sagequeue local` output)",
            "Forbidden",
        )
    if found.group("service") != "execute-api":
        raise ApiGatewayError(
            403,
            f"Credential should be scoped to service 'execute-api', not '{found.group('service')}'",
            "Forbidden",
        )
    if found.group("region") != region:
        raise ApiGatewayError(
            403, f"Credential should be scoped to a valid region: expected '{region}'", "Forbidden"
        )
    timestamp = request.headers.get("x-amz-date", "")
    if not timestamp.startswith(found.group("date")):
        raise ApiGatewayError(403, "X-Amz-Date is missing or does not match the credential date", "Forbidden")
    try:
        signed_at = datetime.strptime(timestamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise ApiGatewayError(
            403, f"X-Amz-Date {timestamp!r} is not of the form YYYYMMDDTHHMMSSZ", "Forbidden"
        ) from None
    skew = abs(wall_clock() - signed_at)
    if skew > SIGNATURE_MAX_AGE:
        raise ApiGatewayError(
            403,
            f"Signature expired: {timestamp} is more than {int(SIGNATURE_MAX_AGE.total_seconds() // 60)} "
            "minutes from the current time",
            "Forbidden",
        )
    # SigV4 signs X-Amz-Content-Sha256 in place of the body when the header is present: the body must be
    # the one it names, or a body swapped after signing would pass.
    declared = request.headers.get("x-amz-content-sha256")
    if declared is not None and declared.lower() != hashlib.sha256(request.body or b"").hexdigest():
        raise ApiGatewayError(
            403, "The provided X-Amz-Content-Sha256 header does not match what was computed", "Forbidden"
        )
    expected = _signature(request, identity, found.group("headers").split(";"), region, timestamp)
    if not hmac.compare_digest(expected, found.group("signature")):
        raise ApiGatewayError(
            403,
            "The request signature we calculated does not match the signature you provided. "
            "Check your AWS Secret Access Key and signing method.",
            "Forbidden",
        )
    return identity


def _signature(
    request: SignedRequest, identity: Identity, signed_headers: list[str], region: str, timestamp: str
) -> str:
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    host = request.headers.get("host", "localhost")
    url = f"http://{host}{request.raw_path}" + (f"?{request.raw_query}" if request.raw_query else "")
    # Only what the client signed takes part; proxies and HTTP clients add headers after signing.
    headers = {name: request.headers.get(name, "") for name in signed_headers}
    aws_request = AWSRequest(method=request.method, url=url, data=request.body or b"", headers=headers)
    aws_request.context["timestamp"] = timestamp
    signer = SigV4Auth(Credentials(identity.access_key_id, identity.secret_access_key), "execute-api", region)
    canonical = signer.canonical_request(aws_request)
    return str(signer.signature(signer.string_to_sign(aws_request, canonical), aws_request))


def proxy_event(
    request: SignedRequest,
    *,
    route: Route,
    path: str,
    path_parameters: Mapping[str, str],
    identity: Identity,
    source_ip: str,
    api_id: str,
    stage: str,
    account_id: str,
    now: datetime,
    header_pairs: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """The API Gateway REST proxy event (payload format 1.0) for one request."""
    pairs = header_pairs if header_pairs is not None else list(request.headers.items())
    headers: dict[str, str] = {}
    multi_headers: dict[str, list[str]] = {}
    for name, value in pairs:
        headers[name] = value
        multi_headers.setdefault(name, []).append(value)
    query_pairs = parse_qsl(request.raw_query, keep_blank_values=True)
    query: dict[str, str] = {}
    multi_query: dict[str, list[str]] = {}
    for name, value in query_pairs:
        query[name] = value
        multi_query.setdefault(name, []).append(value)
    body: str | None
    encoded = False
    if not request.body:
        body = None
    else:
        try:
            body = request.body.decode("utf-8")
        except UnicodeDecodeError:
            body = base64.b64encode(request.body).decode()
            encoded = True
    request_id = str(uuid.uuid4())
    epoch_ms = int(now.timestamp() * 1000)
    user_agent = headers.get("User-Agent") or headers.get("user-agent")
    return {
        "resource": route.resource,
        "path": path,
        "httpMethod": request.method,
        "headers": headers or None,
        "multiValueHeaders": multi_headers or None,
        "queryStringParameters": query or None,
        "multiValueQueryStringParameters": multi_query or None,
        "pathParameters": dict(path_parameters) or None,
        "stageVariables": None,
        "requestContext": {
            "resourceId": route.resource,
            "resourcePath": route.resource,
            "httpMethod": request.method,
            "extendedRequestId": request_id,
            "requestTime": now.astimezone(UTC).strftime("%d/%b/%Y:%H:%M:%S +0000"),
            "requestTimeEpoch": epoch_ms,
            "path": f"/{stage}{path}",
            "accountId": account_id,
            "protocol": "HTTP/1.1",
            "stage": stage,
            "domainPrefix": api_id,
            "domainName": headers.get("Host") or headers.get("host") or "localhost",
            "requestId": request_id,
            "apiId": api_id,
            "identity": {
                "cognitoIdentityPoolId": None,
                "accountId": identity.account_id,
                "cognitoIdentityId": None,
                "caller": identity.caller,
                "sourceIp": source_ip,
                "principalOrgId": None,
                "accessKey": identity.access_key_id,
                "cognitoAuthenticationType": None,
                "cognitoAuthenticationProvider": None,
                "userArn": identity.arn,
                "userAgent": user_agent,
                "user": identity.caller,
            },
        },
        "body": body,
        "isBase64Encoded": encoded,
    }


class LocalApiGateway:
    """Serves the stack's REST API on 127.0.0.1 and hands each request to the function of its route."""

    def __init__(
        self,
        *,
        routes: list[RouteSpec],
        identities: IdentityTable,
        invoke: Invoker,
        region: str,
        account_id: str,
        now: Callable[[], datetime],
        api_id: str = "local",
        stage: str = "prod",
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.router = Router(routes)
        self.identities = identities
        self.invoke = invoke
        self.region = region
        self.account_id = account_id
        self.now = now
        self.api_id = api_id
        self.stage = stage
        self._server = ThreadingHTTPServer((host, port), _make_handler(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="sagequeue-local-api",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def handle(
        self, request: SignedRequest, source_ip: str, header_pairs: list[tuple[str, str]]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """Authorize, route, invoke: the status, headers and body to answer with."""
        try:
            split_path = request.raw_path
            path = unquote(split_path)
            # Accept the stage prefix too (/prod/jobs), as the deployed URL carries it.
            if path == f"/{self.stage}" or path.startswith(f"/{self.stage}/"):
                path = path[len(self.stage) + 1 :] or "/"
            route, parameters = self.router.match(request.method, path)
            identity = authorize(request, self.identities, self.region)
        except ApiGatewayError as exc:
            return _error(exc.status, exc.message, exc.code)
        event = proxy_event(
            request,
            route=route,
            path=path,
            path_parameters=parameters,
            identity=identity,
            source_ip=source_ip,
            api_id=self.api_id,
            stage=self.stage,
            account_id=self.account_id,
            now=self.now(),
            header_pairs=header_pairs,
        )
        try:
            response = self.invoke(route.function, event)
        except Exception:
            logger.exception("function %s failed on %s %s", route.function, request.method, path)
            return _error(
                502, "Internal server error: the function raised; see the local stack's log", "InternalError"
            )
        return _proxy_response(response)


def _error(status: int, message: str, code: str) -> tuple[int, list[tuple[str, str]], bytes]:
    body = json.dumps({"message": message, "code": code}).encode()
    return status, [("Content-Type", "application/json"), ("x-amzn-ErrorType", code)], body


def _proxy_response(response: Any) -> tuple[int, list[tuple[str, str]], bytes]:
    """The HTTP answer for a Lambda proxy response; a malformed one gives 502 as API Gateway does."""
    if not isinstance(response, Mapping) or not isinstance(response.get("statusCode"), int):
        logger.error("malformed Lambda proxy response: %r", response)
        return _error(502, "Malformed Lambda proxy response", "InternalError")
    headers: list[tuple[str, str]] = []
    for name, value in (response.get("headers") or {}).items():
        headers.append((str(name), str(value)))
    for name, values in (response.get("multiValueHeaders") or {}).items():
        for value in values or []:
            if (str(name), str(value)) not in headers:
                headers.append((str(name), str(value)))
    body = response.get("body") or ""
    if not isinstance(body, str):
        logger.error("malformed Lambda proxy response body: %r", body)
        return _error(502, "Malformed Lambda proxy response", "InternalError")
    data = base64.b64decode(body) if response.get("isBase64Encoded") else body.encode("utf-8")
    return int(response["statusCode"]), headers, data


def _make_handler(gateway: LocalApiGateway) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "sagequeue-local"
        # Headers and body go out in two writes; with Nagle on, the body waits for the client's delayed ACK
        # of the headers (about 40 ms on Linux), which was most of every request's time.
        disable_nagle_algorithm = True

        def date_time_string(self, timestamp: float | None = None) -> str:
            # API Gateway's Date is the server's time; here that is the stack's clock (virtual or sped up),
            # so clients that measure waits against it (`sagequeue ls`) agree with the jobs' own times.
            if timestamp is not None:
                return super().date_time_string(timestamp)
            return format_datetime(gateway.now().astimezone(UTC), usegmt=True)

        def _serve(self) -> None:
            started = time.perf_counter()
            split = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            if length > _MAX_BODY:
                status, headers, body = _error(
                    413, "Request Too Long: the body exceeds 10 MB", "ValidationError"
                )
                self.rfile.read(length)
            else:
                raw = self.rfile.read(length) if length else b""
                pairs = _header_pairs(self.headers)
                request = SignedRequest(
                    method=self.command.upper(),
                    raw_path=split.path or "/",
                    raw_query=split.query,
                    headers={name.lower(): value for name, value in pairs},
                    body=raw,
                )
                status, headers, body = gateway.handle(request, self.client_address[0], pairs)
            self.send_response(status)
            for name, value in headers:
                if name.lower() not in ("content-length", "connection"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            logger.debug(
                "%s %s -> %s in %.1f ms",
                self.command,
                self.path,
                status,
                (time.perf_counter() - started) * 1000,
            )

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _serve

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("%s " + format, self.client_address[0], *args)

    return Handler


def _header_pairs(headers: Message) -> list[tuple[str, str]]:
    return [(str(name), str(value)) for name, value in headers.items()]
