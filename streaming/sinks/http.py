"""Serving ``/metrics`` of the Prometheus exporter (``streaming.sinks.exporter.Exporter``): the
exposition text, rendered once per change (Prometheus text or OpenMetrics, gzipped on request), and
the HTTP(S) server with its WSGI app.  The ``Exporter`` calls into these from thin methods of its
own (``render``, ``serve``, ``shutdown``).
"""

from __future__ import annotations

import gzip
import socket
import ssl
import threading
from typing import TYPE_CHECKING, Any, Optional
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client.exposition import ThreadingWSGIServer, choose_encoder, gzip_accepted
from prometheus_client.utils import floatToGoString

from streaming.sinks.catalogue import _STATUSES, CATALOGUE, P

if TYPE_CHECKING:
    from streaming.sinks.exporter import Exporter


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


def _value_text(v: Any) -> str:
    """A sample value as prometheus-client writes it (``3.0``, ``1e+17``, ``+Inf``, ``NaN``), so
    /metrics reads the same whichever path rendered a series."""
    if type(v) is int and -10**16 < v < 10**16:
        return f"{v}.0"
    return floatToGoString(v)


def aggregates(stores: list[tuple[list, tuple, tuple]]) -> list[tuple[str, list[tuple[tuple, float]]]]:
    """The per-topic aggregates of the partition stores (``Exporter._stores``): (gauge name,
    [(label values, value)]) in ``_AGGREGATES`` order, label values sorted."""
    (parts, _, _), (gparts, _, _) = stores
    topics: dict[tuple, list] = {}  # (cluster, topic) -> [partitions, under-replicated, offline, HW sum, any HW]
    for (c, t, _), v in parts:
        a = topics.get((c, t))
        if a is None:
            a = topics[(c, t)] = [0, 0, 0, 0, False]
        a[0] += 1
        hw, leader, rep, isr = v[0], v[3], v[4], v[5]
        if rep is not None and isr is not None and isr < rep:
            a[1] += 1
        if leader is not None and leader < 0:
            a[2] += 1
        if hw is not None:
            a[3] += hw
            a[4] = True
    # (cluster, group, topic) -> [lag sum, lag max, lag seconds max (None: unknown), partitions by status]
    groups: dict[tuple, list] = {}
    for (c, g, t, _), v in gparts:
        a = groups.get((c, g, t))
        if a is None:
            a = groups[(c, g, t)] = [None, None, None, [0] * len(_STATUSES)]
        lag, secs, status = v[1], v[2], v[3]
        if lag is not None:
            a[0] = lag if a[0] is None else a[0] + lag
            a[1] = lag if a[1] is None else max(a[1], lag)
        if secs is not None and secs == secs:
            a[2] = secs if a[2] is None else max(a[2], secs)
        if status is not None:
            a[3][int(status)] += 1
    ts, gs = sorted(topics.items()), sorted(groups.items())
    return [("topic_partitions", [(k, a[0]) for k, a in ts]),
            ("topic_under_replicated_partitions", [(k, a[1]) for k, a in ts]),
            ("topic_offline_partitions", [(k, a[2]) for k, a in ts]),
            ("topic_high_watermark_sum", [(k, a[3]) for k, a in ts if a[4]]),
            ("group_topic_lag", [(k, a[0]) for k, a in gs if a[0] is not None]),
            ("group_topic_lag_max", [(k, a[1]) for k, a in gs if a[1] is not None]),
            ("group_topic_lag_seconds_max", [(k, a[2]) for k, a in gs if a[2] is not None]),
            ("group_topic_lag_status_partitions", [((*k, st), a[3][i]) for k, a in gs
                                                   for i, st in enumerate(_STATUSES)])]


def _label_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(exporter: Exporter, openmetrics: bool = False, gzipped: bool = False) -> bytes:
    """The exposition, rendered once per change of the exporter's state and shared by every
    scrape until the next (at 100,000 partitions the job changes it once per batch, and a
    scraper every 15-30 s: a render per scrape at most, and none for a scrape in between)."""
    with exporter._render_lock:  # scrapes that arrive during a render wait for it
        gen = exporter._generation
        hit = exporter._rendered.get(openmetrics)
        if hit is None or hit[0] != gen:
            hit = (gen, _render(exporter, openmetrics), None)
        zipped = hit[2]
        if gzipped and zipped is None:
            zipped = gzip.compress(hit[1], compresslevel=1)
            hit = (hit[0], hit[1], zipped)
        exporter._rendered[openmetrics] = hit
        return zipped if gzipped and zipped is not None else hit[1]


def _render(exporter: Exporter, openmetrics: bool) -> bytes:
    """prometheus-client's text for its metrics, and the partition stores' written here: a
    line per series from labels rendered once per entity (~10x faster than building metric
    families)."""
    encoder, _ = choose_encoder("application/openmetrics-text; version=1.0.0" if openmetrics else "text/plain")
    base = encoder(exporter._base)
    if openmetrics and base.endswith(b"# EOF\n"):
        base = base[: -len(b"# EOF\n")]
    parts = [base.decode()]
    texts = exporter._label_text
    stores = exporter._stores()
    for name, series in aggregates(stores):
        full = P + name
        parts.append(f"# HELP {full} {CATALOGUE[full][1]}\n# TYPE {full} gauge\n")
        keys = CATALOGUE[full][2]
        parts.append("".join(
            "{}{{{}}} {}\n".format(full, ",".join(f'{k}="{_label_value(x)}"' for k, x in zip(keys, lab)),
                                    _value_text(v)) for lab, v in series))
    for store, names, labels in stores if exporter.per_partition else ():
        order = sorted(range(len(labels)), key=labels.__getitem__)  # label names sorted, as the client does
        labs = []
        for lab, _ in store:
            t = texts.get(lab)
            if t is None:
                t = texts[lab] = ",".join(f'{labels[j]}="{_label_value(str(lab[j]))}"' for j in order)
            labs.append(t)
        rows = [vals for _, vals in store]
        for i, name in enumerate(names):
            full = P + name
            parts.append(f"# HELP {full} {CATALOGUE[full][1]}\n# TYPE {full} gauge\n")
            parts.append("".join([f"{full}{{{t}}} {_value_text(v)}\n" for t, vals in zip(labs, rows)
                                  if (v := vals[i]) is not None]))
    if openmetrics:
        parts.append("# EOF\n")
    return "".join(parts).encode()


def app(exporter: Exporter, environ: dict, start_response: Any) -> list[bytes]:
    method = environ["REQUEST_METHOD"]
    if method == "OPTIONS":
        start_response("200 OK", [("Allow", "OPTIONS,GET")])
        return [b""]
    if method != "GET":
        start_response("405 Method Not Allowed", [("Allow", "OPTIONS,GET")])
        return [f"# HTTP 405 Method Not Allowed: {method}; use OPTIONS or GET\n".encode()]
    if environ.get("PATH_INFO") == "/favicon.ico":
        start_response("200 OK", [])
        return [b""]
    _, content_type = choose_encoder(environ.get("HTTP_ACCEPT") or "")
    openmetrics = content_type.startswith("application/openmetrics-text")
    zipped = gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING") or "")
    body = exporter.render(openmetrics, zipped)
    headers = [("Content-Type", content_type)] + ([("Content-Encoding", "gzip")] if zipped else [])
    start_response("200 OK", headers)
    return [body]


def serve(exporter: Exporter, port: int, host: str = "127.0.0.1", certfile: Optional[str] = None,
          keyfile: Optional[str] = None, client_cafile: Optional[str] = None) -> int:
    """Serve /metrics (on loopback unless ``host`` says otherwise); returns the bound port (pass 0
    for a free one).  With ``certfile`` and ``keyfile`` (PEM, key not encrypted) over HTTPS; with
    ``client_cafile`` too, a scraper must present a client certificate that CA signed.  Each
    connection is served by a thread of its own, its TLS handshake included (a scraper that
    stalls in its handshake holds up no other)."""
    ctx = None
    if certfile or keyfile:
        try:  # loaded before the port is bound
            if not certfile:
                raise ValueError("a key file without its certificate file (metrics_tls_cert)")
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(certfile, keyfile, password=lambda: b"")  # an encrypted key fails, no prompt
            if client_cafile:
                ctx.load_verify_locations(client_cafile)
                ctx.verify_mode = ssl.CERT_REQUIRED
        except (OSError, ValueError, TypeError) as e:  # ssl.SSLError is an OSError
            raise OSError(f"cannot serve metrics over TLS (certificate {certfile!r}, key {keyfile!r}"
                          f"{f', client CA {client_cafile!r}' if client_cafile else ''}): {e}") from None

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        daemon_threads = True
    try:
        server = make_server(host, port, exporter._app, Server, handler_class=_QuietHandler)
    except OSError as e:
        raise OSError(f"cannot serve metrics on {host}:{port}: {e.strerror or e}; "
                      f"choose another port with --metrics-port") from None
    if ctx is not None:
        server.socket = ctx.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    exporter._server = server
    return server.server_address[1]


def shutdown(exporter: Exporter) -> None:
    if exporter._server is not None:
        exporter._server.shutdown()
        exporter._server.server_close()
        exporter._server = None
