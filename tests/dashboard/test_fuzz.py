"""The dashboard under fuzzed requests: query values, panel names, policy names, tokens,
cookies and headers from a hostile client. No answer may be a 5xx, nothing sent may come back
as markup (a marker tag is always escaped), and afterwards the page still renders."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote_from_bytes

from hypothesis import given
from hypothesis import strategies as st
from starlette.testclient import TestClient

from services.common.config import ServiceSettings
from services.dashboard.app import create_app
from tests.fuzzing import fuzz_settings

MARKER = b"<zz-x onload=1>"
VALUES = st.one_of(
    st.sampled_from(
        [
            b"0",
            b"1",
            b"0.5",
            b"10",
            b"-1",
            b"nan",
            b"inf",
            b"1e400",
            b"9" * 400,
            b"",
            MARKER,
            b"\xff\xfe",
            b"%",
            b"baseline",
            b"parfusion",
            b"cockpit",
            b"../../etc/passwd",
        ]
    ),
    st.binary(max_size=30),
    st.text(max_size=30).map(lambda t: t.encode("utf-8", "surrogatepass")),
).map(lambda b: quote_from_bytes(b, safe=""))
HEADER_VALUES = st.one_of(
    st.sampled_from([b"true", b"\xff", "é".encode(), b"Bearer \xc3", b"", b"none", b"cross-site"]),
    st.binary(max_size=20).filter(lambda b: b"\r" not in b and b"\n" not in b and b"\x00" not in b),
)
HEADER_NAMES = st.sampled_from(
    [b"hx-request", b"x-api-token", b"authorization", b"cookie", b"sec-fetch-site", b"origin"]
)


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, list[tuple[bytes, bytes]]]:
    v = draw(VALUES)
    route = draw(st.sampled_from(["preview", "partial", "policy", "demo", "unlock", "page"]))
    if route == "preview":
        keys = draw(st.lists(st.sampled_from(["cpu", "gpu", "network", "rate", "x"]), max_size=4))
        query = "&".join(f"{k}={draw(VALUES)}" for k in keys)
        method, url = "GET", f"/partials/preview?{query}"
    elif route == "partial":
        method, url = "GET", f"/partials/{v}"
    elif route == "policy":
        method, url = "POST", f"/actions/policy?name={v}"
    elif route == "demo":
        method, url = "POST", f"/actions/demo/{draw(st.sampled_from(['start', 'stop', v]))}"
    elif route == "unlock":
        method, url = "GET", f"/unlock?token={v}"
    else:
        method, url = "GET", f"/?story={draw(st.sampled_from(['guided', v]))}"
    headers = [(b"hx-request", b"true")] if draw(st.booleans()) else []
    headers += draw(st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=3))
    return method, url, headers


def test_no_request_gets_a_5xx_or_reflects_markup(
    dashboard_settings: Callable[..., ServiceSettings],
) -> None:
    with TestClient(create_app(dashboard_settings()), raise_server_exceptions=False) as client:

        @fuzz_settings()
        @given(request=requests())
        def fuzz(request: tuple[str, str, list[tuple[bytes, bytes]]]) -> None:
            method, url, headers = request
            reply = client.request(method, url, headers=headers, follow_redirects=False)
            assert reply.status_code < 500, (method, url, reply.status_code, reply.text[:300])
            assert MARKER not in reply.content, (method, url)
            assert "content-security-policy" in reply.headers

        fuzz()
        client.post("/actions/demo/stop", headers={"HX-Request": "true"})
        page = client.get("/")
        assert page.status_code == 200 and 'id="cockpit"' in page.text
        assert client.get("/healthz").status_code == 200
