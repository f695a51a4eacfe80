#!/usr/bin/env python3
"""test_serve.py - `flexdiag serve` end to end over loopback ($FLEXDIAG_BIN, CPU builtin models).

Every endpoint; images equal (PNG bytes and token grids) to `flexdiag generate`'s for the same
prompt, seed and settings; a text model's greedy completion equal to generate's; 12 concurrent
mixed requests equal to the same requests made one at a time; 400s naming the field, 401, 404,
405, 413; 429 with Retry-After under a tiny --max-queue and 504 past --timeout; SIGTERM draining
(health says so, new requests 503, the one in flight finishes, exit 0). Python stdlib only.
"""
import base64
import concurrent.futures
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

BIN = os.environ.get("FLEXDIAG_BIN", "build/flexdiag")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


class Server:
    """A `flexdiag serve --port 0` process; its port read from the "listening on" line."""

    def __init__(self, *args, key=None):
        cmd = [BIN, "serve", "--cpu", "--threads", "2", "--port", "0"] + list(args)
        self.key = key
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        if not line.startswith("listening on http://127.0.0.1:"):
            self.p.kill()
            raise SystemExit("serve did not start: %r %s" % (line, self.p.stderr.read()))
        self.port = int(line.rsplit(":", 1)[1])

    def request(self, method, path, body=None, raw=None, headers=None, timeout=120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Content-Type": "application/json"}
        if self.key:
            h["Authorization"] = "Bearer " + self.key
        h.update(headers or {})
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        text = r.read()
        c.close()
        try:
            j = json.loads(text)
        except ValueError:
            j = None
        return r.status, j, r.headers

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        rc = self.p.wait(timeout=60)
        check(rc == 0, "serve exits 0 after SIGTERM (got %d): %s" % (rc, self.p.stderr.read()))


def bad(srv, path, body, status, param, raw=None):
    st, j, _ = srv.request("POST", path, body, raw=raw)
    ok = st == status and j and "error" in j and j["error"].get("param") == param
    check(ok, "%s %r -> %d naming %r (got %d %r)" % (path, body if raw is None else raw[:40],
                                                      status, param, st, j))


def generate(out, *args):
    subprocess.run([BIN, "generate", "--cpu", "--threads", "2", "--quiet", "--out", out] +
                   list(args), check=True, capture_output=True)
    with open(os.path.join(out, "tokens.json")) as f:
        return json.load(f)["images"]


def flat(grid):
    return [x for row in grid for x in row]


def test_images(tmp):
    srv = Server("--arch", "micro-janus", "--batch", "4", "--max-body", "4096")
    st, j, _ = srv.request("GET", "/health")
    check(st == 200 and j == {"status": "ready"}, "health ready: %r" % j)
    st, j, _ = srv.request("GET", "/v1/models")
    check(st == 200 and j["object"] == "list" and j["data"][0]["id"] == "micro-janus" and
          j["data"][0]["object"] == "model", "models: %r" % j)

    # Equal to generate's images: PNG bytes and token grids.
    prompt = "a red apple on a wooden table"
    ref = generate(os.path.join(tmp, "gen"), "--arch", "micro-janus", "--prompt", prompt,
                   "--images-per-prompt", "2", "--sample-seed", "7", "--cfg", "3.5",
                   "--top-k", "50", "--temperature", "0.9")
    st, j, _ = srv.request("POST", "/v1/images/generations",
                           {"prompt": prompt, "n": 2, "seed": 7, "cfg": 3.5, "top_k": 50,
                            "temperature": 0.9, "size": "32x32", "model": "micro-janus",
                            "response_format": "b64_json", "tokens": True})
    check(st == 200 and len(j["data"]) == 2, "images: %d %r" % (st, str(j)[:200]))
    for i in range(2):
        with open(os.path.join(tmp, "gen", "0", "%d.png" % i), "rb") as f:
            png = f.read()
        check(base64.b64decode(j["data"][i]["b64_json"]) == png, "image %d's PNG bytes equal "
              "generate's" % i)
        check(j["data"][i]["tokens"] == flat(ref[i]["grid"]), "image %d's tokens equal "
              "generate's" % i)

    # 12 concurrent mixed requests equal to the same requests one at a time.
    reqs = [{"prompt": "prompt %d" % k, "n": 1 + k % 2, "seed": k, "tokens": k % 3 == 0,
             "top_p": 0.5 + 0.04 * k} for k in range(12)]
    one = [srv.request("POST", "/v1/images/generations", r) for r in reqs]
    with concurrent.futures.ThreadPoolExecutor(12) as ex:
        many = list(ex.map(lambda r: srv.request("POST", "/v1/images/generations", r), reqs))
    for k in range(12):
        check(one[k][0] == 200 and many[k][0] == 200 and one[k][1]["data"] == many[k][1]["data"],
              "concurrent request %d equals its run alone (%d, %d)" % (k, one[k][0], many[k][0]))

    # 400 naming the field, 404, 405, 413.
    G = "/v1/images/generations"
    bad(srv, G, None, 400, None, raw="{not json")
    bad(srv, G, None, 400, None, raw="[1, 2]")
    bad(srv, G, {"prompt": "x", "colour": "red"}, 400, "colour")
    bad(srv, G, {"prompt": 3}, 400, "prompt")
    bad(srv, G, {}, 400, "prompt")
    bad(srv, G, {"prompt": "x", "n": "2"}, 400, "n")
    bad(srv, G, {"prompt": "x", "n": 0}, 400, "n")
    bad(srv, G, {"prompt": "x", "n": 17}, 400, "n")
    bad(srv, G, {"prompt": "x", "temperature": 0}, 400, "temperature")
    bad(srv, G, {"prompt": "x", "top_p": 1.5}, 400, "top_p")
    bad(srv, G, {"prompt": "x", "seed": -1}, 400, "seed")
    bad(srv, G, {"prompt": "x", "tokens": 1}, 400, "tokens")
    bad(srv, G, {"prompt": "x", "size": "1024x1024"}, 400, "size")
    bad(srv, G, {"prompt": "x", "response_format": "url"}, 400, "response_format")
    bad(srv, G, {"prompt": "x", "model": "dall-e-3"}, 400, "model")
    bad(srv, "/v1/completions", {"prompt": "x"}, 400, "model")
    bad(srv, G, {"prompt": "x" * 5000}, 413, None)
    st, _, _ = srv.request("GET", "/v1/nothing")
    check(st == 404, "unknown path: 404 (got %d)" % st)
    st, _, _ = srv.request("GET", G)
    check(st == 405, "GET of a POST route: 405 (got %d)" % st)
    srv.stop()


def test_text(tmp):
    srv = Server("--arch", "micro-opt", "--max-new-tokens", "16", "--batch", "4")
    ref = generate(os.path.join(tmp, "text"), "--arch", "micro-opt", "--prompt-ids", "1,5,9",
                   "--max-new-tokens", "16", "--top-k", "1")
    st, j, _ = srv.request("POST", "/v1/completions",
                           {"prompt": [1, 5, 9], "max_tokens": 16, "top_k": 1, "seed": 0})
    check(st == 200 and j["object"] == "text_completion", "completion: %d %r" % (st, j))
    want = flat(ref[0]["grid"])
    got = j["choices"][0]["tokens"]
    eos = 2  # OPT's end id: the server stops there, generate runs on
    stop = want.index(eos) + 1 if eos in want else len(want)
    check(got == want[:stop], "greedy completion equals generate's: %r vs %r" % (got, want))
    check(j["usage"]["prompt_tokens"] == 3 and j["usage"]["completion_tokens"] == len(got),
          "usage: %r" % j["usage"])
    st, j, _ = srv.request("POST", "/v1/completions", {"prompt": [1, 5, 9], "max_tokens": 4,
                                                       "n": 3})
    check(st == 200 and len(j["choices"]) == 3 and
          all(len(c["tokens"]) <= 4 for c in j["choices"]), "n=3, max_tokens 4: %r" % j)
    bad(srv, "/v1/completions", {"prompt": [1, 5], "max_tokens": 17}, 400, "max_tokens")
    bad(srv, "/v1/completions", {"prompt": [1, -5]}, 400, "prompt")
    bad(srv, "/v1/completions", {"prompt": [1], "stream": True}, 400, "stream")
    bad(srv, "/v1/images/generations", {"prompt": "x"}, 400, "model")
    srv.stop()


def test_queue_timeout_key():
    srv = Server("--arch", "tiny-janus", "--batch", "1", "--max-queue", "1", "--timeout", "1",
                 "--api-key", "k3y", key="k3y")
    body = {"prompt": "slow", "seed": 1}
    G = "/v1/images/generations"
    results = {}

    def go(name):
        results[name] = srv.request("POST", G, body)

    a = threading.Thread(target=go, args=("a",))
    a.start()
    time.sleep(0.3)
    b = threading.Thread(target=go, args=("b",))
    b.start()
    time.sleep(0.3)
    st, j, h = srv.request("POST", G, body)
    check(st == 429 and h.get("Retry-After") == "1", "full queue: 429 with Retry-After "
          "(got %d %r)" % (st, j))
    a.join()
    b.join()
    for k in "ab":
        st, j, _ = results[k]
        check(st == 504 and "timeout" in j["error"]["message"], "past --timeout: 504 (%d %r)" %
              (st, j))
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    c.request("GET", "/v1/models")
    check(c.getresponse().status == 401, "no key: 401")
    srv.stop()


def test_drain():
    srv = Server("--arch", "micro-janus", "--batch", "1", "--max-n", "40")
    out = {}
    t = threading.Thread(target=lambda: out.update(r=srv.request(
        "POST", "/v1/images/generations", {"prompt": "long", "n": 40})))
    t.start()
    time.sleep(0.2)  # the request is in (40 images one at a time: about 1 s, 10-25 s in ASan)
    srv.p.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    st, j, _ = srv.request("GET", "/health")
    check(st == 200 and j == {"status": "draining"}, "health while draining: %r" % j)
    st, j, _ = srv.request("POST", "/v1/images/generations", {"prompt": "late"})
    check(st == 503, "a new request while draining: 503 (got %d)" % st)
    t.join()
    check(out["r"][0] == 200 and len(out["r"][1]["data"]) == 40, "the request in flight "
          "finished: %d" % out["r"][0])
    rc = srv.p.wait(timeout=60)
    check(rc == 0, "exit 0 after draining (got %d)" % rc)


def main():
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in [("images", lambda: test_images(tmp)), ("text", lambda: test_text(tmp)),
                         ("queue", test_queue_timeout_key), ("drain", test_drain)]:
            t = time.time()
            fn()
            print("%s: %.1f s" % (name, time.time() - t), flush=True)
    print("%d failure(s) in %.1f s" % (len(failures), time.time() - t0))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
