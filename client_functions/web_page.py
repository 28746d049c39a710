"""The web page's files (web/dist, built from web/src by ``make setup``), served by the app's
``GET /api/ui/{*path}`` route as the Functions host serves any HTTP function.

Only a file the build made is ever answered: a path is a sequence of plain names (letters,
digits, ``.``, ``_``, ``-``; no segment empty or starting with a dot, so no ``..``), of a known
type, that resolves inside the folder; anything else is 404, the same answer as a file that is
not there, so the answer tells nothing about the disk. The bundle's names carry their content's
hash, so they are cached for a year as immutable; ``index.html`` names them and is revalidated on
each load (its ETag answers 304), so a new build is seen at once.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote

#: Where the build puts the page: beside the app, so it is deployed with it.
WEB_ROOT = Path(__file__).resolve().parent.parent / "web" / "dist"
INDEX = "index.html"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".woff2": "font/woff2",
}
IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"
#: The page loads only its own files and talks only to this app; tiles arrive as blob: URLs.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'self'; frame-ancestors 'none'"
)
_SEGMENT = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class WebAnswer:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def _not_found() -> WebAnswer:
    return WebAnswer(404, {"Content-Type": "text/plain; charset=utf-8", "Cache-Control": REVALIDATE}, b"not found\n")


def resolve(path: str, root: Path = WEB_ROOT) -> Path | None:
    """The file ``path`` names under ``root``, or None when it names none a browser may have."""
    name = unquote(path or "").strip("/") or INDEX
    segments = name.split("/")
    if not all(_SEGMENT.fullmatch(s) for s in segments) or Path(name).suffix not in CONTENT_TYPES:
        return None
    base = root.resolve()
    found = (base / name).resolve()
    if not found.is_relative_to(base) or not found.is_file():
        return None
    return found


@lru_cache(maxsize=64)
def _read(found: Path, mtime_ns: int) -> tuple[bytes, str]:
    body = found.read_bytes()
    return body, f'"{hashlib.sha256(body).hexdigest()[:32]}"'


def serve(path: str, if_none_match: str | None = None, root: Path = WEB_ROOT) -> WebAnswer:
    """The answer to ``GET /api/ui/{path}``: the file, 304 when ``if_none_match`` names its ETag,
    or 404."""
    found = resolve(path, root)
    if found is None:
        return _not_found()
    body, etag = _read(found, found.stat().st_mtime_ns)
    headers = {
        "Content-Type": CONTENT_TYPES[found.suffix],
        "Cache-Control": REVALIDATE if found.name == INDEX else IMMUTABLE,
        "ETag": etag,
        "X-Content-Type-Options": "nosniff",
    }
    if found.suffix == ".html":
        headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    if if_none_match and etag in (tag.strip() for tag in if_none_match.split(",")):
        return WebAnswer(304, headers)
    return WebAnswer(200, headers, body)
