"""Who may press the dashboard's buttons: the guard in front of every POST /actions/... route.

The buttons change the real services (policy, demo, disturbance), so these rules apply:

- Every action must carry htmx's ``HX-Request`` header. A custom header cannot be sent
  cross-site without a CORS preflight the dashboard never answers, so another web page open in
  the same browser cannot press the buttons (cross-site request forgery).
- A browser's own word on where a request comes from is checked too: ``Sec-Fetch-Site`` other
  than ``same-origin`` (a sibling service on another port of 127.0.0.1 is *same-site* but not
  same-origin), or an ``Origin`` other than the dashboard's own, is refused.
- When ``PARFUSION_API_TOKEN`` is set, an action also needs the token: in the ``X-API-Token`` /
  ``Authorization: Bearer`` header (scripts) or in the ``parfusion_token`` cookie that
  ``GET /unlock?token=...`` sets (HttpOnly, SameSite=Strict) for a browser. A token that is
  not even text (bytes that are not UTF-8, a stray character) is simply wrong: 401.

Navigation never changes state: ``?story=guided`` auto-plays only when
:func:`navigation_is_users_own` (services/dashboard/app.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Receive, Scope, Send

from services.common.tokens import bearer, token_matches

COOKIE = "parfusion_token"
ACTION_PREFIX = "/actions/"


def presented_token(request: Request) -> str | bytes | None:
    """The token a request carries: header (as the bytes sent), else the unlock cookie."""
    given = request.headers.get("x-api-token")
    if given is None:
        given = bearer(request.headers.get("authorization"))
    if given:
        return given.encode("latin-1")  # starlette decodes headers as latin-1: the raw bytes
    return request.cookies.get(COOKIE) or None


def token_ok(request: Request, token: str | None) -> bool:
    if not token:
        return True
    return token_matches(presented_token(request), token)


def navigation_is_users_own(request: Request) -> bool:
    """A page load the user made (typed URL, bookmark, a link on this dashboard). Browsers say
    so in ``Sec-Fetch-Site`` (``none`` / ``same-origin``); a client that does not send it
    (an old browser, curl) gets no auto-play either."""
    return request.headers.get("sec-fetch-site") in ("none", "same-origin")


def _cross_origin(request: Request) -> bool:
    site = request.headers.get("sec-fetch-site")
    if site is not None and site != "same-origin":
        return True
    origin = request.headers.get("origin")  # "null" (a sandboxed or file page) is foreign too
    return origin is not None and urlsplit(origin).netloc != request.headers.get("host", "")


class ActionGuard:
    def __init__(self, app: ASGIApp, token: str | None, templates: Jinja2Templates) -> None:
        self.app = app
        self.token = token
        self.templates = templates

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(ACTION_PREFIX):
            request = Request(scope)
            refusal = None
            if request.headers.get("hx-request") != "true":
                refusal = (403, "actions are accepted from the dashboard page only (HX-Request)")
            elif _cross_origin(request):
                refusal = (403, "actions are accepted from the dashboard's own origin only")
            elif not token_ok(request, self.token):
                refusal = (401, "this dashboard needs the API token: open /unlock?token=... once")
            if refusal is not None:
                status, message = refusal
                # shown in the page's flash line, whatever the button's own target was
                headers = {"HX-Retarget": "#flash", "HX-Reswap": "innerHTML"}
                response = PlainTextResponse(message, status_code=status, headers=headers)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def unlock_endpoint(
    token: str | None, templates: Jinja2Templates
) -> Callable[[Request], Awaitable[Response]]:
    async def unlock(request: Request) -> Response:
        given = request.query_params.get("token", "")
        if not token:
            return RedirectResponse("/", status_code=303)
        if not token_matches(given, token):
            return templates.TemplateResponse(
                request,
                "message.html",
                {"css_class": "down-msg", "message": "wrong token"},
                status_code=401,
            )
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, given, httponly=True, samesite="strict")
        return response

    return unlock
