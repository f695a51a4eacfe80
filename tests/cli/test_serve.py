#!/usr/bin/env python3
"""test_serve.py - `flexdiag serve` end to end over loopback ($FLEXDIAG_BIN, CPU builtin models
and the golden OPT model folder of tests/golden/data/opt, copied with a chat template).

Every endpoint; images equal (PNG bytes and token grids) to `flexdiag generate`'s for the same
prompt, seed and settings, streamed (server-sent events) or not; a text model's greedy completion
equal to generate's; streamed completions and chat whose chunks add up to the non-streamed reply
(tokens, text, finish reason) and end in [DONE]; chat through the chatml and llama-3 templates
equal to a completion of the rendered prompt, 400s naming messages for a folder without a
template, one not rendered, llama-2's alternation and bad messages; /metrics parsed as
Prometheus text (families, histograms, counters agreeing with the requests made); a client that
hangs up mid-request (streamed or not) cancels it and frees its slots; 100 concurrent
requests of mixed sizes whose images each equal generate's; 12 concurrent requests equal to the
same requests made one at a time; 400s naming the field, 401, 404, 405, 413; 429 with
Retry-After under a tiny --max-queue and 504 past --timeout; SIGTERM draining (health says so,
new requests 503, the one in flight finishes, exit 0). Python stdlib only.
"""
import base64
import concurrent.futures
import http.client
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

BIN = os.environ.get("FLEXDIAG_BIN", "build/flexdiag")
DATA = os.environ.get("FLEXDIAG_TEST_DATA",
                      os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
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
        self.scrapes = 0  # GET /metrics made (each a 200 the next one counts)
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        if not line.startswith("listening on http://127.0.0.1:"):
            self.p.kill()
            raise SystemExit("serve did not start: %r %s" % (line, self.p.stderr.read()))
        self.port = int(line.rsplit(":", 1)[1])

    def headers(self):
        h = {"Content-Type": "application/json"}
        if self.key:
            h["Authorization"] = "Bearer " + self.key
        return h

    def request(self, method, path, body=None, raw=None, headers=None, timeout=120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = self.headers()
        h.update(headers or {})
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        text = r.read()
        c.close()
        try:
            j = json.loads(text)
        except ValueError:
            j = text.decode()
        return r.status, j, r.headers

    def stream(self, path, body, timeout=120):
        """POST body with "stream": true: (status, content type, [(event name, data)])."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        c.request("POST", path, body=json.dumps(dict(body, stream=True)), headers=self.headers())
        r = c.getresponse()
        events, name, data = [], None, None
        for raw in iter(r.readline, b""):
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
            elif line == "" and data is not None:
                events.append((name, data if data == "[DONE]" else json.loads(data)))
                name, data = None, None
        c.close()
        return r.status, r.headers.get("Content-Type"), events

    def metrics(self):
        st, text, h = self.request("GET", "/metrics")
        self.scrapes += 1
        check(st == 200 and h.get("Content-Type", "").startswith("text/plain; version=0.0.4"),
              "metrics: 200 text/plain 0.0.4 (%d %r)" % (st, h.get("Content-Type")))
        return parse_metrics(text)

    def stop(self):
        """SIGTERM; exit 0 expected. Returns what the server printed on stderr."""
        self.p.send_signal(signal.SIGTERM)
        rc = self.p.wait(timeout=60)
        err = self.p.stderr.read()
        check(rc == 0, "serve exits 0 after SIGTERM (got %d): %s" % (rc, err))
        return err


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*",?)*\})? '
                    r'(\S+)$')


def parse_metrics(text):
    """Prometheus text exposition 0.0.4: {name{labels}: value}, every line and family checked:
    a family's HELP and TYPE before its samples, counters and histogram buckets never negative,
    each histogram's buckets cumulative up to +Inf, which equals its _count."""
    values, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            parts = line.split(" ", 3)
            check(len(parts) == 4, "metrics comment line: %r" % line)
            if parts[1] == "TYPE":
                types[parts[2]] = parts[3]
            continue
        m = SAMPLE.match(line)
        check(m is not None, "metrics sample line: %r" % line)
        if not m:
            continue
        name, labels, v = m.group(1), m.group(2) or "", float(m.group(3))
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        check(family in types or name in types, "metric %s sampled before its # TYPE" % name)
        check(math.isfinite(v) and v >= 0, "metric %s%s = %r" % (name, labels, v))
        values[name + labels] = v
    for fam, typ in types.items():
        if typ != "histogram":
            continue
        series = {}
        for k, v in values.items():
            m = re.match(re.escape(fam) + r'_bucket\{(.*?),?le="([^"]+)"\}$', k)
            if m:
                series.setdefault(m.group(1), []).append((float(m.group(2)), v))
        check(series, "histogram %s has buckets" % fam)
        for lab, buckets in series.items():
            buckets.sort()
            counts = [v for _, v in buckets]
            check(counts == sorted(counts) and math.isinf(buckets[-1][0]),
                  "histogram %s{%s}: cumulative up to +Inf: %r" % (fam, lab, buckets))
            suffix = "{%s}" % lab if lab else ""
            check(values.get(fam + "_count" + suffix) == counts[-1],
                  "histogram %s{%s}: +Inf bucket equals _count" % (fam, lab))
    return values


def bad(srv, path, body, status, param, raw=None, says=None):
    st, j, _ = srv.request("POST", path, body, raw=raw)
    ok = st == status and isinstance(j, dict) and "error" in j and \
        j["error"].get("param") == param and (says is None or says in j["error"]["message"])
    check(ok, "%s %r -> %d naming %r%s (got %d %r)" % (
        path, body if raw is None else raw[:40], status, param,
        " saying %r" % says if says else "", st, j))


def generate(out, *args):
    subprocess.run([BIN, "generate", "--cpu", "--threads", "2", "--quiet", "--out", out] +
                   list(args), check=True, capture_output=True)
    with open(os.path.join(out, "tokens.json")) as f:
        return json.load(f)["images"]


def png(out, prompt_index, i):
    with open(os.path.join(out, str(prompt_index), "%d.png" % i), "rb") as f:
        return f.read()


def flat(grid):
    return [x for row in grid for x in row]


def until(what, cond, seconds=20):
    """Wait (polling the server from the test) until cond() holds; False past the deadline."""
    end = time.time() + seconds
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.05)
    check(False, "within %g s: %s" % (seconds, what))
    return False


# ---- images ----

def test_images(tmp):
    srv = Server("--arch", "micro-janus", "--batch", "4", "--max-body", "4096")
    st, j, _ = srv.request("GET", "/health")
    check(st == 200 and j == {"status": "ready"}, "health ready: %r" % j)
    st, j, _ = srv.request("GET", "/v1/models")
    check(st == 200 and j["object"] == "list" and j["data"][0]["id"] == "micro-janus" and
          j["data"][0]["object"] == "model", "models: %r" % j)

    # Equal to generate's images: PNG bytes and token grids, streamed or not.
    prompt = "a red apple on a wooden table"
    out = os.path.join(tmp, "gen")
    ref = generate(out, "--arch", "micro-janus", "--prompt", prompt, "--images-per-prompt", "2",
                   "--sample-seed", "7", "--cfg", "3.5", "--top-k", "50", "--temperature", "0.9")
    body = {"prompt": prompt, "n": 2, "seed": 7, "cfg": 3.5, "top_k": 50, "temperature": 0.9,
            "size": "32x32", "model": "micro-janus", "response_format": "b64_json",
            "tokens": True}
    st, j, _ = srv.request("POST", "/v1/images/generations", body)
    check(st == 200 and len(j["data"]) == 2, "images: %d %r" % (st, str(j)[:200]))
    for i in range(2):
        check(base64.b64decode(j["data"][i]["b64_json"]) == png(out, 0, i),
              "image %d's PNG bytes equal generate's" % i)
        check(j["data"][i]["tokens"] == flat(ref[i]["grid"]), "image %d's tokens equal "
              "generate's" % i)
    st, ctype, events = srv.stream("/v1/images/generations", body)
    check(st == 200 and ctype == "text/event-stream", "image stream: %d %r" % (st, ctype))
    done = [d for n, d in events if n == "image_generation.completed"]
    progress = [d for n, d in events if n == "image_generation.progress"]
    check(events and events[-1] == (None, "[DONE]"), "image stream ends with [DONE]")
    check(sorted(d["index"] for d in done) == [0, 1], "one completed event per image: %r" %
          [d.get("index") for d in done])
    for d in done:
        check(base64.b64decode(d["b64_json"]) == png(out, 0, d["index"]) and
              d["tokens"] == flat(ref[d["index"]]["grid"]) and d["size"] == "32x32",
              "streamed image %d equals generate's (PNG bytes, tokens)" % d["index"])
    check(progress and all(p["images"] == 2 and p["tokens_total"] == 128 for p in progress) and
          [p["tokens"] for p in progress] == sorted(p["tokens"] for p in progress) and
          progress[-1]["tokens"] == 128, "progress events, tokens rising to 128: %r" % progress)

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
    bad(srv, G, {"prompt": "x", "stream": "yes"}, 400, "stream")
    bad(srv, G, {"prompt": "x", "size": "1024x1024"}, 400, "size")
    bad(srv, G, {"prompt": "x", "response_format": "url"}, 400, "response_format")
    bad(srv, G, {"prompt": "x", "model": "dall-e-3"}, 400, "model")
    bad(srv, "/v1/completions", {"prompt": "x"}, 400, "model")
    bad(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, 400,
        "model")
    bad(srv, G, {"prompt": "x" * 5000}, 413, None)
    st, _, _ = srv.request("GET", "/v1/nothing")
    check(st == 404, "unknown path: 404 (got %d)" % st)
    st, _, _ = srv.request("GET", G)
    check(st == 405, "GET of a POST route: 405 (got %d)" % st)
    st, _, _ = srv.request("POST", "/metrics", {})
    check(st == 405, "POST /metrics: 405 (got %d)" % st)
    srv.stop()


# ---- text ----

def chunk_tokens(events, n):
    """The tokens, text and finish reason of each of n choices from completion or chat chunks."""
    toks, text, reason = [[] for _ in range(n)], [""] * n, [None] * n
    for _, d in events:
        if d == "[DONE]":
            continue
        for c in d["choices"]:
            i = c["index"]
            check(reason[i] is None, "choice %d: no chunk after its finish_reason" % i)
            toks[i] += c.get("tokens", [])
            piece = c["delta"].get("content", "") if "delta" in c else c["text"]
            text[i] += piece
            reason[i] = c["finish_reason"]
    return toks, text, reason


def check_stream(srv, path, body, n, what):
    """The streamed reply of body equals the non-streamed one, choice by choice."""
    st, j, _ = srv.request("POST", path, body)
    st2, ctype, events = srv.stream(path, body)
    check(st == 200 and st2 == 200 and ctype == "text/event-stream" and events and
          events[-1][1] == "[DONE]", "%s: 200s and a stream ending in [DONE] (%d %d %r)" %
          (what, st, st2, ctype))
    chat = path.endswith("chat/completions")
    obj = "chat.completion.chunk" if chat else "text_completion"
    check(all(d["object"] == obj and d["id"] == events[0][1]["id"] for _, d in events[:-1]),
          "%s: every chunk a %s of one id" % (what, obj))
    toks, text, reason = chunk_tokens(events, n)
    for i, c in enumerate(j["choices"]):
        want = c["message"]["content"] if chat else c["text"]
        check(toks[i] == c["tokens"] and text[i] == want and reason[i] == c["finish_reason"],
              "%s choice %d: chunks add up to the reply (%r %r %r vs %r %r %r)" % (
                  what, i, toks[i], text[i], reason[i], c["tokens"], want, c["finish_reason"]))
    per_token = [d for _, d in events[:-1] if d["choices"][0].get("tokens")]
    check(all(len(d["choices"]) == 1 and len(d["choices"][0]["tokens"]) == 1 for d in per_token)
          and len(per_token) == sum(len(c["tokens"]) for c in j["choices"]),
          "%s: one chunk per token" % what)
    if chat:
        firsts = {}
        for _, d in events[:-1]:
            firsts.setdefault(d["choices"][0]["index"], d["choices"][0]["delta"])
        check(all(f.get("role") == "assistant" for f in firsts.values()) and len(firsts) == n,
              "%s: each choice's first chunk says the role: %r" % (what, firsts))
    return j


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
    check_stream(srv, "/v1/completions", {"prompt": [1, 5, 9], "max_tokens": 12, "n": 3,
                                          "seed": 5}, 3, "micro-opt completion stream")
    bad(srv, "/v1/completions", {"prompt": [1, 5], "max_tokens": 17}, 400, "max_tokens")
    bad(srv, "/v1/completions", {"prompt": [1, -5]}, 400, "prompt")
    bad(srv, "/v1/completions", {"prompt": [1], "stream": 1}, 400, "stream")
    bad(srv, "/v1/images/generations", {"prompt": "x"}, 400, "model")
    bad(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, 400,
        "messages", says="no chat template")
    srv.stop()


# ---- chat ----

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
          "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
          "{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if "
          "(message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('"
          "Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + "
          "system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content ="
          " message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + "
          "'[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
          "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] "
          "| trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content "
          "%}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
          "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi there "}]
# the golden OPT model's tokenizer has 320 ids: a rendered prompt is about one token a byte
TEXT_FLAGS = ["--max-new-tokens", "16", "--max-prompt-len", "224"]


def opt_folder(tmp, name, template):
    """The golden OPT model (tokenizer.json; bos and eos "</s>") with chat_template template."""
    d = os.path.join(tmp, name)
    shutil.copytree(os.path.join(DATA, "golden", "data", "opt"), d)
    path = os.path.join(d, "tokenizer_config.json")
    with open(path) as f:
        cfg = json.load(f)
    if template is not None:
        cfg["chat_template"] = template
    with open(path, "w") as f:
        json.dump(cfg, f)
    return d


def chat_equals_completion(srv, rendered, what):
    """Chat of MESSAGES equals a completion of the prompt its template renders (sampled: the
    same draws for the same prompt and seed), streamed too."""
    body = {"max_tokens": 12, "n": 2, "seed": 11, "temperature": 1.0}
    st, c, _ = srv.request("POST", "/v1/chat/completions", dict(body, messages=MESSAGES))
    st2, p, _ = srv.request("POST", "/v1/completions", dict(body, prompt=rendered))
    check(st == 200 and st2 == 200 and c["object"] == "chat.completion" and
          [x["tokens"] for x in c["choices"]] == [x["tokens"] for x in p["choices"]] and
          [x["message"]["content"] for x in c["choices"]] == [x["text"] for x in p["choices"]],
          "%s: chat equals the completion of %r (%d %d %r %r)" % (what, rendered, st, st2, c, p))
    check_stream(srv, "/v1/chat/completions", dict(body, messages=MESSAGES), 2,
                 what + " chat stream")
    check_stream(srv, "/v1/completions", dict(body, prompt=rendered), 2,
                 what + " completion stream (text)")


def test_chat(tmp):
    C = "/v1/chat/completions"
    srv = Server("--model", opt_folder(tmp, "chatml", CHATML), *TEXT_FLAGS)
    chat_equals_completion(srv, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                           " Hi there <|im_end|>\n<|im_start|>assistant\n", "chatml")
    st, j, _ = srv.request("POST", C, {"messages": MESSAGES, "max_completion_tokens": 3})
    check(st == 200 and all(len(x["tokens"]) <= 3 for x in j["choices"]),
          "max_completion_tokens 3: %r" % j)
    bad(srv, C, {"messages": MESSAGES, "max_tokens": 3, "max_completion_tokens": 3}, 400,
        "max_tokens")
    bad(srv, C, {"max_tokens": 3}, 400, "messages", says="required")
    bad(srv, C, {"messages": []}, 400, "messages")
    bad(srv, C, {"messages": "hi"}, 400, "messages")
    bad(srv, C, {"messages": [{"role": "tool", "content": "x"}]}, 400, "messages",
        says="messages[0].role")
    bad(srv, C, {"messages": [MESSAGES[0], {"role": "user", "content": [
        {"type": "text", "text": "x"}]}]}, 400, "messages", says="messages[1].content")
    bad(srv, C, {"messages": [{"role": "user", "content": "x", "name": "me"}]}, 400, "messages",
        says="messages[0].name")
    bad(srv, C, {"messages": MESSAGES, "stop": ["\n"]}, 400, "stop")
    bad(srv, C, {"messages": MESSAGES, "model": "gpt-4o"}, 400, "model")
    srv.stop()

    # llama-3: its leading bos_token is the BOS the prompt's tokenization puts first
    srv = Server("--model", opt_folder(tmp, "llama3", LLAMA3), *TEXT_FLAGS)
    chat_equals_completion(srv, "<|start_header_id|>system<|end_header_id|>\n\nBe brief."
                           "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there"
                           "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
                           "llama-3")
    srv.stop()

    srv = Server("--model", opt_folder(tmp, "llama2", LLAMA2), *TEXT_FLAGS)
    st, j, _ = srv.request("POST", C, {"messages": MESSAGES, "max_tokens": 2})
    check(st == 200, "llama-2 chat: %d %r" % (st, j))
    bad(srv, C, {"messages": [MESSAGES[1], MESSAGES[1]]}, 400, "messages",
        says="roles must alternate")
    bad(srv, C, {"messages": MESSAGES[:1]}, 400, "messages", says="renders nothing")
    srv.stop()

    for name, template, says in [("none", None, "no chat template"),
                                 ("other", "{{ messages }}", "does not render")]:
        srv = Server("--model", opt_folder(tmp, name, template), *TEXT_FLAGS)
        bad(srv, C, {"messages": MESSAGES}, 400, "messages", says=says)
        st, j, _ = srv.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
        check(st == 200, "%s: completions still served (%d)" % (name, st))
        err = srv.stop()
        check(name != "other" or "is not one this server renders" in err,
              "serve says at start that the chat template is not rendered: %r" % err)


# ---- metrics ----

def test_metrics():
    srv = Server("--arch", "micro-janus", "--batch", "4", "--max-queue", "100")
    m = srv.metrics()
    check(m.get("flexdiag_requests_admitted_total") == 0 and m.get("flexdiag_kv_slots") == 4 and
          m.get("flexdiag_queue_capacity") == 100 and
          m.get('flexdiag_kv_cache_bytes{home="device"}', 0) > 0 and
          m.get('flexdiag_kv_cache_bytes{home="disk"}') == 0, "metrics of a fresh server: %r" % m)
    ns = [1, 3, 2]
    for k, n in enumerate(ns):
        st, _, _ = srv.request("POST", "/v1/images/generations", {"prompt": "m%d" % k, "n": n})
        check(st == 200, "metrics request %d: %d" % (k, st))
    srv.stream("/v1/images/generations", {"prompt": "streamed", "n": 2})
    bad(srv, "/v1/images/generations", {"prompt": "x", "n": 99}, 400, "n")
    # a stream's end is counted once its last byte left, maybe just after its client read it
    until("the stream counted finished",
          lambda: srv.metrics()["flexdiag_requests_finished_total"] == 4)
    m = srv.metrics()
    images = sum(ns) + 2
    want = {"flexdiag_requests_admitted_total": 4, "flexdiag_requests_finished_total": 4,
            "flexdiag_requests_failed_total": 0,
            'flexdiag_requests_cancelled_total{reason="client_gone"}': 0,
            'flexdiag_requests_rejected_total{reason="queue_full"}': 0,
            "flexdiag_sequences_admitted_total": images,
            "flexdiag_sequences_finished_total": images, "flexdiag_images_total": images,
            "flexdiag_tokens_total": images * 64, "flexdiag_queue_depth": 0,
            "flexdiag_kv_slots_in_use": 0, "flexdiag_live_sequences": 0,
            'flexdiag_http_responses_total{code="200"}': 4 + srv.scrapes - 1,
            'flexdiag_http_responses_total{code="400"}': 1,
            'flexdiag_request_duration_seconds_count{route="images"}': 4,
            'flexdiag_request_duration_seconds_count{route="completions"}': 0,
            "flexdiag_queue_wait_seconds_count": 4, "flexdiag_time_to_first_token_seconds_count": 4}
    for k, v in want.items():
        check(m.get(k) == v, "metrics %s = %r (want %r)" % (k, m.get(k), v))
    check(m.get("flexdiag_tokens_per_second", 0) > 0 and m.get("flexdiag_images_per_second", 0) > 0,
          "rates over the last 10 s: %r %r" % (m.get("flexdiag_tokens_per_second"),
                                                m.get("flexdiag_images_per_second")))
    check(m['flexdiag_request_duration_seconds_sum{route="images"}'] > 0, "latency sum > 0")
    srv.stop()


# ---- a client that hangs up ----

def hang_up(srv, body, until_bytes):
    """Send body to the images route on a raw socket; read until until_bytes appear in the reply
    (b"": until the request holds a slot, as /metrics says), then close the socket."""
    data = json.dumps(body).encode()
    admitted = srv.metrics()["flexdiag_sequences_admitted_total"]
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    s.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: "
              b"application/json\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
    got = b""
    while until_bytes and until_bytes not in got:
        more = s.recv(65536)
        check(more, "the stream ends before %r" % until_bytes)
        if not more:
            break
        got += more
    if not until_bytes:
        until("the request runs",
              lambda: srv.metrics()["flexdiag_sequences_admitted_total"] > admitted + 1)
    s.close()


def test_disconnect():
    srv = Server("--arch", "micro-janus", "--batch", "1", "--max-n", "256")
    gone = 'flexdiag_requests_cancelled_total{reason="client_gone"}'
    for k, (body, until_bytes) in enumerate([
            ({"prompt": "long", "n": 200}, b""),
            ({"prompt": "long", "n": 200, "stream": True}, b"image_generation.completed")]):
        what = "streamed" if until_bytes else "not streamed"
        before = srv.metrics()["flexdiag_images_total"]
        hang_up(srv, body, until_bytes)
        t0 = time.time()
        until("the %s request is cancelled once its client hung up" % what,
              lambda: srv.metrics()[gone] == k + 1)
        m = srv.metrics()
        print("%s: cancelled %.2f s after the hang-up, %d of 200 images made" %
              (what, time.time() - t0, m["flexdiag_images_total"] - before), flush=True)
        check(m["flexdiag_queue_depth"] == 0 and m["flexdiag_kv_slots_in_use"] == 0 and
              m["flexdiag_images_total"] - before < 200,
              "%s: the hung-up request's slots and queue are free: %r" % (what, m))
        t0 = time.time()
        st, j, _ = srv.request("POST", "/v1/images/generations", {"prompt": "next"}, timeout=30)
        check(st == 200 and time.time() - t0 < 10, "a request after the hang-up: %d in %.1f s" %
              (st, time.time() - t0))
    m = srv.metrics()
    check(m["flexdiag_requests_finished_total"] == 2 and
          m['flexdiag_http_responses_total{code="499"}'] == 1,
          "finished 2, one 499 (not sent) counted: %r" % m)
    srv.stop()


# ---- 100 concurrent requests ----

def test_concurrent(tmp):
    """100 concurrent requests over 5 (prompt, seed) pairs, one in 7 with n 2 (the image decoding
    dominates: 115 images take about 7 s, 90 s under the sanitizers), a quarter streamed: image i
    of each equals image i of generate's run of its pair."""
    pairs = [("shape %d" % k, 100 + k) for k in range(5)]
    refs = []
    for k, (prompt, seed) in enumerate(pairs):
        out = os.path.join(tmp, "pair%d" % k)
        generate(out, "--arch", "micro-janus", "--prompt", prompt, "--images-per-prompt", "2",
                 "--sample-seed", str(seed))
        refs.append([png(out, 0, i) for i in range(2)])
    srv = Server("--arch", "micro-janus", "--batch", "8", "--max-queue", "400", "--max-n", "2")
    reqs = [(k % 5, 2 if k % 7 == 0 else 1, k % 4 == 0) for k in range(100)]

    def run(r):
        pair, n, streamed = r
        body = {"prompt": pairs[pair][0], "seed": pairs[pair][1], "n": n}
        if not streamed:
            st, j, _ = srv.request("POST", "/v1/images/generations", body)
            return st, {i: base64.b64decode(d["b64_json"]) for i, d in enumerate(j["data"])}
        st, _, events = srv.stream("/v1/images/generations", body)
        return st, {d["index"]: base64.b64decode(d["b64_json"]) for name, d in events
                    if name == "image_generation.completed"}

    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(100) as ex:
        got = list(ex.map(run, reqs))
    secs = time.time() - t0
    images = sum(n for _, n, _ in reqs)
    print("100 concurrent requests, %d images: %.1f s (%.0f img/s)" % (images, secs,
                                                                      images / secs), flush=True)
    for k, ((pair, n, streamed), (st, imgs)) in enumerate(zip(reqs, got)):
        check(st == 200 and sorted(imgs) == list(range(n)) and
              all(imgs[i] == refs[pair][i] for i in range(n)),
              "concurrent request %d (pair %d, n %d%s): images equal generate's" %
              (k, pair, n, ", streamed" if streamed else ""))
    # a stream's end is counted once its last byte left, maybe just after its client read it
    until("the 100 requests counted finished",
          lambda: srv.metrics()["flexdiag_requests_finished_total"] == 100)
    check(srv.metrics()["flexdiag_images_total"] == images, "metrics: %d images" % images)
    srv.stop()


# ---- limits ----

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
    st, _, _ = srv.request("POST", G, dict(body, stream=True, seed=2), timeout=30)
    check(st == 200, "a streamed request past --timeout: 200 (got %d)" % st)
    _, _, events = srv.stream(G, dict(body, seed=3))
    check(events and "error" in events[-1][1] and
          "timeout" in events[-1][1]["error"]["message"],
          "a streamed request past --timeout ends with an error event: %r" % events[-1:])
    until("4 timeouts counted (a stream's once its last byte left)",
          lambda: srv.metrics()['flexdiag_requests_cancelled_total{reason="timeout"}'] == 4)
    check(srv.metrics()['flexdiag_requests_rejected_total{reason="queue_full"}'] == 1,
          "metrics: 1 full queue")
    for path in ("/v1/models", "/metrics"):
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        c.request("GET", path)
        check(c.getresponse().status == 401, "no key: 401 for %s" % path)
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
    m = srv.metrics()
    check(m['flexdiag_requests_rejected_total{reason="draining"}'] == 1,
          "metrics while draining: one 503 counted")
    t.join()
    check(out["r"][0] == 200 and len(out["r"][1]["data"]) == 40, "the request in flight "
          "finished: %d" % out["r"][0])
    rc = srv.p.wait(timeout=60)
    check(rc == 0, "exit 0 after draining (got %d)" % rc)


def main():
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in [("images", lambda: test_images(tmp)), ("text", lambda: test_text(tmp)),
                         ("chat", lambda: test_chat(tmp)), ("metrics", test_metrics),
                         ("disconnect", test_disconnect),
                         ("concurrent", lambda: test_concurrent(tmp)),
                         ("queue", test_queue_timeout_key), ("drain", test_drain)]:
            t = time.time()
            fn()
            print("%s: %.1f s" % (name, time.time() - t), flush=True)
    print("%d failure(s) in %.1f s" % (len(failures), time.time() - t0))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
