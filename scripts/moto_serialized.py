"""moto's server with one request handled at a time.

DynamoDB applies each conditional write atomically. moto's threaded server does
not: under 16 concurrent acquirers the conformance race test saw two winners of
one round. Serialising request handling restores the per-item atomicity the lease
protocol relies on, while connections are still accepted concurrently.

Usage: python3 scripts/moto_serialized.py PORT
"""

import signal
import sys
import threading

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple


def main() -> None:
    port = int(sys.argv[1])
    app = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()

    def serialized(environ, start_response):
        with lock:
            # Drain the response inside the lock: the handler may be lazy.
            return [b"".join(app(environ, start_response))]

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    run_simple("127.0.0.1", port, serialized, threaded=True)


if __name__ == "__main__":
    main()
