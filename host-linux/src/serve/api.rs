//! The OpenAI wire format `keel serve` speaks: typed request and response bodies (serde)
//! and OpenAI-style errors (`{"error": {"message", "type", "param", "code"}}`) with their
//! HTTP status.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

/// `stop`: one string or a list of them.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several (OpenAI allows up to 4).
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings as a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Deserialize, Debug, Clone, Copy, Default)]
pub struct StreamOptions {
    /// Send a last chunk with the usage counts.
    #[serde(default)]
    pub include_usage: bool,
}

/// The sampling and length fields both endpoints take.
#[derive(Deserialize, Debug, Clone, Default)]
pub struct Sampling {
    /// Most tokens to generate (default: until the context is full).
    pub max_tokens: Option<u64>,
    /// The newer name of `max_tokens` (chat).
    pub max_completion_tokens: Option<u64>,
    /// 0 ..= 2 (default 1; 0 = greedy).
    pub temperature: Option<f32>,
    /// (0, 1] (default 1 = off).
    pub top_p: Option<f32>,
    /// Seed of the random draw (default: from the clock).
    pub seed: Option<u64>,
    /// Stop strings: generation ends before the first occurrence of any of them.
    pub stop: Option<Stop>,
    /// Stream server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Choices to generate: only 1.
    pub n: Option<u32>,
}

/// One chat message.
#[derive(Deserialize, Debug, Clone)]
pub struct Message {
    /// `system`, `user` or `assistant` (`developer` is taken as `system`).
    pub role: String,
    /// The text: a string or a list of `{"type": "text", "text": …}` parts.
    pub content: Content,
}

/// A message's content.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts; only text parts are accepted.
    Parts(Vec<ContentPart>),
}

/// One content part.
#[derive(Deserialize, Debug, Clone)]
pub struct ContentPart {
    /// Must be `text`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text.
    #[serde(default)]
    pub text: String,
}

impl Content {
    /// The text of the message (parts joined), or an error for a non-text part.
    pub fn text(&self) -> Result<String, ApiError> {
        match self {
            Content::Text(s) => Ok(s.clone()),
            Content::Parts(parts) => {
                let mut out = String::new();
                for p in parts {
                    if p.kind != "text" {
                        return Err(ApiError::invalid(format!("content part type '{}' is not supported: keel serves text models (use type \"text\")", p.kind), "messages"));
                    }
                    out.push_str(&p.text);
                }
                Ok(out)
            }
        }
    }
}

/// `POST /v1/chat/completions`.
#[derive(Deserialize, Debug, Clone)]
pub struct ChatRequest {
    /// The model's id (see `GET /v1/models`).
    pub model: String,
    /// The conversation.
    pub messages: Vec<Message>,
    /// Sampling and length.
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// `prompt`: a string or a list holding one string.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum Prompt {
    /// The prompt.
    One(String),
    /// A batch of prompts: only one is served per request.
    Many(Vec<String>),
}

/// `POST /v1/completions`.
#[derive(Deserialize, Debug, Clone)]
pub struct CompletionRequest {
    /// The model's id.
    pub model: String,
    /// The prompt text.
    pub prompt: Prompt,
    /// Sampling and length.
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// Token counts of a request.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Both.
    pub total_tokens: usize,
}

/// An assistant message in a response.
#[derive(Serialize, Debug, Clone)]
pub struct OutMessage {
    /// `assistant`.
    pub role: &'static str,
    /// The reply.
    pub content: String,
}

/// A chat choice.
#[derive(Serialize, Debug, Clone)]
pub struct ChatChoice {
    /// 0.
    pub index: u32,
    /// The reply.
    pub message: OutMessage,
    /// `stop` or `length`.
    pub finish_reason: &'static str,
}

/// A streamed chat delta.
#[derive(Serialize, Debug, Clone, Default)]
pub struct Delta {
    /// `assistant` on the first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// A streamed chat choice.
#[derive(Serialize, Debug, Clone)]
pub struct ChunkChoice {
    /// 0.
    pub index: u32,
    /// What is new.
    pub delta: Delta,
    /// Set on the last chunk.
    pub finish_reason: Option<&'static str>,
}

/// A text-completion choice (also each streamed chunk's).
#[derive(Serialize, Debug, Clone)]
pub struct TextChoice {
    /// 0.
    pub index: u32,
    /// The text (new text in a chunk).
    pub text: String,
    /// `stop` or `length` (on the last chunk).
    pub finish_reason: Option<&'static str>,
    /// Not computed.
    pub logprobs: Option<()>,
}

/// A response or streamed chunk of either endpoint, with its kind of choice.
#[derive(Serialize, Debug, Clone)]
pub struct Completion<C> {
    /// `chatcmpl-…` or `cmpl-…`, the same for every chunk of a response.
    pub id: String,
    /// `chat.completion`, `chat.completion.chunk` or `text_completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model's id.
    pub model: String,
    /// One choice (none in the usage chunk).
    pub choices: Vec<C>,
    /// Token counts (whole responses and the usage chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A chat completion.
pub type ChatResponse = Completion<ChatChoice>;
/// One `chat.completion.chunk` event.
pub type ChatChunk = Completion<ChunkChoice>;
/// A text completion, also each streamed chunk.
pub type CompletionResponse = Completion<TextChoice>;

/// One model in `GET /v1/models`.
#[derive(Serialize, Debug, Clone)]
pub struct ModelInfo {
    /// Its id: what requests name in `model`.
    pub id: String,
    /// `model`.
    pub object: &'static str,
    /// The file's modification time (Unix seconds).
    pub created: u64,
    /// `keel`.
    pub owned_by: &'static str,
}

/// `GET /v1/models`.
#[derive(Serialize, Debug, Clone)]
pub struct ModelList {
    /// `list`.
    pub object: &'static str,
    /// The served model.
    pub data: Vec<ModelInfo>,
}

/// `GET /health`.
#[derive(Serialize, Debug, Clone)]
pub struct Health {
    /// `ok`.
    pub status: &'static str,
    /// Slots.
    pub slots: usize,
    /// Slots generating now.
    pub slots_busy: usize,
    /// Requests waiting for a slot.
    pub queue_depth: usize,
}

/// The body of an error.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct ErrorBody {
    /// What went wrong and what to do.
    pub message: String,
    /// `invalid_request_error`, `not_found_error`, `server_error`, …
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault.
    pub param: Option<String>,
    /// A machine-readable code (`context_length_exceeded`, `model_not_found`, …).
    pub code: Option<String>,
}

/// `{"error": …}`.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct ErrorEnvelope {
    /// The error.
    pub error: ErrorBody,
}

/// An error response: status, body and (for 503) the seconds to wait.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The body.
    pub body: ErrorBody,
    /// `Retry-After` seconds.
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// Any error.
    pub fn new(status: StatusCode, kind: &str, message: impl Into<String>, param: Option<&str>, code: Option<&str>) -> Self {
        ApiError { status, body: ErrorBody { message: message.into(), kind: kind.into(), param: param.map(Into::into), code: code.map(Into::into) }, retry_after: None }
    }

    /// 400 invalid_request_error about `param`.
    pub fn invalid(message: impl Into<String>, param: &str) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message, Some(param), None)
    }

    /// 400: the prompt (plus `max_tokens`) does not fit in the context.
    pub fn context(message: impl Into<String>, param: &str) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message, Some(param), Some("context_length_exceeded"))
    }

    /// 400 for a body serde could not read: malformed JSON or a field of the wrong type.
    pub fn from_json(e: &serde_json::Error) -> Self {
        use serde_json::error::Category;
        let (what, code) = match e.classify() {
            Category::Syntax | Category::Eof | Category::Io => ("the request body is not valid JSON", "invalid_json"),
            Category::Data => ("a field of the request has the wrong type or value", "invalid_type"),
        };
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", format!("{what}: {e}"), None, Some(code))
    }

    /// 404 for a model name this server does not serve.
    pub fn unknown_model(asked: &str, served: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", format!("the model '{asked}' does not exist on this server; it serves '{served}' (see GET /v1/models)"), Some("model"), Some("model_not_found"))
    }

    /// 503: every slot busy and the queue full.
    pub fn busy(slots: usize, queue: usize) -> Self {
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_busy", format!("all {slots} slots are busy and the queue of {queue} is full; retry later"), None, Some("server_busy"));
        e.retry_after = Some(1);
        e
    }

    /// 500: the model failed mid-request.
    pub fn server(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message, None, None)
    }

    /// The JSON text of the body.
    pub fn json(&self) -> String {
        serde_json::to_string(&ErrorEnvelope { error: self.body.clone() }).unwrap_or_default()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], self.json()).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}
