//! Chat prompt formats of the supported model families.
//!
//! keel does not run Jinja: it recognizes the family from the model's
//! `tokenizer.chat_template` (or, when a file has none, its architecture) and writes the
//! family's turn format itself. Known families: ChatML (`<|im_start|>role\n...<|im_end|>\n`;
//! SmolLM2, Qwen 2/2.5/3/3.5) and Gemma (`<start_of_turn>user\n...<end_of_turn>\n`, the
//! system text prepended to the first user turn). A ChatML template that inserts a default
//! system message when the conversation has none (SmolLM2, Qwen 2.5) has that message
//! read out of the template text and used the same way.

use crate::gguf::Gguf;
use core::fmt::Write;

/// A chat prompt format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatFormat<'a> {
    /// ChatML, with the template's default system message, if it has one.
    ChatMl {
        /// Used when the conversation has no system message.
        default_system: Option<&'a str>,
    },
    /// Gemma's turn format (`user` / `model`).
    Gemma,
}

/// Why no chat format could be chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatError {
    /// The template is not one of the known families.
    UnknownTemplate,
    /// The file has no template and its architecture has no known default.
    NoTemplate,
}

impl core::fmt::Display for ChatError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ChatError::UnknownTemplate => f.write_str("the model's tokenizer.chat_template is not a format keel knows (known: ChatML as in SmolLM2/Qwen, Gemma turns)"),
            ChatError::NoTemplate => f.write_str("the model has no tokenizer.chat_template and its architecture has no default chat format (known: ChatML as in SmolLM2/Qwen, Gemma turns)"),
        }
    }
}

/// Who said a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Instructions.
    System,
    /// The person.
    User,
    /// The model.
    Assistant,
}

impl<'a> ChatFormat<'a> {
    /// The format for a model file.
    pub fn for_model(g: &Gguf<'a>) -> Result<ChatFormat<'a>, ChatError> {
        let tpl = g.str_opt("tokenizer.chat_template").ok().flatten().and_then(|b| core::str::from_utf8(b).ok());
        match tpl {
            Some(t) => Self::from_template(t),
            None => match g.str_opt("general.architecture").ok().flatten() {
                Some(b"gemma3") => Ok(ChatFormat::Gemma),
                Some(b"qwen2" | b"qwen3" | b"qwen35") => Ok(ChatFormat::ChatMl { default_system: None }),
                _ => Err(ChatError::NoTemplate),
            },
        }
    }

    /// Recognizes a Jinja chat template.
    pub fn from_template(t: &'a str) -> Result<ChatFormat<'a>, ChatError> {
        if t.contains("<start_of_turn>") {
            return Ok(ChatFormat::Gemma);
        }
        if t.contains("<|im_start|>") {
            return Ok(ChatFormat::ChatMl { default_system: default_system(t) });
        }
        Err(ChatError::UnknownTemplate)
    }

    /// Writes one turn. Gemma has no system role: its text goes before the next user
    /// turn's text, as Gemma's template does (write the system turn first, then the user
    /// turn).
    pub fn turn<W: Write>(&self, w: &mut W, role: Role, text: &str) -> core::fmt::Result {
        match self {
            ChatFormat::ChatMl { .. } => {
                let r = match role {
                    Role::System => "system",
                    Role::User => "user",
                    Role::Assistant => "assistant",
                };
                write!(w, "<|im_start|>{r}\n{text}<|im_end|>\n")
            }
            ChatFormat::Gemma => match role {
                Role::System => write!(w, "<start_of_turn>user\n{text}\n\n"),
                Role::User => write!(w, "{text}<end_of_turn>\n"),
                Role::Assistant => write!(w, "<start_of_turn>model\n{text}<end_of_turn>\n"),
            },
        }
    }

    /// Writes the start of a conversation's first user turn, with `system` (or the
    /// template's default) before it.
    pub fn first_user<W: Write>(&self, w: &mut W, system: Option<&str>, text: &str) -> core::fmt::Result {
        match self {
            ChatFormat::ChatMl { default_system } => {
                if let Some(s) = system.or(*default_system) {
                    self.turn(w, Role::System, s)?;
                }
                self.turn(w, Role::User, text)
            }
            ChatFormat::Gemma => match system {
                Some(s) => {
                    self.turn(w, Role::System, s)?;
                    self.turn(w, Role::User, text)
                }
                None => write!(w, "<start_of_turn>user\n{text}<end_of_turn>\n"),
            },
        }
    }

    /// Writes a later user turn.
    pub fn user<W: Write>(&self, w: &mut W, text: &str) -> core::fmt::Result {
        match self {
            ChatFormat::ChatMl { .. } => self.turn(w, Role::User, text),
            ChatFormat::Gemma => write!(w, "<start_of_turn>user\n{text}<end_of_turn>\n"),
        }
    }

    /// Writes the opening of the model's reply (the "generation prompt").
    pub fn assistant_start<W: Write>(&self, w: &mut W) -> core::fmt::Result {
        match self {
            ChatFormat::ChatMl { .. } => w.write_str("<|im_start|>assistant\n"),
            ChatFormat::Gemma => w.write_str("<start_of_turn>model\n"),
        }
    }

    /// What follows the model's reply once it ended (its end-of-turn token is not kept in
    /// the context by the caller, so the closing text is written here).
    pub fn assistant_end<W: Write>(&self, w: &mut W) -> core::fmt::Result {
        match self {
            ChatFormat::ChatMl { .. } => w.write_str("<|im_end|>\n"),
            ChatFormat::Gemma => w.write_str("<end_of_turn>\n"),
        }
    }

    /// A short name for messages.
    pub fn name(&self) -> &'static str {
        match self {
            ChatFormat::ChatMl { .. } => "ChatML",
            ChatFormat::Gemma => "Gemma",
        }
    }
}

/// The literal default system message of a ChatML template: the text between
/// `<|im_start|>system\n` (newline written literally or as `\n`) and `<|im_end|>`, when
/// it contains no template code.
fn default_system(t: &str) -> Option<&str> {
    for marker in ["<|im_start|>system\n", "<|im_start|>system\\n"] {
        if let Some(i) = t.find(marker) {
            let rest = &t[i + marker.len()..];
            let end = rest.find("<|im_end|>")?;
            let s = &rest[..end];
            if !s.is_empty() && !s.contains('{') && !s.contains('\'') {
                return Some(s);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOL: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    struct Buf(heapless::String<512>);
    impl Write for Buf {
        fn write_str(&mut self, s: &str) -> core::fmt::Result {
            self.0.push_str(s).map_err(|_| core::fmt::Error)
        }
    }

    #[test]
    fn smollm2_template_renders_like_jinja() {
        let f = ChatFormat::from_template(SMOL).unwrap();
        assert_eq!(f, ChatFormat::ChatMl { default_system: Some("You are a helpful AI assistant named SmolLM, trained by Hugging Face") });
        let mut b = Buf(heapless::String::new());
        f.first_user(&mut b, None, "Hi").unwrap();
        f.assistant_start(&mut b).unwrap();
        assert_eq!(b.0.as_str(), "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn gemma_turns() {
        let f = ChatFormat::from_template("{{ bos_token }}<start_of_turn>user ...").unwrap();
        let mut b = Buf(heapless::String::new());
        f.first_user(&mut b, Some("Be brief."), "Hi").unwrap();
        f.assistant_start(&mut b).unwrap();
        assert_eq!(b.0.as_str(), "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n");
    }

    #[test]
    fn unknown_template_is_an_error() {
        assert_eq!(ChatFormat::from_template("[INST] {{ m }} [/INST]"), Err(ChatError::UnknownTemplate));
    }
}
