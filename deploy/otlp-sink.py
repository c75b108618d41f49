"""A minimal OTLP/HTTP trace receiver: it stands in for Jaeger where Jaeger's image cannot be
pulled (deploy/compose.offline.yaml). It takes `POST /v1/traces` (protobuf or JSON, gzip or not)
from the services' OTLP exporters and prints one JSON line per span on stdout, so
`docker compose logs jaeger` shows every span: service, name, trace, parent, attributes.
It stores nothing and has no UI. Uses only the standard library and opentelemetry-proto,
which the Populace image carries (the OTLP exporter needs it).

    python otlp-sink.py [--host 0.0.0.0] [--port 4318]
"""

from __future__ import annotations

import argparse
import gzip
import json
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

MAX_BODY = 16 * 1024 * 1024  # bytes; the exporters send batches of at most 512 spans


def value(v) -> object:
    """An OTLP AnyValue as plain JSON."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind) if kind else None


def spans(request: ExportTraceServiceRequest):
    for resource_spans in request.resource_spans:
        resource = {kv.key: value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield {
                    "service": resource.get("service.name"),
                    "name": span.name,
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_id": span.parent_span_id.hex() or None,
                    "start_ns": span.start_time_unix_nano,
                    "end_ns": span.end_time_unix_nano,
                    "attributes": {kv.key: value(kv.value) for kv in span.attributes},
                }


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        if self.path != "/v1/traces":
            return self.send_error(404, "only /v1/traces")
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY:
            return self.send_error(413 if length else 411)
        body = self.rfile.read(length)
        request = ExportTraceServiceRequest()
        try:
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.headers.get("Content-Type", "").startswith("application/json"):
                json_format.Parse(body, request)
            else:
                request.ParseFromString(body)
        except Exception as err:  # a malformed export is refused, never fatal
            return self.send_error(400, f"not an OTLP trace export: {err}")
        for span in spans(request):
            sys.stdout.write(json.dumps(span, separators=(",", ":")) + "\n")
        sys.stdout.flush()
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args) -> None:  # spans only on stdout; requests unlogged
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=4318)
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # docker stop: exit 0, not killed
    print(f"otlp-sink: listening on http://{args.host}:{args.port}/v1/traces", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
