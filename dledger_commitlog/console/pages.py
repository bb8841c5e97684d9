"""The web console's pages: the static files of `static/`, served from memory.

Owns `Pages` (the files of the package's `static/` directory, read once when the
console starts, each with its content type) and the routes that serve them: `/`
is the single page (`index.html`), `/static/NAME` its scripts and style sheets.
The page is plain HTML, CSS and hand-written ES modules: no build step, no CDN.

Invariants: only the files found in `static/` at start are served (a name is looked
up, never joined to a path, so no request reaches another file); the page is served
with `PAGE_POLICY`, a Content-Security-Policy that allows scripts, styles and
connections from the console itself only (no inline script or style, no other
origin); the scripts insert every string from the cluster as text, never as HTML.
"""

from __future__ import annotations

from importlib import resources

from dledger_commitlog.console.http import ApiError, Request, Response, Router

PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
INDEX = "index.html"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


def load_static() -> dict[str, tuple[bytes, str]]:
    """The files of this package's `static/` directory by name: (content, content type)."""
    files: dict[str, tuple[bytes, str]] = {}
    for entry in (resources.files("dledger_commitlog.console") / "static").iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in _TYPES:
            files[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return files


class Pages:
    """Serves the console's page and its files."""

    def __init__(self, files: dict[str, tuple[bytes, str]] | None = None) -> None:
        self.files = load_static() if files is None else files
        assert INDEX in self.files, "the console's static/index.html is missing"

    def register(self, router: Router) -> None:
        router.add("GET", "/", self.index)
        router.add_prefix("GET", "/static/", self.static)

    async def index(self, request: Request) -> Response:
        content, kind = self.files[INDEX]
        return Response(200, content, kind, (("Content-Security-Policy", PAGE_POLICY),))

    async def static(self, request: Request) -> Response:
        name = request.params["rest"]
        found = self.files.get(name) if name != INDEX else None
        if found is None:
            raise ApiError(404, "not_found", f"no such file: {request.path}")
        return Response(200, found[0], found[1])
