//! The HTTP side (axum): routes, request checking and tokenizing, admission to the
//! queue, and turning a slot's events into a JSON response or server-sent events.

use super::api::*;
use super::metrics::Metrics;
use super::slot::{admit, Event, Job, Params, Queue, CHANNEL_DEPTH};
use crate::cli::common::{tokenize_all, ChatText};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use keel_core::chat::{ChatFormat, Role};
use keel_core::tokenizer::Tokenizer;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// What every handler shares.
pub struct AppState {
    /// The id requests name in `model`.
    pub model_id: String,
    /// The model file's modification time (Unix seconds).
    pub created: u64,
    /// A tokenizer of the HTTP side's own (requests are tokenized before they queue).
    pub tokenizer: &'static Tokenizer<'static>,
    /// The chat format, or why the model has none.
    pub format: Result<ChatFormat<'static>, String>,
    /// Each slot's context.
    pub n_ctx: usize,
    /// Slots.
    pub slots: usize,
    /// Queue places.
    pub queue: usize,
    /// The queue into the slots.
    pub jobs: Queue,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// The most bytes a request body may have.
    pub body_limit: usize,
}

/// The routes (the handlers read bodies themselves, to `AppState::body_limit`: [`read_body`]).
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", "no such route; keel serve has POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health, GET /metrics", None, Some("not_found"))
}

async fn models(State(st): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList { object: "list", data: vec![ModelInfo { id: st.model_id.clone(), object: "model", created: st.created, owned_by: "keel" }] })
}

async fn health(State(st): State<Arc<AppState>>) -> Json<Health> {
    Json(Health { status: "ok", slots: st.slots, slots_busy: st.metrics.slots_busy.load(Relaxed), queue_depth: st.metrics.queue_depth() })
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], st.metrics.render(st.slots, st.queue)).into_response()
}

/// Most bytes of a body past the limit read and dropped before the 413 goes out, and the
/// longest time spent on it. A server that answers and closes while the client is still
/// sending leaves unread bytes behind, the kernel then resets the connection, and the
/// client may lose the answer (curl: an empty reply): so the rest is drained first, never
/// kept. A body longer than this (or slower) gets the 413 without the guarantee.
const DRAIN_BYTES: usize = 64 << 20;
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(30);

/// The request body, at most `limit` bytes; beyond it, the rest drained (see
/// [`DRAIN_BYTES`]) and a JSON 413 naming `--body-limit`; 400 when it cannot be read.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let mut stream = body.into_data_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut over = None;
    let deadline = tokio::time::Instant::now() + DRAIN_TIME;
    loop {
        let next = if over.is_some() { tokio::time::timeout_at(deadline, stream.next()).await.unwrap_or(None) } else { stream.next().await };
        let Some(chunk) = next else { break };
        let chunk = chunk.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", format!("reading the request body: {e}"), None, None))?;
        match over.as_mut() {
            Some(drained) => {
                *drained += chunk.len();
                if *drained > DRAIN_BYTES {
                    break;
                }
            }
            None if buf.len() + chunk.len() > limit => {
                over = Some(buf.len() + chunk.len());
                buf = Vec::new();
            }
            None => buf.extend_from_slice(&chunk),
        }
    }
    if over.is_some() {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is larger than the server's limit (--body-limit {limit} bytes); send a shorter prompt or restart keel serve with a larger --body-limit"),
            None,
            Some("body_too_large"),
        ));
    }
    Ok(Bytes::from(buf))
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Checks the fields both endpoints share and the prompt's length; the slot's settings.
fn params(st: &AppState, model: &str, s: &Sampling, n_prompt: usize) -> Result<Params, ApiError> {
    if model != st.model_id {
        return Err(ApiError::unknown_model(model, &st.model_id));
    }
    if let Some(n) = s.n.filter(|&n| n != 1) {
        return Err(ApiError::invalid(format!("n = {n}: keel serve generates one choice per request (n = 1)"), "n"));
    }
    let temp = s.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temp) {
        return Err(ApiError::invalid(format!("temperature {temp} is out of range: use 0 ..= 2 (0 = greedy)"), "temperature"));
    }
    let top_p = s.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(format!("top_p {top_p} is out of range: use a value in (0, 1] (1 = off)"), "top_p"));
    }
    let stop = s.stop.clone().map(Stop::into_vec).unwrap_or_default();
    if stop.len() > 4 || stop.iter().any(|x| x.is_empty() || x.len() > 256) {
        return Err(ApiError::invalid("stop: give at most 4 stop strings, each 1 to 256 bytes", "stop"));
    }
    if n_prompt == 0 {
        return Err(ApiError::invalid("the prompt is empty after tokenization", "prompt"));
    }
    if n_prompt >= st.n_ctx {
        return Err(ApiError::context(
            format!("the prompt has {n_prompt} tokens but the context holds {} (leaving no room for a reply); shorten the prompt or restart keel serve with a larger -c", st.n_ctx),
            "messages",
        ));
    }
    let room = st.n_ctx - n_prompt;
    let max_tokens = match s.max_completion_tokens.or(s.max_tokens) {
        None => room,
        Some(0) => return Err(ApiError::invalid("max_tokens must be at least 1", "max_tokens")),
        Some(m) if m > room as u64 => {
            return Err(ApiError::context(
                format!("max_tokens {m} plus the prompt's {n_prompt} tokens exceed the context of {} tokens; ask for at most {room} (or restart keel serve with a larger -c)", st.n_ctx),
                "max_tokens",
            ))
        }
        Some(m) => m as usize,
    };
    let seed = s.seed.unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0));
    Ok(Params { temp, top_p, seed, max_tokens, stop })
}

/// The conversation in the model's chat format (the template `keel chat` and
/// `keel run --chat` use), tokenized: an optional system message first, then user and
/// assistant turns, ending with a user turn.
fn chat_tokens(st: &AppState, messages: &[Message]) -> Result<Vec<u32>, ApiError> {
    let format = st.format.as_ref().map_err(|e| ApiError::invalid(format!("this model has no chat format keel knows ({e}); use /v1/completions"), "model"))?;
    let texts: Vec<(String, String)> = messages.iter().map(|m| Ok((m.role.clone(), m.content.text()?))).collect::<Result<_, ApiError>>()?;
    let (system, rest) = match texts.first() {
        Some((r, t)) if r == "system" || r == "developer" => (Some(t.as_str()), &texts[1..]),
        _ => (None, &texts[..]),
    };
    let content: Vec<&str> = texts.iter().map(|(_, t)| t.as_str()).collect();
    let mut w = ChatText::new(&content);
    let bad = |i: usize, why: &str| ApiError::invalid(format!("messages[{}]: {why}", i + usize::from(system.is_some())), "messages");
    let write_err = |_| ApiError::server("writing the chat template");
    for (i, (role, text)) in rest.iter().enumerate() {
        match (i, role.as_str()) {
            (0, "user") => format.first_user(&mut w, system, text).map_err(write_err)?,
            (0, _) => return Err(bad(i, "the conversation must start with a user message (after an optional system message)")),
            (_, "user") => format.user(&mut w, text).map_err(write_err)?,
            (_, "assistant") => format.turn(&mut w, Role::Assistant, text).map_err(write_err)?,
            (_, "system" | "developer") => return Err(bad(i, "a system message may only come first")),
            (_, r) => return Err(bad(i, &format!("unknown role '{r}' (use system, user or assistant)"))),
        }
    }
    match rest.last() {
        Some((r, _)) if r == "user" => {}
        Some(_) => return Err(bad(rest.len() - 1, "the last message must be the user's")),
        None => return Err(ApiError::invalid("messages has no user message", "messages")),
    }
    format.assistant_start(&mut w).map_err(write_err)?;
    w.tokenize(st.tokenizer, true, usize::MAX).map_err(|e| ApiError::invalid(format!("tokenizing the messages: {e:#}"), "messages"))
}

/// Reads and checks a request in a blocking task (tokenizing a long prompt is CPU work).
async fn prepare<R, F>(st: &Arc<AppState>, b: Body, f: F) -> Result<(R, Params, Vec<u32>), ApiError>
where
    R: serde::de::DeserializeOwned + Send + 'static,
    F: FnOnce(&AppState, &R) -> Result<(Params, Vec<u32>), ApiError> + Send + 'static,
{
    let bytes = read_body(b, st.body_limit).await?;
    let st2 = st.clone();
    tokio::task::spawn_blocking(move || {
        let req: R = serde_json::from_slice(&bytes).map_err(|e| ApiError::from_json(&e))?;
        let (p, t) = f(&st2, &req)?;
        Ok((req, p, t))
    })
    .await
    .map_err(|e| ApiError::server(format!("checking the request: {e}")))?
}

/// Admits the request and hands it to the slots; the receiving end of its events.
fn enqueue(st: &AppState, tokens: Vec<u32>, params: Params) -> Result<tokio::sync::mpsc::Receiver<Event>, ApiError> {
    let Some(permit) = admit(&st.metrics, st.slots + st.queue) else {
        st.metrics.requests_rejected.fetch_add(1, Relaxed);
        return Err(ApiError::busy(st.slots, st.queue));
    };
    let (tx, rx) = tokio::sync::mpsc::channel(CHANNEL_DEPTH);
    st.jobs.try_send(Job { tokens, params, tx, permit }).map_err(|_| {
        st.metrics.requests_rejected.fetch_add(1, Relaxed);
        ApiError::busy(st.slots, st.queue)
    })?;
    st.metrics.requests_admitted.fetch_add(1, Relaxed);
    Ok(rx)
}

/// Counts a refused request (503s are counted where they are refused).
fn refused(st: &AppState, e: ApiError) -> Response {
    if e.status.is_client_error() {
        st.metrics.requests_invalid.fetch_add(1, Relaxed);
    }
    e.into_response()
}

/// Collects a whole reply.
async fn collect(mut rx: tokio::sync::mpsc::Receiver<Event>) -> Result<(String, &'static str, Usage), ApiError> {
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Done { finish, usage } => return Ok((text, finish, usage)),
            Event::Error(e) => return Err(ApiError::server(e)),
        }
    }
    Err(ApiError::server("the slot stopped before the reply ended"))
}

/// Turns a slot's events into server-sent events: `first` before any text, `chunk(text,
/// finish)` per piece and at the end, `usage_chunk` when asked, then `[DONE]`.
fn sse<F, U>(rx: tokio::sync::mpsc::Receiver<Event>, first: Option<String>, chunk: F, usage_chunk: Option<U>) -> Response
where
    F: Fn(Option<String>, Option<&'static str>) -> String + Send + Sync + 'static,
    U: Fn(Usage) -> String + Send + Sync + 'static,
{
    let pending: Vec<SseEvent> = first.map(|d| SseEvent::default().data(d)).into_iter().collect();
    let fns = Arc::new((chunk, usage_chunk));
    let stream = futures_util::stream::unfold((rx, pending, false), move |(mut rx, mut pending, mut ended)| {
        let fns = fns.clone();
        async move {
            let (chunk, usage_chunk) = &*fns;
            loop {
                if !pending.is_empty() {
                    let ev = pending.remove(0);
                    return Some((Ok::<_, Infallible>(ev), (rx, pending, ended)));
                }
                if ended {
                    return None;
                }
                match rx.recv().await {
                    Some(Event::Text(t)) => pending.push(SseEvent::default().data(chunk(Some(t), None))),
                    Some(Event::Done { finish, usage }) => {
                        pending.push(SseEvent::default().data(chunk(None, Some(finish))));
                        if let Some(u) = usage_chunk {
                            pending.push(SseEvent::default().data(u(usage)));
                        }
                        pending.push(SseEvent::default().data("[DONE]"));
                        ended = true;
                    }
                    Some(Event::Error(e)) => {
                        pending.push(SseEvent::default().data(ApiError::server(e).json()));
                        ended = true;
                    }
                    None => {
                        pending.push(SseEvent::default().data(ApiError::server("the slot stopped before the reply ended").json()));
                        ended = true;
                    }
                }
            }
        }
    });
    Sse::new(stream).into_response()
}

/// An admitted request: the parsed body, its events, its id (`prefix-keel-N`), creation
/// time and the model's id; or the error response (counted).
async fn admitted<R, F>(st: &Arc<AppState>, b: Body, prefix: &str, f: F) -> Result<(R, tokio::sync::mpsc::Receiver<Event>, String, u64, String), Response>
where
    R: serde::de::DeserializeOwned + Send + 'static,
    F: FnOnce(&AppState, &R) -> Result<(Params, Vec<u32>), ApiError> + Send + 'static,
{
    let (req, params, tokens) = prepare(st, b, f).await.map_err(|e| refused(st, e))?;
    let rx = enqueue(st, tokens, params).map_err(IntoResponse::into_response)?;
    Ok((req, rx, format!("{prefix}-keel-{}", NEXT_ID.fetch_add(1, Relaxed)), now(), st.model_id.clone()))
}

async fn chat(State(st): State<Arc<AppState>>, b: Body) -> Response {
    let started = admitted(&st, b, "chatcmpl", |st, r: &ChatRequest| {
        let tokens = chat_tokens(st, &r.messages)?;
        Ok((params(st, &r.model, &r.sampling, tokens.len())?, tokens))
    });
    let (req, rx, id, created, model) = match started.await {
        Ok(x) => x,
        Err(r) => return r,
    };
    if !req.sampling.stream {
        return match collect(rx).await {
            Ok((text, finish, usage)) => Json(ChatResponse {
                id,
                object: "chat.completion",
                created,
                model,
                choices: vec![ChatChoice { index: 0, message: OutMessage { role: "assistant", content: text }, finish_reason: finish }],
                usage: Some(usage),
            })
            .into_response(),
            Err(e) => e.into_response(),
        };
    }
    let mk = {
        let (id, model) = (id.clone(), model.clone());
        move |choices: Vec<ChunkChoice>, usage: Option<Usage>| serde_json::to_string(&ChatChunk { id: id.clone(), object: "chat.completion.chunk", created, model: model.clone(), choices, usage }).unwrap_or_default()
    };
    let first = mk(vec![ChunkChoice { index: 0, delta: Delta { role: Some("assistant"), content: Some(String::new()) }, finish_reason: None }], None);
    let mk2 = mk.clone();
    let chunk = move |text: Option<String>, finish| mk(vec![ChunkChoice { index: 0, delta: Delta { role: None, content: text }, finish_reason: finish }], None);
    let usage = req.sampling.stream_options.unwrap_or_default().include_usage.then_some(move |u| mk2(vec![], Some(u)));
    sse(rx, Some(first), chunk, usage)
}

async fn completions(State(st): State<Arc<AppState>>, b: Body) -> Response {
    let started = admitted(&st, b, "cmpl", |st, r: &CompletionRequest| {
        let text = match &r.prompt {
            Prompt::One(s) => s.as_str(),
            Prompt::Many(v) if v.len() == 1 => v[0].as_str(),
            Prompt::Many(v) => return Err(ApiError::invalid(format!("prompt has {} strings: keel serve takes one prompt per request", v.len()), "prompt")),
        };
        // As `keel run -p`: BOS as the model adds it, special tokens' text parsed.
        let tokens = tokenize_all(st.tokenizer, text, true, true).map_err(|e| ApiError::invalid(format!("tokenizing the prompt: {e:#}"), "prompt"))?;
        Ok((params(st, &r.model, &r.sampling, tokens.len())?, tokens))
    });
    let (req, rx, id, created, model) = match started.await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let mk = move |text: String, finish: Option<&'static str>, usage: Option<Usage>, choice: bool| CompletionResponse {
        id: id.clone(),
        object: "text_completion",
        created,
        model: model.clone(),
        choices: if choice { vec![TextChoice { index: 0, text, finish_reason: finish, logprobs: None }] } else { vec![] },
        usage,
    };
    if !req.sampling.stream {
        return match collect(rx).await {
            Ok((text, finish, usage)) => Json(mk(text, Some(finish), Some(usage), true)).into_response(),
            Err(e) => e.into_response(),
        };
    }
    let mk2 = mk.clone();
    let chunk = move |text: Option<String>, finish| serde_json::to_string(&mk(text.unwrap_or_default(), finish, None, true)).unwrap_or_default();
    let usage = req.sampling.stream_options.unwrap_or_default().include_usage.then_some(move |u| serde_json::to_string(&mk2(String::new(), None, Some(u), false)).unwrap_or_default());
    sse(rx, None, chunk, usage)
}
