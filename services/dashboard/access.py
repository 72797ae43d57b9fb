"""Who may press the dashboard's buttons: the guard in front of every POST /actions/... route.

The buttons change the real services (policy, demo, disturbance), so two rules apply:

- Every action must carry htmx's ``HX-Request`` header. A custom header cannot be sent
  cross-site without a CORS preflight the dashboard never answers, so another web page open in
  the same browser cannot press the buttons (cross-site request forgery).
- When ``PARFUSION_API_TOKEN`` is set, an action also needs the token: in the ``X-API-Token`` /
  ``Authorization: Bearer`` header (scripts) or in the ``parfusion_token`` cookie that
  ``GET /unlock?token=...`` sets (HttpOnly, SameSite=Strict) for a browser.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

COOKIE = "parfusion_token"
ACTION_PREFIX = "/actions/"


def presented_token(request: Request) -> str | None:
    given = request.headers.get("x-api-token")
    auth = request.headers.get("authorization", "")
    if given is None and auth.lower().startswith("bearer "):
        given = auth[7:].strip()
    return given or request.cookies.get(COOKIE)


def token_ok(request: Request, token: str | None) -> bool:
    if not token:
        return True
    given = presented_token(request)
    return given is not None and hmac.compare_digest(given, token)


class ActionGuard:
    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(ACTION_PREFIX):
            request = Request(scope)
            refusal = None
            if request.headers.get("hx-request") != "true":
                refusal = (403, "actions are accepted from the dashboard page only (HX-Request)")
            elif not token_ok(request, self.token):
                refusal = (401, "this dashboard needs the API token: open /unlock?token=... once")
            if refusal is not None:
                status, message = refusal
                # shown in the page's flash line, whatever the button's own target was
                headers = {"HX-Retarget": "#flash", "HX-Reswap": "innerHTML"}
                response = HTMLResponse(message, status_code=status, headers=headers)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def unlock_endpoint(token: str | None) -> Callable[[Request], Awaitable[Response]]:
    async def unlock(request: Request) -> Response:
        given = request.query_params.get("token", "")
        if not token:
            return RedirectResponse("/", status_code=303)
        if not hmac.compare_digest(given, token):
            return HTMLResponse('<p class="down-msg">wrong token</p>', status_code=401)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, given, httponly=True, samesite="strict")
        return response

    return unlock
