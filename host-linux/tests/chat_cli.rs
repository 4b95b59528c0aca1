//! `keel run --chat` and `keel chat` on the synthetic llama model (SmolLM2's tokenizer and
//! ChatML template): the prompt is the template's rendering, turns append to the context,
//! and a full context is reported, not a crash.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/synth/synth-llama-q8_0.gguf")
}

fn keel(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_keel")).args(args).output().unwrap()
}

fn json(out: &std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn run_chat_renders_the_chatml_template() {
    let m = model();
    let m = m.to_str().unwrap();
    let got = json(&keel(&["run", "-m", m, "--chat", "-p", "Hi there", "-n", "2", "--temp", "0", "--json"]));
    // SmolLM2's template: a default system message, the user turn, the assistant opening.
    let text = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n";
    let want = json(&keel(&["tokenize", "-m", m, "--add-special", "--parse-special", "--json", text]));
    assert_eq!(got["prompt_tokens"], want["tokens"]);
    assert_eq!(want["tokens"][0], 1, "<|im_start|> is parsed as its special token");
    // An explicit system message replaces the default.
    let got = json(&keel(&["run", "-m", m, "--chat", "--system", "Be brief.", "-p", "Hi", "-n", "1", "--temp", "0", "--json"]));
    let text = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    let want = json(&keel(&["tokenize", "-m", m, "--add-special", "--parse-special", "--json", text]));
    assert_eq!(got["prompt_tokens"], want["tokens"]);
}

#[test]
fn system_without_chat_is_an_error() {
    let out = keel(&["run", "-m", model().to_str().unwrap(), "--system", "x", "-p", "Hi", "-n", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--system needs --chat"));
}

#[test]
fn chat_appends_turns_and_reports_a_full_context() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["chat", "-m", model().to_str().unwrap(), "-c", "96", "-n", "8", "--temp", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let long = "word ".repeat(80);
    let input = format!("Hello\nAnd again\n{long}\n/reset\nHello\n/quit\n");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("ChatML format"), "{err}");
    assert!(err.contains("the context is full"), "a turn that does not fit is reported: {err}");
    assert!(err.contains("(new conversation)"), "{err}");
    // Three replies were generated (two before the full context, one after /reset), and
    // the first and the last (same opening turn, fresh context, greedy) are equal.
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let replies: Vec<&str> = stdout.lines().collect();
    assert_eq!(replies.len(), 3, "{replies:?}");
    assert_eq!(replies[0], replies[2]);
}

/// Ctrl-C (SIGINT) while a reply streams ends the reply, not keel: the conversation goes on.
/// `/help` lists the commands; each reply is followed by its speed.
#[test]
fn ctrl_c_interrupts_the_reply_not_the_chat() {
    use std::io::Read;
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["chat", "-m", model().to_str().unwrap(), "-c", "4096", "-n", "4000", "--ignore-eos", "-s", "1", "-t", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"/help\nHello\n").unwrap();
    stdin.flush().unwrap();
    // The reply has begun (4000 tokens: seconds of work): interrupt it.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).unwrap();
    // SAFETY: signals our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    stdin.write_all(b"/quit\n").unwrap();
    drop(stdin);
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "keel chat should end normally after Ctrl-C and /quit: {:?}\n{err}", out.status);
    assert!(err.contains("(reply interrupted)"), "{err}");
    assert!(err.contains("/reset start a new conversation"), "/help lists the commands: {err}");
    assert!(err.contains("t/s; context"), "the reply's speed is printed: {err}");
}

/// A model without a chat template gets a warning for `--chat` (usually a base model).
#[test]
fn chat_without_a_template_warns() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chat-no-template");
    std::fs::create_dir_all(&dir).unwrap();
    let m = dir.join("synth-gemma3-no-template.gguf");
    // The synthetic Gemma 3 with its tokenizer.chat_template key renamed (same length, so
    // the file stays valid): the architecture's default format applies.
    let mut bytes = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/synth/synth-gemma3-q8_0.gguf")).unwrap();
    let key = b"tokenizer.chat_template";
    let at = bytes.windows(key.len()).position(|w| w == key).expect("the synthetic Gemma 3 has a template key");
    bytes[at] = b'X';
    std::fs::write(&m, bytes).unwrap();
    let out = keel(&["run", "-m", m.to_str().unwrap(), "--chat", "-p", "Hi", "-n", "1", "--temp", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("warning") && err.contains("has no chat template") && err.contains("not instruction-tuned"), "{err}");
    // SmolLM2's synthetic copy has its template: no warning.
    let out = keel(&["run", "-m", model().to_str().unwrap(), "--chat", "-p", "Hi", "-n", "1", "--temp", "0"]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("no chat template"));
}
