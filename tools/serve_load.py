#!/usr/bin/env python3
"""serve_load.py - a load generator for a running `flexdiag serve` (Python stdlib only).

--clients threads send requests of mixed sizes until --duration seconds have passed or
--requests were sent: images (n from 1 to --max-n) or completions (max_tokens from --lengths, n
1 or 2), a --stream fraction of them streamed. Prompts and seeds come from a pool of --pool
pairs, so equal requests recur: an image whose PNG bytes differ from an earlier one's of the
same prompt, seed and index (whatever the n), or a choice whose tokens differ from an earlier
one's of the same prompt, seed, max_tokens and index, counts as a mismatch. A 429 is counted
and its client waits its Retry-After. At the end it prints the throughput (requests/s, img/s,
and tok/s from the server's flexdiag_tokens_total over the run, so another client's tokens count
too), the latency of the 200 replies (p50, p99; all, then per size) and the count of each other
outcome: an HTTP status; "conn": no reply (refused, reset, timed out); "bad-reply": a 200 whose
body is not the route's JSON; "sse-error": a stream that ended in an error event; "sse-cut": one
that ended without [DONE].
Exit 1 on a mismatch or an outcome other than 200 and 429.

  tools/serve_load.py http://127.0.0.1:8000 --kind images --clients 16 --duration 30
  tools/serve_load.py http://127.0.0.1:8001 --kind completions --lengths 8,32,64 --requests 500

run() is the same from Python (tests/cli/test_serve_soak.py): it returns the summary and hands
each reply to a callback.
"""
import argparse
import base64
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse

PATHS = {"images": "/v1/images/generations", "completions": "/v1/completions"}


class Options:
    """What run() needs: the server, the mix of requests and when to stop."""

    def __init__(self, url, kind="images", clients=16, duration=10.0, requests=0, max_n=4,
                 lengths=(8, 32, 64), stream=0.25, pool=4, seed=1, api_key=None, timeout=600):
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname, u.port or 80
        self.kind, self.clients, self.duration, self.requests = kind, clients, duration, requests
        self.max_n, self.lengths, self.stream, self.pool = max_n, tuple(lengths), stream, pool
        self.seed, self.api_key, self.timeout = seed, api_key, timeout


def pool_pair(kind, p):
    """Pair p of the pool: (prompt, seed). Completions take token ids (any text model does)."""
    if kind == "images":
        return "a load test scene %d" % p, 1000 + p
    return [1 + (7 * p + j) % 90 for j in range(3 + p % 4)], 1000 + p


def make_request(o, k):
    """Request k of the run: (size label, pool pair, body); the same for the same seed and k."""
    rng = random.Random(o.seed * 1000003 + k)
    p = rng.randrange(o.pool)
    prompt, seed = pool_pair(o.kind, p)
    body = {"prompt": prompt, "seed": seed}
    if o.kind == "images":
        body["n"] = rng.randint(1, o.max_n)
        label = "images n=%d" % body["n"]
    else:
        body.update(max_tokens=rng.choice(o.lengths), n=rng.randint(1, 2))
        label = "completions max_tokens=%d" % body["max_tokens"]
    if rng.random() < o.stream:
        body["stream"] = True
    return label, p, body


def connect(o):
    c = http.client.HTTPConnection(o.host, o.port, timeout=o.timeout)
    headers = {"Content-Type": "application/json"}
    if o.api_key:
        headers["Authorization"] = "Bearer " + o.api_key
    return c, headers


def read_events(r):
    """(the data of a server-sent event stream's events, whether it ended in [DONE])."""
    events = []
    for raw in iter(r.readline, b""):
        line = raw.decode().rstrip("\n")
        if line == "data: [DONE]":
            return events, True
        if line.startswith("data: "):
            events.append(json.loads(line[6:]))
    return events, False


def outputs(kind, reply):
    """{index: PNG bytes (images) or token ids (completions)} of a plain reply."""
    if kind == "images":
        return {i: base64.b64decode(d["b64_json"]) for i, d in enumerate(reply["data"])}
    return {c["index"]: c["tokens"] for c in reply["choices"]}


def stream_outputs(kind, r):
    """(outcome, {index: output}) of a streamed reply: 200, "sse-error" or "sse-cut"."""
    events, done = read_events(r)
    got = {}
    for ev in events:
        if "error" in ev:
            return "sse-error", got
        if kind == "images" and ev.get("type") == "image_generation.completed":
            got[ev["index"]] = base64.b64decode(ev["b64_json"])
        elif kind == "completions":
            for c in ev["choices"]:
                got.setdefault(c["index"], []).extend(c.get("tokens", []))
    return (200 if done else "sse-cut"), got


def send(o, body):
    """POST body: (outcome, seconds, {index: output}, Retry-After seconds)."""
    t0 = time.monotonic()
    c, headers = connect(o)
    try:
        c.request("POST", PATHS[o.kind], body=json.dumps(body), headers=headers)
        r = c.getresponse()
        if r.status != 200:
            r.read()
            return r.status, time.monotonic() - t0, {}, float(r.headers.get("Retry-After", 0))
        if body.get("stream"):
            outcome, got = stream_outputs(o.kind, r)
        else:
            outcome, got = 200, outputs(o.kind, json.loads(r.read()))
        return outcome, time.monotonic() - t0, got, 0.0
    except (OSError, http.client.HTTPException):
        return "conn", time.monotonic() - t0, {}, 0.0
    except (ValueError, KeyError, TypeError):
        return "bad-reply", time.monotonic() - t0, {}, 0.0
    finally:
        c.close()


def server_tokens(o):
    """The server's flexdiag_tokens_total (None where /metrics does not answer)."""
    c, headers = connect(o)
    try:
        c.request("GET", "/metrics", headers=headers)
        for line in c.getresponse().read().decode().splitlines():
            if line.startswith("flexdiag_tokens_total "):
                return float(line.split()[1])
    except (OSError, http.client.HTTPException):
        pass
    finally:
        c.close()
    return None


class Tally:
    """The run's shared state: the next request's number, outcomes, latencies, the first output
    seen for each pair and index (and max_tokens) and the mismatches against it."""

    def __init__(self, o, on_reply):
        self.o, self.on_reply = o, on_reply
        self.lock = threading.Lock()
        self.next = 0
        self.end = time.monotonic() + o.duration if o.duration else None
        self.outcomes, self.latency, self.first = {}, {}, {}
        self.images = self.mismatches = 0

    def take(self):
        """The next request's number, or None once the run is over."""
        with self.lock:
            over = (self.end is not None and time.monotonic() >= self.end) or \
                (self.o.requests and self.next >= self.o.requests)
            if over:
                return None
            self.next += 1
            return self.next - 1

    def wait(self, secs):
        """Sleep secs (a 429's Retry-After), no further than the end of the run."""
        left = self.end - time.monotonic() if self.end is not None else secs
        time.sleep(max(0.0, min(secs, left)))

    def record(self, label, pair, body, outcome, secs, got):
        with self.lock:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            if outcome != 200:
                return
            self.latency.setdefault(label, []).append(secs)
            self.images += len(got) if self.o.kind == "images" else 0
            for i, out in got.items():
                key = (pair, i) if self.o.kind == "images" else (pair, label, i)
                seen = self.first.setdefault(key, out)
                self.mismatches += seen != out
        if self.on_reply:
            self.on_reply(pair, body, got)


def client(tally):
    """One client: requests one after another until the run is over."""
    o = tally.o
    while True:
        k = tally.take()
        if k is None:
            return
        label, pair, body = make_request(o, k)
        outcome, secs, got, retry = send(o, body)
        tally.record(label, pair, body, outcome, secs, got)
        if outcome == 429:
            tally.wait(retry)


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run(o, on_reply=None):
    """Run the load; on_reply(pair, body, {index: output}) for each 200 reply (from the clients'
    threads). Returns the summary: seconds, outcomes {200, another status, "conn",
    "bad-reply", "sse-error" or "sse-cut": count}, images, tokens (the server's, None without
    /metrics), mismatches, latency {label: [s]}."""
    tokens0 = server_tokens(o)
    tally = Tally(o, on_reply)
    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(tally,)) for _ in range(o.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = time.monotonic() - t0
    tokens1 = server_tokens(o)
    return {"seconds": secs, "outcomes": tally.outcomes, "images": tally.images,
            "tokens": None if tokens0 is None or tokens1 is None else tokens1 - tokens0,
            "mismatches": tally.mismatches, "latency": tally.latency}


def report(o, s):
    """The summary as text lines."""
    ok = s["outcomes"].get(200, 0)
    secs = s["seconds"]
    tok = "%.0f tok/s" % (s["tokens"] / secs) if s["tokens"] is not None else "tok/s unknown"
    lines = ["%s on %s:%d, %d clients: %d requests in %.1f s, %d ok" % (
                 o.kind, o.host, o.port, o.clients, sum(s["outcomes"].values()), secs, ok),
             "throughput: %.1f req/s (ok), %.1f img/s, %s (server's flexdiag_tokens_total)" % (
                 ok / secs, s["images"] / secs, tok)]
    every = [x for xs in s["latency"].values() for x in xs]
    lines.append("latency of ok replies: p50 %.3f s, p99 %.3f s" % (quantile(every, 0.5),
                                                                     quantile(every, 0.99)))
    for label in sorted(s["latency"], key=lambda k: (len(k), k)):
        xs = s["latency"][label]
        lines.append("  %-26s %6d  p50 %.3f s  p99 %.3f s" % (label, len(xs), quantile(xs, 0.5),
                                                             quantile(xs, 0.99)))
    other = {k: v for k, v in s["outcomes"].items() if k != 200}
    lines.append("not ok: " + (", ".join("%s x %d" % kv for kv in sorted(
        other.items(), key=lambda kv: str(kv[0]))) or "none"))
    lines.append("mismatches: %d" % s["mismatches"])
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url", help="the server, e.g. http://127.0.0.1:8000")
    ap.add_argument("--kind", choices=sorted(PATHS), default="images",
                    help="what the server's model makes (default images)")
    ap.add_argument("--clients", type=int, default=16, help="concurrent clients (16)")
    ap.add_argument("--duration", type=float,
                    help="seconds to send requests (default 10, none with --requests)")
    ap.add_argument("--requests", type=int, default=0, help="stop after this many (0: no limit)")
    ap.add_argument("--max-n", type=int, default=4, help="images per request: 1 to this (4)")
    ap.add_argument("--lengths", default="8,32,64",
                    help="completions' max_tokens to choose from (8,32,64)")
    ap.add_argument("--stream", type=float, default=0.25, help="fraction streamed (0.25)")
    ap.add_argument("--pool", type=int, default=4, help="(prompt, seed) pairs (4)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the request mix (1)")
    ap.add_argument("--api-key", help="sent as Authorization: Bearer KEY")
    a = ap.parse_args()
    if a.duration is None:
        a.duration = 0.0 if a.requests else 10.0
    if a.clients < 1 or a.max_n < 1 or a.pool < 1 or not (a.duration > 0 or a.requests > 0):
        ap.error("--clients, --max-n and --pool must be at least 1, and --duration or "
                 "--requests positive")
    o = Options(a.url, a.kind, a.clients, a.duration, a.requests, a.max_n,
                [int(x) for x in a.lengths.split(",")], a.stream, a.pool, a.seed, a.api_key)
    s = run(o)
    print("\n".join(report(o, s)))
    bad = sum(v for k, v in s["outcomes"].items() if k not in (200, 429))
    sys.exit(1 if bad or s["mismatches"] else 0)


if __name__ == "__main__":
    main()
