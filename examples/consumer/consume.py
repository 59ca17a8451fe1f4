#!/usr/bin/env python3
"""Read one leasehold stream sink, in order, and resume where you left off.

A downstream consumer of `leasehold:sink:{stream_id}` (docs/redis.md, "Stream
sink"), written with redis-py:

    SINK_URL=redis://127.0.0.1:6379 python3 consume.py --stream btcusdt
    python3 consume.py --url redis://… --stream btcusdt --after 7-5200 --json

It reads with XREAD BLOCK (waiting for new entries as they are written) and
hands every entry to the handler of its kind. Run with `--count N` it stops
after N entries (a batch job, a test); otherwise it runs until SIGINT or
SIGTERM and prints the id to resume after.

Resuming. An entry id is `<fence token>-<seq>`: the token of the worker that
wrote the entry, then the upstream's sequence (a gap marker's id carries the
last missing sequence, `gap_to`). Redis only appends an id above the stream's
last one, so ids strictly increase along the stream, across takeovers too. That
makes the id the resume point: persist the id of the last entry you finished
with (in the same transaction as its effects, if you can, for exactly-once;
after them for at-least-once), and start again with `--after` that id. XREAD
returns only entries strictly after it; `--after 0-0` (the default) reads the
stream from its start.

Needs redis-py (`pip install redis`); scripts/services.sh installs it for the
test in leasehold/tests/it/sink_consumer.rs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
import urllib.parse
from dataclasses import dataclass, field

try:
    import redis
except ImportError:  # One line, not a traceback: the fix is an install.
    print("consume.py: redis-py is not installed (pip install redis)", file=sys.stderr)
    sys.exit(2)

PROG = "consume.py"
KEY_PREFIX = "leasehold:sink:"  # docs/redis.md: leasehold:sink:{stream_id}
ENTRY_ID = re.compile(r"^(\d{1,20})-(\d{1,20})$")
U64_MAX = 2**64 - 1
BATCH = 100  # entries per XREAD


class Usage(Exception):
    """Bad arguments or an unusable Redis: one line on stderr, exit status 2."""


def fail(message: str) -> None:
    raise Usage(message)


def warn(message: str) -> None:
    # Everything but the entries goes to stderr, prefixed, so stdout stays one
    # line per entry (and, with --json, one JSON object per line).
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


# --- arguments -------------------------------------------------------------------


def parse_entry_id(raw: str) -> tuple[int, int]:
    match = ENTRY_ID.match(raw)
    if not match or int(match[1]) > U64_MAX or int(match[2]) > U64_MAX:
        fail(f"--after: expected an entry id <fence token>-<seq> such as 7-1234, got {raw!r}")
    return int(match[1]), int(match[2])


def parse_args(argv: list[str]) -> argparse.Namespace:
    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # argparse prints usage; we want one line
            fail(message)

    parser = Parser(prog=PROG, description="Read a leasehold stream sink in order.")
    parser.add_argument("--url", default=os.environ.get("SINK_URL"),
                        help="the sink's Redis (redis://, rediss://, redis+unix://); default $SINK_URL")
    parser.add_argument("--stream", required=True, metavar="STREAM_ID",
                        help="reads leasehold:sink:STREAM_ID")
    parser.add_argument("--after", default="0-0", metavar="ENTRY_ID",
                        help="resume strictly after this entry id (default 0-0: from the start)")
    parser.add_argument("--count", type=int, metavar="N",
                        help="stop after N entries (default: run until SIGINT/SIGTERM)")
    parser.add_argument("--block-ms", type=int, default=5000, metavar="MS",
                        help="how long one XREAD waits for new entries; 0 waits forever (default 5000)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object per entry")
    args = parser.parse_args(argv)

    if not args.url:
        fail("--url: no Redis URL (pass --url or set SINK_URL)")
    if not args.stream or len(args.stream.encode()) > 1024 or any(
            c.isspace() or not c.isprintable() for c in args.stream):
        fail("--stream: expected a stream id (1 to 1024 bytes, no spaces or control characters)")
    args.after_id = parse_entry_id(args.after)
    if args.count is not None and args.count < 1:
        fail(f"--count: expected a positive number, got {args.count}")
    if args.block_ms < 0:
        fail(f"--block-ms: expected 0 or more milliseconds, got {args.block_ms}")
    return args


def describe_url(url: str) -> str:
    """Where a URL points (host:port or socket path), never its user or password."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme in ("unix", "redis+unix"):
        return parts.path or "?"
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{parts.hostname or '?'}:{port or 6379}"


def connect(url: str, block_ms: int) -> redis.Redis:
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme in ("redis+cluster", "rediss+cluster"):
        fail("--url: a Redis Cluster sink is not supported by this example; use redis.cluster.RedisCluster")
    if scheme == "memory" or url == "memory:":
        fail("--url: memory: is an in-process sink nobody else can read (run leasehold dev with --redis-url)")
    if scheme == "redis+unix":  # SINK_URL's spelling of redis-py's unix://
        url = "unix" + url[len("redis+unix"):]
    elif scheme not in ("redis", "rediss", "unix"):
        fail("--url: expected a redis://, rediss:// or redis+unix:// URL")
    try:
        urllib.parse.urlsplit(url).port
    except ValueError:
        fail("--url: the port is not a number from 0 to 65535")
    where = describe_url(url)
    try:
        client = redis.Redis.from_url(
            url,
            # Field values stay bytes: a payload is the upstream's frame as
            # received and need not be UTF-8.
            decode_responses=False,
            socket_connect_timeout=5,
            # A blocked XREAD answers within block_ms: a read silent much
            # longer than that is a dead connection.
            socket_timeout=None if block_ms == 0 else block_ms / 1000 + 10,
        )
        client.ping()
    except (redis.RedisError, ValueError, OSError) as err:
        fail(f"cannot connect to Redis at {where}: {scrub(str(err), url)}")
    return client


def scrub(text: str, url: str) -> str:
    """An error text with the URL's password (if any) masked, just in case."""
    password = urllib.parse.urlsplit(url).password
    if password:
        text = text.replace(password, "***").replace(urllib.parse.unquote(password), "***")
    return text


# --- entries -----------------------------------------------------------------------


class Malformed(Exception):
    """An entry whose fields do not have the shape of their kind."""


def number(fields: dict[str, bytes], name: str) -> int:
    raw = fields.get(name)
    if raw is None:
        raise Malformed(f"no {name}")
    try:
        value = int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise Malformed(f"{name} is not a number") from None
    if not 0 <= value <= U64_MAX:
        raise Malformed(f"{name} is out of range")
    return value


def text(fields: dict[str, bytes], name: str) -> str:
    raw = fields.get(name)
    if raw is None:
        raise Malformed(f"no {name}")
    return raw.decode("utf-8", errors="replace")


def classify(entry_id: str, fields: dict[str, bytes]) -> dict:
    """The entry as a record: its id, its kind and that kind's fields.

    Kinds (docs/redis.md, "Stream sink", layout v2):
      - event: seq, event_id, fence_token, payload;
      - gap marker: gap_from, gap_to, fence_token, reason and no payload;
        told from an event by its gap_to field.
      - reset: reason = reset, reset_from, reset_to, fence_token, at id
        <token>-<reset_to - 1>: the upstream's sequence restarted, so later
        sequences are lower (entry ids still increase);
    One more kind is handled here ahead of the worker (it does not write it
    yet, and docs/redis.md does not list it: its shape may still change):
      - snapshot: a snapshot field, seq, fence_token (and gap_from, gap_to,
        reason when diffs were missed): state starts again from it.
    Anything else raises Malformed: the caller reports it and skips it.
    """
    if "snapshot" in fields:
        record = {"id": entry_id, "kind": "snapshot", "seq": number(fields, "seq"),
                  "fence_token": number(fields, "fence_token"),
                  "snapshot_bytes": len(fields["snapshot"])}
        if "gap_to" in fields:
            record.update(gap_from=number(fields, "gap_from"), gap_to=number(fields, "gap_to"),
                          reason=text(fields, "reason"))
        return record
    if fields.get("reason") == b"reset":
        record = {"id": entry_id, "kind": "reset", "reset_from": number(fields, "reset_from"),
                  "reset_to": number(fields, "reset_to")}
        if "fence_token" in fields:
            record["fence_token"] = number(fields, "fence_token")
        return record
    if "gap_to" in fields:
        if "payload" in fields:
            raise Malformed("a gap marker with a payload")
        record = {"id": entry_id, "kind": "gap", "gap_from": number(fields, "gap_from"),
                  "gap_to": number(fields, "gap_to"), "reason": text(fields, "reason"),
                  "fence_token": number(fields, "fence_token")}
        if record["gap_from"] > record["gap_to"]:
            raise Malformed("gap_from is above gap_to")
        return record
    if "seq" in fields and "payload" in fields:
        return {"id": entry_id, "kind": "event", "seq": number(fields, "seq"),
                "event_id": text(fields, "event_id"),
                "fence_token": number(fields, "fence_token"),
                "payload_bytes": len(fields["payload"])}
    raise Malformed("not an event, gap marker, reset or snapshot")


@dataclass
class State:
    """What a real consumer builds from the stream (an order book, a trade
    tape, a running total), reduced to what this example can show: where it
    is, and whether what it holds is complete."""

    last_seq: int | None = None  # None: unknown until the next event or snapshot
    events: int = 0
    holes: list[tuple[int, int]] = field(default_factory=list)


class Consumer:
    def __init__(self, as_json: bool, after: tuple[int, int]):
        self.as_json = as_json
        self.state = State()
        self.kinds: dict[str, int] = {}  # entries handled, by kind
        if after != (0, 0):
            # Resuming after `<token>-<seq>`: that entry's sequence was handled
            # (for a gap marker, seq is its gap_to), so the next is seq + 1.
            self.state.last_seq = after[1]

    def handle(self, entry_id: str, fields: dict[str, bytes]) -> None:
        try:
            record = classify(entry_id, fields)
        except Malformed as problem:
            # Report and skip: one entry we cannot use must not stop the
            # reader, and its id still moves the resume point past it.
            names = sorted(fields)
            warn(f"skipping entry {entry_id} ({problem}; fields: {', '.join(names)})")
            record = {"id": entry_id, "kind": "unknown", "fields": names, "problem": str(problem)}
        else:
            getattr(self, "on_" + record["kind"])(record)
        self.kinds[record["kind"]] = self.kinds.get(record["kind"], 0) + 1
        self.emit(record)

    def on_event(self, record: dict) -> None:
        seq = record["seq"]
        last = self.state.last_seq
        if last is not None and seq > last + 1:
            # Every range the worker knows it lost has a marker before this
            # point; a jump without one is normal for UPSTREAM_SEQ_STEP=increasing
            # feeds, or the stream was trimmed (SINK_MAX_LEN) past our resume id.
            warn(f"seq jumps from {last} to {seq} at {record['id']} without a gap marker")
        elif last is not None and seq <= last:
            # The sink holds each seq once, in increasing order; only a reset
            # entry may take it back.
            warn(f"seq goes back from {last} to {seq} at {record['id']} without a reset entry")
        # Your application's work goes here: apply the payload.
        self.state.last_seq = seq
        self.state.events += 1

    def on_gap(self, record: dict) -> None:
        # Sequences gap_from..gap_to will never arrive. Anything that needs
        # every event (a book built from diffs, a running total) is no longer
        # exact: flag it, or rebuild it from a source of truth. Go on after.
        self.state.holes.append((record["gap_from"], record["gap_to"]))
        self.state.last_seq = record["gap_to"]  # the next expected is gap_to + 1

    def on_reset(self, record: dict) -> None:
        # The upstream restarted its numbering: sequences after this are lower
        # than before it. Continuity starts over; a state keyed on sequence
        # (deduplication, "seen up to N") must be cleared. The next event is
        # reset_to.
        self.state.last_seq = record["reset_to"] - 1

    def on_snapshot(self, record: dict) -> None:
        # A full state at seq: drop whatever was built so far (diffs before it
        # are superseded, and any it reports missed are covered by it) and
        # start again from the snapshot.
        self.state = State(last_seq=record["seq"])

    def emit(self, record: dict) -> None:
        if self.as_json:
            print(json.dumps(record, separators=(",", ":")), flush=True)
        else:
            rest = " ".join(f"{k}={v}" for k, v in record.items() if k not in ("id", "kind"))
            print(f"{record['id']} {record['kind']} {rest}", flush=True)


# --- the read loop -------------------------------------------------------------------


class Stop(Exception):
    pass


class Signals:
    """SIGINT and SIGTERM stop the reader between two entries, never inside
    one: while XREAD waits they interrupt it, otherwise the loop ends after the
    entry in hand, so the resume id printed is exactly the last one handled."""

    def __init__(self) -> None:
        self.waiting = False
        self.stop = False

    def __call__(self, signum, frame) -> None:
        self.stop = True
        if self.waiting:
            raise Stop()


def run(args: argparse.Namespace) -> int:
    signals = Signals()
    signal.signal(signal.SIGTERM, signals)
    signal.signal(signal.SIGINT, signals)
    client = connect(args.url, args.block_ms)
    key = KEY_PREFIX + args.stream
    where = describe_url(args.url)
    try:
        kind = client.type(key).decode()
    except redis.RedisError as err:
        fail(f"cannot read {key} at {where}: {scrub(str(err), args.url)}")
    if kind not in ("stream", "none"):  # none: not written yet, XREAD waits for it
        fail(f"{key} at {where} is a {kind}, not a stream")

    consumer = Consumer(args.json, args.after_id)
    last_id = args.after
    done = 0
    backoff = 0.1
    try:
        while (args.count is None or done < args.count) and not signals.stop:
            want = BATCH if args.count is None else min(BATCH, args.count - done)
            try:
                # Entries strictly after last_id, waiting up to block_ms for them.
                signals.waiting = True
                reply = client.xread({key: last_id}, count=want, block=args.block_ms)
            except (redis.ConnectionError, redis.TimeoutError) as err:
                # A lost connection loses nothing: read again after the last
                # entry handled. (redis-py reconnects on the next command.)
                warn(f"Redis at {where}: {scrub(str(err), args.url)}; retrying after {last_id}")
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            finally:
                signals.waiting = False
            backoff = 0.1
            for _key, entries in reply or []:
                for raw_id, raw_fields in entries:
                    if signals.stop:
                        break
                    entry_id = raw_id.decode()
                    fields = {k.decode("utf-8", errors="replace"): v for k, v in raw_fields.items()}
                    consumer.handle(entry_id, fields)
                    # Handled: this is the point to persist entry_id.
                    last_id = entry_id
                    done += 1
    except Stop:
        pass
    except redis.RedisError as err:  # e.g. the key became another type
        warn(f"reading {key} at {where}: {scrub(str(err), args.url)}")
        warn(f"resume with --after {last_id}")
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(consumer.kinds.items()))
    warn(f"{done} entries ({kinds or 'none'}); resume with --after {last_id}")
    return 0


def main(argv: list[str]) -> int:
    try:
        return run(parse_args(argv))
    except Usage as err:
        warn(str(err))
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
