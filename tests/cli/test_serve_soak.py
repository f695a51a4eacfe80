#!/usr/bin/env python3
"""test_serve_soak.py - a bounded soak of `flexdiag serve` under tools/serve_load.py (its path
the first argument; $FLEXDIAG_BIN; the CPU builtin models). Python stdlib only.

micro-janus (images, n 1 to 4) and micro-opt (completions, max_tokens 8, 32 or 64) are each
served with --batch 8 --max-queue 16 and loaded at the same time by 16 concurrent clients for
SOAK_S seconds, a quarter of the requests streamed, the prompts and seeds from a pool of 4.
Asserts: every outcome a 200 or a 429 (the 16-image queue is too small for 16 clients asking up
to 4 images each, so some 429s are expected; they must match the server's queue_full count);
every image equal to `flexdiag generate`'s for its prompt and seed (PNG bytes); every
completion choice equal to the first reply for its prompt, seed and length, and no longer than
its max_tokens; /metrics: no failed or cancelled requests, images and finished requests as
counted by the clients; VmRSS not growing past RSS_SLACK_KIB over the soak (below; not under
ASan); SIGTERM exit 0 (under ASan, LeakSanitizer then checks the exit for leaks).
"""
import http.client
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

BIN = os.environ.get("FLEXDIAG_BIN", "build/flexdiag")
SOAK_S = 30
WARM_S = 5
CLIENTS = 16
# VmRSS after a warm-up load (WARM_S seconds at full concurrency: the connection threads' stacks,
# malloc's per-thread arenas and the engine's buffers are in place by then) against the largest
# sample of the soak. glibc keeps freed memory in its arenas and the peak concurrency of the
# moment sets how much, so RSS moves a little without a leak: 1-3 MiB over the soak on the
# release build (2-core VM, about 130 image and 4,700 text requests). The slack is several
# times that, and about what a leak of 3.5 KiB per text request (a reply's body) would add.
# Not checked under ASan: its quarantine holds freed memory (256 MiB by default), so RSS grows
# there by design (32 MiB over the text soak); LeakSanitizer checks the exit instead.
RSS_SLACK_KIB = 16 * 1024
failures = []
with open(BIN, "rb") as f:
    ASAN = b"__asan_init" in f.read()  # an AddressSanitizer build, linked either way


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def load_tool(path):
    """tools/serve_load.py as a module (no bytecode cache written into the source tree)."""
    sys.dont_write_bytecode = True
    spec = importlib.util.spec_from_file_location("serve_load", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Server:
    """A `flexdiag serve --port 0` process; its port read from the "listening on" line."""

    def __init__(self, *args):
        cmd = [BIN, "serve", "--cpu", "--threads", "2", "--port", "0", "--batch", "8",
               "--max-queue", "16"] + list(args)
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        if not line.startswith("listening on http://127.0.0.1:"):
            self.p.kill()
            raise SystemExit("serve did not start: %r %s" % (line, self.p.stderr.read()))
        self.url = line.strip().split(" ", 2)[2]
        self.port = int(self.url.rsplit(":", 1)[1])

    def rss_kib(self):
        with open("/proc/%d/status" % self.p.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def metrics(self):
        """GET /metrics: {sample name with its labels: value}."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
        return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in text.splitlines()
                                          if not line.startswith("#"))}

    def stop(self, what):
        self.p.send_signal(signal.SIGTERM)
        rc = self.p.wait(timeout=120)
        err = self.p.stderr.read()
        check(rc == 0, "%s: serve exits 0 after SIGTERM (got %d): %s" % (what, rc, err[-2000:]))


def references(tool, tmp, max_n, pool):
    """{pair: [PNG bytes of images 0 .. max_n-1]} from `flexdiag generate`."""
    refs = {}
    for p in range(pool):
        prompt, seed = tool.pool_pair("images", p)
        out = os.path.join(tmp, "ref%d" % p)
        subprocess.run([BIN, "generate", "--cpu", "--threads", "2", "--quiet", "--out", out,
                        "--arch", "micro-janus", "--prompt", prompt, "--images-per-prompt",
                        str(max_n), "--sample-seed", str(seed)], check=True, capture_output=True)
        refs[p] = []
        for i in range(max_n):
            with open(os.path.join(out, "0", "%d.png" % i), "rb") as f:
                refs[p].append(f.read())
    return refs


class Soak:
    """One server under load: its runs' summaries (the warm-up's, the soak's), the bad replies
    seen, VmRSS samples over the soak."""

    def __init__(self, tool, srv, kind, check_reply):
        self.tool, self.srv, self.kind, self.check_reply = tool, srv, kind, check_reply
        self.summaries, self.bad, self.rss = [], [], []

    def on_reply(self, pair, body, got):
        why = self.check_reply(pair, body, got)
        if why:
            self.bad.append(why)

    def run(self, seconds, seed):
        o = self.tool.Options(self.srv.url, self.kind, clients=CLIENTS, duration=seconds,
                              seed=seed)
        self.summaries.append((o, self.tool.run(o, self.on_reply)))

    def total(self, key):
        """An outcome's count (an int key) or a summary's number over the runs."""
        if isinstance(key, int):
            return sum(sm["outcomes"].get(key, 0) for _, sm in self.summaries)
        return sum(sm[key] for _, sm in self.summaries)


def image_reply(refs):
    def check_reply(pair, body, got):
        n = body["n"]
        if sorted(got) != list(range(n)) or any(got[i] != refs[pair][i] for i in range(n)):
            return "pair %d n %d%s: images differ from generate's" % (
                pair, n, " (streamed)" if body.get("stream") else "")
        return None
    return check_reply


def text_reply(pair, body, got):
    if sorted(got) != list(range(body["n"])) or \
            any(not 0 < len(t) <= body["max_tokens"] for t in got.values()):
        return "pair %d %r: choices %r" % (pair, body, got)
    return None


def sample_rss(soaks, stop):
    while not stop.wait(1.0):
        for s in soaks:
            s.rss.append(s.srv.rss_kib())


def run_all(soaks, seconds, seed, sample):
    """Every soak's load at once for seconds; with sample, VmRSS each second from its start to
    its end."""
    runs = [threading.Thread(target=s.run, args=(seconds, seed)) for s in soaks]
    stop = threading.Event()
    sampler = threading.Thread(target=sample_rss, args=(soaks, stop))
    if sample:
        for s in soaks:
            s.rss.append(s.srv.rss_kib())
        sampler.start()
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    if sample:
        stop.set()
        sampler.join()
        for s in soaks:
            s.rss.append(s.srv.rss_kib())


def verdict(s, what):
    """The assertions on one server, after its warm-up and soak."""
    o, sm = s.summaries[-1]
    print("\n".join("%s: %s" % (what, line) for line in s.tool.report(o, sm)), flush=True)
    print("%s: VmRSS %d KiB after the warm-up, %d at the end, %d at most%s" % (
        what, s.rss[0], s.rss[-1], max(s.rss), " (not bounded under ASan)" if ASAN else ""),
        flush=True)
    others = {k: v for _, x in s.summaries for k, v in x["outcomes"].items()
              if k not in (200, 429)}
    check(sm["outcomes"].get(200, 0) > 0 and not others,
          "%s: 200s and 429s only: %r" % (what, [x["outcomes"] for _, x in s.summaries]))
    check(not s.bad, "%s: %d bad replies, first %s" % (what, len(s.bad), s.bad[:1]))
    check(s.total("mismatches") == 0, "%s: %d replies differ from an earlier equal request" % (
        what, s.total("mismatches")))
    check(ASAN or max(s.rss) - s.rss[0] <= RSS_SLACK_KIB, "%s: VmRSS grew %d KiB over the soak "
          "(slack %d KiB): %r" % (what, max(s.rss) - s.rss[0], RSS_SLACK_KIB, s.rss))
    counted(s, what)


def counted(s, what):
    """The server's counters agree with its clients': 429s are queue_full rejections, 200s
    finished requests (a stream's once its last byte left, so waited for), the images received
    all the images made; nothing failed or was cancelled."""
    want = {'flexdiag_requests_rejected_total{reason="queue_full"}': s.total(429),
            "flexdiag_requests_finished_total": s.total(200),
            "flexdiag_requests_failed_total": 0,
            'flexdiag_requests_cancelled_total{reason="client_gone"}': 0,
            'flexdiag_requests_cancelled_total{reason="timeout"}': 0}
    if s.kind == "images":
        want["flexdiag_images_total"] = s.total("images")
    end = time.time() + 10
    m = s.srv.metrics()
    while m["flexdiag_requests_finished_total"] < s.total(200) and time.time() < end:
        time.sleep(0.1)
        m = s.srv.metrics()
    got = {k: m.get(k) for k in want}
    check(got == want, "%s: the server's counters %r, the clients' %r" % (what, got, want))


def main():
    tool = load_tool(sys.argv[1])
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        refs = references(tool, tmp, 4, 4)
    images = Server("--arch", "micro-janus", "--max-n", "4")
    text = Server("--arch", "micro-opt", "--max-new-tokens", "64")
    soaks = [Soak(tool, images, "images", image_reply(refs)),
             Soak(tool, text, "completions", text_reply)]
    run_all(soaks, WARM_S, 2, False)
    run_all(soaks, SOAK_S, 1, True)
    for s, what in zip(soaks, ["micro-janus", "micro-opt"]):
        verdict(s, what)
        s.srv.stop(what)
    print("%d failure(s) in %.1f s" % (len(failures), time.time() - t0))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
