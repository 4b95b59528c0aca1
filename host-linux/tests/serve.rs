//! `keel serve` on SmolLM2, driven by the official `openai` Python client
//! (tests/serve/client.py; tests/run.sh installs it from tests/serve/requirements.txt) and
//! by curl:
//! - chat and completion, streaming and not, give at temperature 0 the text of
//!   `keel run --temp 0` for the same prompt (and template, with `--chat`);
//! - 64 concurrent streaming requests against 2 slots and a queue of 8 each complete with
//!   the right text or get a 503 with Retry-After; `/metrics` agrees; the server's peak RSS
//!   stays within its printed memory plan plus [`RSS_MARGIN`];
//! - bad requests get the right status and an OpenAI-style JSON error, a client that
//!   disconnects mid-stream frees its slot, and the server keeps serving.
//! Each test starts its own server on a free port (port 0; the address is read from its
//! output) and kills it when the test ends, also on a panic. Timeouts only turn a hang
//! into a failure; nothing is timed.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// What the server may use beyond its printed plan (model + slots × arena + tokenizer):
/// the HTTP runtime, thread stacks, request buffers and the allocator's slack.
const RSS_MARGIN: u64 = 64 << 20;

/// A hang becomes a failure after this.
const HANG: Duration = Duration::from_secs(600);

fn keel() -> Command {
    keel_test_support::keel_command(env!("CARGO_BIN_EXE_keel"))
}

fn repo() -> PathBuf {
    keel_test_support::repo_root()
}

/// `python3` with the `openai` package, or `None` (after a SKIPPED line) when it is missing
/// outside CI; with `KEEL_REQUIRE_MODELS=1` (tests/run.sh) a missing client fails.
fn openai_client() -> Option<()> {
    let ok = Command::new("python3").args(["-c", "import openai"]).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    if ok {
        return Some(());
    }
    let hint = "python3 -m pip install -r tests/serve/requirements.txt";
    if std::env::var("KEEL_REQUIRE_MODELS").as_deref() == Ok("1") {
        panic!("the openai Python client is missing and KEEL_REQUIRE_MODELS=1; run `{hint}`");
    }
    eprintln!("SKIPPED: the openai Python client is missing; run `{hint}`");
    None
}

/// A running `keel serve`; killed when dropped.
struct Server {
    child: Child,
    base: String,
    /// The total of the printed memory plan, in bytes.
    plan: u64,
    model: String,
}

impl Server {
    fn start(model: &Path, flags: &[&str]) -> Server {
        let mut child = keel().arg("serve").arg("-m").arg(model).args(["--port", "0"]).args(flags).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("starting keel serve");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[server] {line}");
                let _ = tx.send(line);
            }
        });
        let mut server = Server { child, base: String::new(), plan: 0, model: model.file_stem().unwrap().to_string_lossy().into_owned() };
        loop {
            let line = rx.recv_timeout(HANG).expect("keel serve did not print its address (it ended or hung)");
            if let Some(i) = line.find("memory plan:") {
                let bytes = line[i..].split_once(" bytes)").and_then(|(head, _)| head.rsplit_once('(')).and_then(|(_, n)| n.parse().ok());
                server.plan = bytes.unwrap_or_else(|| panic!("no byte total in the plan line: {line}"));
            }
            if let Some(i) = line.find("listening on ") {
                server.base = line[i + "listening on ".len()..].trim().to_string();
                break;
            }
        }
        assert!(server.plan > 0, "the memory plan was not printed before listening");
        server
    }

    /// Runs tests/serve/client.py in `mode`; its JSON output.
    fn client(&self, mode: &str, args: &[&str]) -> Value {
        let out = Command::new("python3").arg(repo().join("tests/serve/client.py")).args([mode, &self.base, &self.model]).args(args).output().expect("running python3");
        assert!(out.status.success(), "client.py {mode} failed:\n{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("client.py {mode} printed no JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
    }

    /// curl: the status and body of one request (`body`: JSON text, or `@file`).
    fn curl(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let mut c = Command::new("curl");
        c.args(["-sS", "-N", "--max-time", "600", "-X", method, "-w", "\n%{http_code}", "-H", "Content-Type: application/json"]);
        if let Some(b) = body {
            c.args(["--data-binary", b]);
        }
        let out = c.arg(format!("{}{path}", self.base)).output().expect("running curl (apt-get install curl)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or_else(|| panic!("curl {path}: no status ({}): {text}", String::from_utf8_lossy(&out.stderr)));
        (code.trim().parse().unwrap_or_else(|_| panic!("curl {path}: bad status line '{code}': {}", String::from_utf8_lossy(&out.stderr))), body.to_string())
    }

    fn json(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let (status, text) = self.curl(method, path, body);
        (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}")))
    }

    /// The `/metrics` values by name.
    fn metrics(&self) -> std::collections::HashMap<String, f64> {
        let (status, text) = self.curl("GET", "/metrics", None);
        assert_eq!(status, 200);
        text.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split_once(' ')).map(|(k, v)| (k.to_string(), v.parse().unwrap())).collect()
    }

    /// The metrics once no request is waiting or in a slot.
    fn idle_metrics(&self) -> std::collections::HashMap<String, f64> {
        for _ in 0..6000 {
            let m = self.metrics();
            if m["keel_slots_busy"] == 0.0 && m["keel_queue_depth"] == 0.0 {
                return m;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the server never became idle: {:?}", self.metrics());
    }

    /// The server's peak resident memory (VmHWM), bytes.
    fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kb: u64 = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).expect("VmHWM in /proc/PID/status");
        kb * 1024
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `keel run --temp 0 --json`'s text for `prompt` (with the chat template when `chat`).
fn keel_run(model: &Path, prompt: &str, n: usize, ctx: usize, chat: bool) -> String {
    let mut c = keel();
    c.arg("run").arg("-m").arg(model).args(["--temp", "0", "--json", "-n", &n.to_string(), "-c", &ctx.to_string(), "-p", prompt]);
    if chat {
        c.arg("--chat");
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "keel run: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["text"].as_str().unwrap().to_string()
}

/// The text of a server-sent event stream (`delta.content` or `text` of each chunk) and
/// whether it ended with `[DONE]`.
fn sse_text(body: &str) -> (String, bool) {
    let mut text = String::new();
    let mut done = false;
    for data in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        for c in v["choices"].as_array().unwrap() {
            text.push_str(c["delta"]["content"].as_str().or(c["text"].as_str()).unwrap_or(""));
        }
    }
    (text, done)
}

const CHAT: &str = "What is the capital of France?";
const COMPLETE: &str = "The capital of France is";

#[test]
fn openai_client_and_curl_get_keel_runs_text() {
    let Some(model) = keel_test_support::smollm2_path() else { return };
    let Some(()) = openai_client() else { return };
    let (n, ctx) = (24, 512);
    let want_chat = keel_run(&model, CHAT, n, ctx, true);
    let want = keel_run(&model, COMPLETE, n, ctx, false);
    assert!(!want_chat.is_empty() && !want.is_empty());
    let s = Server::start(&model, &["--slots", "1", "-c", &ctx.to_string()]);

    // The official client: chat and completion, streaming and not.
    let stop = want.split_whitespace().nth(3).expect("a 4th word to stop at");
    let got = s.client("basic", &[CHAT, COMPLETE, &n.to_string(), stop]);
    assert_eq!(got["models"], serde_json::json!([s.model]));
    for (key, want) in [("chat", &want_chat), ("chat_stream", &want_chat), ("completion", &want), ("completion_stream", &want)] {
        assert_eq!(got[key]["text"].as_str(), Some(want.as_str()), "{key}: {}", got[key]);
        assert!(got[key]["completion_tokens"].as_u64().is_some_and(|t| t >= 1 && t <= n as u64), "{key}: {}", got[key]);
    }
    assert_eq!(got["chat_stream"]["role"], "assistant");
    // The same seed gives the same sample.
    assert_eq!(got["seeded"][0], got["seeded"][1]);
    // A stop string cuts the text before it.
    let cut = &want[..want.find(stop).unwrap()];
    assert_eq!(got["stopped"]["text"].as_str(), Some(cut), "{}", got["stopped"]);
    assert_eq!(got["stopped"]["finish"], "stop");
    assert_eq!(got["unknown_model"]["status"], 404);
    assert_eq!(got["unknown_model"]["code"], "model_not_found");

    // curl: the same texts, as JSON and as server-sent events.
    let chat_body = serde_json::json!({"model": s.model, "messages": [{"role": "user", "content": CHAT}], "temperature": 0, "max_tokens": n}).to_string();
    let (status, v) = s.json("POST", "/v1/chat/completions", Some(&chat_body));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"].as_str(), Some(want_chat.as_str()));
    assert_eq!(v["object"], "chat.completion");
    let u = &v["usage"];
    assert_eq!(u["total_tokens"].as_u64(), Some(u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()));
    let mut stream_body: Value = serde_json::from_str(&chat_body).unwrap();
    stream_body["stream"] = true.into();
    let (status, text) = s.curl("POST", "/v1/chat/completions", Some(&stream_body.to_string()));
    assert_eq!(status, 200);
    assert_eq!(sse_text(&text), (want_chat.clone(), true));
    let body = serde_json::json!({"model": s.model, "prompt": COMPLETE, "temperature": 0, "max_tokens": n});
    let (status, v) = s.json("POST", "/v1/completions", Some(&body.to_string()));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"].as_str(), Some(want.as_str()));
    let mut stream_body = body.clone();
    stream_body["stream"] = true.into();
    let (status, text) = s.curl("POST", "/v1/completions", Some(&stream_body.to_string()));
    assert_eq!(status, 200);
    assert_eq!(sse_text(&text), (want.clone(), true));

    let (status, v) = s.json("GET", "/health", None);
    assert_eq!((status, v["status"].as_str()), (200, Some("ok")));
}

#[test]
fn bounded_load_completes_or_gets_503() {
    let Some(model) = keel_test_support::smollm2_path() else { return };
    let Some(()) = openai_client() else { return };
    let (n, ctx, n_req) = (16, 256, 64);
    let prompts = [COMPLETE, "Once upon a time", "The three primary colors are"];
    let want: Vec<String> = prompts.iter().map(|p| keel_run(&model, p, n, ctx, false)).collect();
    let s = Server::start(&model, &["--slots", "2", "--queue", "8", "-c", &ctx.to_string(), "-t", "1"]);
    let results = s.client("load", &[&n_req.to_string(), &n.to_string(), &serde_json::to_string(&prompts).unwrap()]);
    let results = results.as_array().unwrap();
    assert_eq!(results.len(), n_req, "every request is accounted for");
    let (mut ok, mut busy, mut tokens) = (0, 0, 0);
    for (i, r) in results.iter().enumerate() {
        match r["outcome"].as_str() {
            Some("ok") => {
                assert_eq!(r["text"].as_str(), Some(want[i % prompts.len()].as_str()), "request {i}: {r}");
                assert!(r["finish"].is_string(), "request {i}: {r}");
                tokens += r["completion_tokens"].as_u64().unwrap_or_else(|| panic!("request {i}: no usage: {r}"));
                ok += 1;
            }
            Some("status") => {
                assert_eq!(r["status"], 503, "request {i}: {r}");
                assert!(r["retry_after"].as_str().is_some_and(|s| s.parse::<u32>().is_ok()), "request {i}: 503 without Retry-After: {r}");
                let body: Value = serde_json::from_str(r["body"].as_str().unwrap()).unwrap();
                assert_eq!(body["error"]["code"], "server_busy", "request {i}: {r}");
                busy += 1;
            }
            _ => panic!("request {i} neither completed nor got a 503: {r}"),
        }
    }
    // The first 10 requests (2 slots + 8 queued) are always admitted.
    assert!(ok >= 10, "{ok} completed, {busy} got 503");
    let m = s.idle_metrics();
    assert_eq!(m["keel_requests_completed_total"], ok as f64, "{m:?}");
    assert_eq!(m["keel_requests_admitted_total"], ok as f64, "{m:?}");
    assert_eq!(m["keel_requests_rejected_total"], busy as f64, "{m:?}");
    assert_eq!(m["keel_requests_cancelled_total"] + m["keel_requests_failed_total"], 0.0, "{m:?}");
    assert_eq!(m["keel_generated_tokens_total"], tokens as f64, "{m:?}");
    assert_eq!(m["keel_slots_total"], 2.0);
    assert!(m["keel_generation_tokens_per_second"] > 0.0, "{m:?}");
    let peak = s.peak_rss();
    assert!(peak <= s.plan + RSS_MARGIN, "peak RSS {peak} bytes is beyond the printed plan {} + margin {RSS_MARGIN}", s.plan);
}

#[test]
fn bad_requests_get_json_errors_and_the_server_keeps_serving() {
    let Some(model) = keel_test_support::smollm2_path() else { return };
    let Some(()) = openai_client() else { return };
    let s = Server::start(&model, &["--slots", "1", "-c", "512"]);
    let id = s.model.clone();
    let error = |status: u16, v: &Value, code: &str| {
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert_eq!(v["error"]["code"], code, "{v}");
        status
    };
    let post = |path: &str, body: &str| s.json("POST", path, Some(body));

    let (st, v) = post("/v1/chat/completions", "{\"model\": \"x\", \"messages\": [");
    assert_eq!(error(st, &v, "invalid_json"), 400);
    let (st, v) = post("/v1/completions", &serde_json::json!({"model": id, "prompt": "Hi", "max_tokens": "many"}).to_string());
    assert_eq!(error(st, &v, "invalid_type"), 400);
    let (st, v) = post("/v1/completions", &serde_json::json!({"model": id, "prompt": "Hi", "max_tokens": 1u64 << 40}).to_string());
    assert_eq!(error(st, &v, "context_length_exceeded"), 400);
    assert_eq!(v["error"]["param"], "max_tokens");
    let long = "the quick brown fox jumps over the lazy dog ".repeat(100);
    let (st, v) = post("/v1/chat/completions", &serde_json::json!({"model": id, "messages": [{"role": "user", "content": long}]}).to_string());
    assert_eq!(error(st, &v, "context_length_exceeded"), 400);
    let (st, v) = post("/v1/completions", &serde_json::json!({"model": "gpt-4", "prompt": "Hi"}).to_string());
    assert_eq!(error(st, &v, "model_not_found"), 404);
    let (st, v) = post("/v1/chat/completions", &serde_json::json!({"model": id, "messages": [{"role": "assistant", "content": "Hi"}]}).to_string());
    assert_eq!(st, 400, "{v}");
    // A 10 MB body: refused by the body limit (1 MiB by default), never kept; the rest is
    // drained before the 413, so the client reads the answer instead of a reset.
    let dir = std::env::temp_dir().join(format!("keel-serve-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let big = dir.join("big.json");
    std::fs::write(&big, format!("{{\"model\": \"{id}\", \"prompt\": \"{}\"}}", "a".repeat(10_000_000))).unwrap();
    let (st, v) = post("/v1/completions", &format!("@{}", big.display()));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(error(st, &v, "body_too_large"), 413);
    let (st, v) = s.json("GET", "/no/such/route", None);
    assert_eq!(error(st, &v, "not_found"), 404);

    // A client that disconnects mid-stream frees its slot at the next token: the slot is
    // idle long before the 500 tokens asked for could have been generated (greedy
    // SmolLM2 on this prompt runs 500 tokens without an end-of-generation token).
    let before = s.idle_metrics();
    let got = s.client("disconnect", &["Once upon a time", "500"]);
    assert_eq!(got["status"], 200);
    assert_eq!(got["events_read"], 3);
    let m = s.idle_metrics();
    assert_eq!(m["keel_requests_cancelled_total"], before["keel_requests_cancelled_total"] + 1.0, "{m:?}");
    assert!(m["keel_generated_tokens_total"] - before["keel_generated_tokens_total"] < 500.0, "{m:?}");
    assert_eq!(m["keel_requests_invalid_total"], 7.0, "{m:?}");

    // Still serving.
    let (st, v) = post("/v1/completions", &serde_json::json!({"model": id, "prompt": COMPLETE, "max_tokens": 4, "temperature": 0}).to_string());
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 4);
}

/// `keel serve --lookup N` and `--draft-model M` (issue 21, deliver 5), on the committed
/// synthetic llama (Q8_0 target, Q4_0 draft): at temperature 0 each slot's speculative
/// reply is `keel run --temp 0`'s text, the drafts show in `/metrics`, the memory plan
/// counts the speculation arenas, and a seeded sampled request gives the same text twice
/// (each request's seed restarts the speculator's random stream).
#[test]
fn speculative_slots_give_keel_runs_text() {
    let dir = repo().join("tests/golden/synth");
    let (model, draft) = (dir.join("synth-llama-q8_0.gguf"), dir.join("synth-llama-q4_0.gguf"));
    let (prompt, n, ctx) = ("The capital of France is", 40, 256);
    let want = keel_run(&model, prompt, n, ctx, false);
    assert!(!want.is_empty());
    let draft = draft.to_str().unwrap();
    for flags in [&["--lookup", "4", "--draft-fixed"][..], &["--lookup", "6"][..], &["--draft-model", draft, "--draft-max", "3", "--draft-fixed"][..]] {
        let args: Vec<&str> = ["--slots", "2", "-t", "1", "-c", "256"].iter().chain(flags).copied().collect();
        let s = Server::start(&model, &args);
        let body = serde_json::json!({"model": s.model, "prompt": prompt, "temperature": 0, "max_tokens": n}).to_string();
        for _ in 0..2 {
            let (status, v) = s.json("POST", "/v1/completions", Some(&body));
            assert_eq!(status, 200, "{flags:?}: {v}");
            assert_eq!(v["choices"][0]["text"].as_str(), Some(want.as_str()), "{flags:?}: speculation changed the greedy text");
        }
        let seeded = serde_json::json!({"model": s.model, "prompt": prompt, "temperature": 0.8, "seed": 7, "max_tokens": n}).to_string();
        let (a, b) = (s.json("POST", "/v1/completions", Some(&seeded)), s.json("POST", "/v1/completions", Some(&seeded)));
        assert_eq!((a.0, b.0), (200, 200));
        assert_eq!(a.1["choices"][0]["text"], b.1["choices"][0]["text"], "{flags:?}: one seed, two texts");
        let m = s.idle_metrics();
        assert_eq!(m["keel_requests_completed_total"], 4.0, "{flags:?}");
        if flags.contains(&"--draft-fixed") {
            assert!(m["keel_speculative_drafted_tokens_total"] > 0.0, "{flags:?}: nothing drafted: {m:?}");
        }
        assert!(m["keel_speculative_accepted_tokens_total"] <= m["keel_speculative_drafted_tokens_total"], "{m:?}");
    }
    // A draft device is `keel run`'s; the server says so.
    let out = keel().args(["serve", "-m"]).arg(&model).args(["--port", "0", "--draft-model", draft, "--device-draft", "hexagon-sim"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--device-draft") && err.contains("CPU"), "{err}");
}
