"""Drives `keel serve` with the official `openai` Python client for
host-linux/tests/serve.rs; prints one JSON document on stdout.

usage: client.py MODE BASE_URL MODEL [ARGS...]
  basic CHAT COMPLETE N STOP  chat (user message CHAT) and completion (prompt COMPLETE),
                           streaming and not, at temperature 0; two seeded samples; a
                           completion cut at STOP
  load N_REQ N PROMPTS     N_REQ concurrent streaming completions (PROMPTS: a JSON list,
                           request i uses PROMPTS[i % len]); each ends "ok" with its text and
                           usage, or with its HTTP status and error body
  disconnect PROMPT N      a streaming completion closed by the client after 3 events
"""

import json
import sys
import threading

import http.client
import urllib.parse

import openai


def client(base):
    # No retries: a 503 must reach the test as a 503.
    return openai.OpenAI(base_url=base + "/v1", api_key="keel", max_retries=0, timeout=600.0)


def chat(c, model, prompt, n, stream):
    msgs = [{"role": "user", "content": prompt}]
    if not stream:
        r = c.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=n)
        return {"text": r.choices[0].message.content, "finish": r.choices[0].finish_reason, "completion_tokens": r.usage.completion_tokens}
    text, finish, usage, role = "", None, None, None
    for ch in c.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=n, stream=True, stream_options={"include_usage": True}):
        if ch.choices:
            d = ch.choices[0].delta
            role = role or d.role
            text += d.content or ""
            finish = ch.choices[0].finish_reason or finish
        if ch.usage:
            usage = ch.usage.completion_tokens
    return {"text": text, "finish": finish, "completion_tokens": usage, "role": role}


def completion(c, model, prompt, n, stream, **kw):
    if not stream:
        r = c.completions.create(model=model, prompt=prompt, max_tokens=n, **kw)
        return {"text": r.choices[0].text, "finish": r.choices[0].finish_reason, "completion_tokens": r.usage.completion_tokens}
    text, finish, usage = "", None, None
    for ch in c.completions.create(model=model, prompt=prompt, max_tokens=n, stream=True, stream_options={"include_usage": True}, **kw):
        if ch.choices:
            text += ch.choices[0].text or ""
            finish = ch.choices[0].finish_reason or finish
        if ch.usage:
            usage = ch.usage.completion_tokens
    return {"text": text, "finish": finish, "completion_tokens": usage}


def basic(base, model, chat_prompt, prompt, n, stop):
    c = client(base)
    out = {
        "models": [m.id for m in c.models.list()],
        "chat": chat(c, model, chat_prompt, n, False),
        "chat_stream": chat(c, model, chat_prompt, n, True),
        "completion": completion(c, model, prompt, n, False, temperature=0),
        "completion_stream": completion(c, model, prompt, n, True, temperature=0),
        "seeded": [completion(c, model, prompt, n, False, temperature=0.9, top_p=0.9, seed=7)["text"] for _ in range(2)],
        "stopped": completion(c, model, prompt, n, True, temperature=0, stop=[stop]),
    }
    try:
        c.completions.create(model="no-such-model", prompt=prompt, max_tokens=1)
        out["unknown_model"] = None
    except openai.NotFoundError as e:
        out["unknown_model"] = {"status": e.status_code, "code": e.code}
    return out


def load(base, model, n_req, n, prompts):
    c = client(base)
    results = [None] * n_req
    start = threading.Barrier(n_req)

    def one(i):
        start.wait()
        try:
            r = completion(c, model, prompts[i % len(prompts)], n, True, temperature=0)
            results[i] = {"outcome": "ok", **r}
        except openai.APIStatusError as e:
            results[i] = {"outcome": "status", "status": e.status_code, "retry_after": e.response.headers.get("retry-after"), "body": e.response.text}
        except Exception as e:  # noqa: BLE001 -- reported to the test, which fails on it
            results[i] = {"outcome": "error", "error": repr(e)}

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n_req)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def disconnect(base, model, prompt, n):
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True})
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    events = 0
    while events < 3:
        line = r.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            events += 1
    status = r.status
    conn.sock.close()  # the client goes away mid-stream
    conn.close()
    return {"status": status, "events_read": events}


def main():
    mode, base, model = sys.argv[1:4]
    a = sys.argv[4:]
    if mode == "basic":
        out = basic(base, model, a[0], a[1], int(a[2]), a[3])
    elif mode == "load":
        out = load(base, model, int(a[0]), int(a[1]), json.loads(a[2]))
    elif mode == "disconnect":
        out = disconnect(base, model, a[0], int(a[1]))
    else:
        sys.exit(f"unknown mode {mode}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
