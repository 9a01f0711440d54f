"""The relay out of the private namespace: an HTTP proxy for CONNECT and plain requests.

Its sockets are exercised here within one process, on loopback: the relay's
serving loop on a listener, a real HTTP server behind it, a real client in
front. The namespace crossing itself runs in the end-to-end tests of
`storage_run_test.py`, whose S3 server only the relay can reach.
"""

import http.server
import socket
import threading
import urllib.request

import pytest

from estimator_dist.launcher import way_out


@pytest.fixture
def origin():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = f"path={self.path} host={self.headers['Host']}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture
def relay():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    threading.Thread(target=way_out._serve, args=(listener,), daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def test_a_plain_http_request_goes_through_with_its_path(origin, relay):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": relay}))
    for path in ("/bucket/key?list-type=2", "/other"):
        with opener.open(f"http://127.0.0.1:{origin}{path}", timeout=10) as response:
            assert response.read().decode() == f"path={path} host=127.0.0.1:{origin}"


def test_connect_opens_a_tunnel(origin, relay):
    port = int(relay.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(f"CONNECT 127.0.0.1:{origin} HTTP/1.1\r\n\r\n".encode())
        assert client.recv(100).startswith(b"HTTP/1.1 200")
        client.sendall(b"GET /tunnelled HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := client.recv(4096):
            reply += chunk
    assert reply.endswith(b"path=/tunnelled host=x")


def test_an_unreachable_target_gets_a_502(relay):
    import portpicker

    closed = portpicker.pick_unused_port()
    port = int(relay.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(f"CONNECT 127.0.0.1:{closed} HTTP/1.1\r\n\r\n".encode())
        assert client.recv(100).startswith(b"HTTP/1.1 502")


def test_the_cluster_stays_direct():
    env = {"NO_PROXY": "example.org,localhost"}
    way_out.route_through("http://127.0.0.1:9", env)
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1,::1,example.org"
    assert {env[name] for name in way_out.PROXY_VARIABLES} == {"http://127.0.0.1:9"}
