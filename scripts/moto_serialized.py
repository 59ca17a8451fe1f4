"""moto's server with one request handled at a time, and one ECS response fix.

DynamoDB applies each conditional write atomically. moto's threaded server does
not: under 16 concurrent acquirers the conformance race test saw two winners of
one round. Serialising request handling restores the per-item atomicity the lease
protocol relies on, while connections are still accepted concurrently.

moto also answers ECS RunTask/DescribeTasks with a container's `cpu`/`memory` as
JSON numbers where the ECS API model (and so aws-sdk-ecs) has strings; the SDK
then rejects the whole response. Those fields are turned into strings, as the
real service sends them. Nothing else is changed.

Usage: python3 scripts/moto_serialized.py PORT
"""

import json
import signal
import sys
import threading

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple

ECS_TARGET_PREFIX = "AmazonEC2ContainerServiceV20141113."
CONTAINER_STRING_FIELDS = ("cpu", "memory", "memoryReservation")


def fix_ecs_containers(body: bytes) -> bytes:
    try:
        document = json.loads(body)
    except ValueError:
        return body

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "containers" and isinstance(value, list):
                    for container in value:
                        if isinstance(container, dict):
                            for field in CONTAINER_STRING_FIELDS:
                                if isinstance(container.get(field), (int, float)):
                                    container[field] = str(container[field])
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(document)
    return json.dumps(document).encode()


def main() -> None:
    port = int(sys.argv[1])
    app = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()

    def serialized(environ, start_response):
        captured = {}

        def capture(status, headers, exc_info=None):
            captured["status"] = status
            captured["headers"] = headers
            return lambda data: None

        with lock:
            # Drain the response inside the lock: the handler may be lazy.
            body = b"".join(app(environ, capture))
        if environ.get("HTTP_X_AMZ_TARGET", "").startswith(ECS_TARGET_PREFIX):
            body = fix_ecs_containers(body)
        headers = [(k, v) for k, v in captured["headers"] if k.lower() != "content-length"]
        headers.append(("Content-Length", str(len(body))))
        start_response(captured["status"], headers)
        return [body]

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    run_simple("127.0.0.1", port, serialized, threaded=True)


if __name__ == "__main__":
    main()
