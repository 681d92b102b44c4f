"""A small blocking client of the registry's REST API (the standard library's urllib: no
client library needed), for `kafscale schemas` and the console's schema pages."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class RegistryClientError(Exception):
    """The registry refused (its message, HTTP status and error_code), or could not be
    reached (`unreachable`)."""

    def __init__(self, message: str, status: int = 0, error_code: int | None = None, unreachable: bool = False):
        super().__init__(message)
        self.status = status
        self.error_code = error_code
        self.unreachable = unreachable


class RegistryClient:
    def __init__(self, url: str, user_info: str | None = None, ca: str | None = None, timeout: float = 10.0):
        self.url = url.rstrip("/")
        self.user_info = user_info  # USER:PASSWORD for HTTP basic auth
        self.context = ssl.create_default_context(cafile=ca) if ca else None
        self.timeout = timeout

    def call(self, method: str, path: str, body=None, query: dict | None = None):
        """The registry's JSON answer (text when it is not JSON). Raises RegistryClientError."""
        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers={"Accept": CONTENT_TYPE, "Content-Type": CONTENT_TYPE})
        if self.user_info:
            req.add_header("Authorization", "Basic " + base64.b64encode(self.user_info.encode()).decode())
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.context) as resp:
                text = resp.read()
        except urllib.error.HTTPError as e:
            try:
                doc = json.loads(e.read())
                raise RegistryClientError(f"{doc.get('message')} (error_code {doc.get('error_code')})", e.code, doc.get("error_code")) from None
            except (ValueError, AttributeError):
                raise RegistryClientError(f"HTTP {e.code} from {url}", e.code) from None
        except (urllib.error.URLError, OSError) as e:
            raise RegistryClientError(f"cannot reach the schema registry at {self.url}: {getattr(e, 'reason', e)}", unreachable=True) from None
        try:
            return json.loads(text)
        except ValueError:
            return text.decode()

    @staticmethod
    def quote(subject: str) -> str:
        return urllib.parse.quote(subject, safe="")

    def latest_versions(self, prefix: str = "", deleted: bool = False) -> list[dict]:
        """Each subject's latest version ({subject, version, id, schema, ...})."""
        return self.call("GET", "/schemas", query={"subjectPrefix": prefix, "deleted": str(deleted).lower(), "latestOnly": "true"})

    def versions(self, subject: str, deleted: bool = False) -> list[int]:
        return self.call("GET", f"/subjects/{self.quote(subject)}/versions", query={"deleted": str(deleted).lower()})

    def version(self, subject: str, version="latest", deleted: bool = False) -> dict:
        return self.call("GET", f"/subjects/{self.quote(subject)}/versions/{version}", query={"deleted": str(deleted).lower()})

    def compatibility_level(self, subject: str | None = None) -> str:
        path = "/config" + (f"/{self.quote(subject)}" if subject else "")
        return self.call("GET", path, query={"defaultToGlobal": "true"})["compatibilityLevel"]
