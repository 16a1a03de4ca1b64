//! Chat prompts: the model's own template (`tokenizer.chat_template`, Jinja) rendered with
//! `minijinja`, as Hugging Face's `apply_chat_template(..., add_generation_prompt=True)` does.

use std::collections::BTreeMap;

use minijinja::{Environment, Error, ErrorKind, Value, context};

use crate::error::{Result, RunnerError};

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Message {
            role: "user".into(),
            content: content.into(),
        }
    }

    /// The message as the template sees it: a map with `role` and `content`.
    fn value(&self) -> Value {
        let fields = [("role", &self.role), ("content", &self.content)];
        Value::from(BTreeMap::from(
            fields.map(|(k, v)| (k, Value::from(v.as_str()))),
        ))
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Message {
            role: "system".into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl ChatTemplate {
    /// Compiles `source`; `bos` and `eos` are the texts of the special tokens the template may
    /// name (`bos_token`, `eos_token`).
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.add_function(
            "raise_exception",
            |message: String| -> std::result::Result<String, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| RunnerError::ChatTemplate(e.to_string()))?;
        Ok(ChatTemplate {
            env,
            bos: bos.to_string(),
            eos: eos.to_string(),
        })
    }

    /// The prompt text of `messages`, ending with the assistant's turn opened.
    pub fn render(&self, messages: &[Message]) -> Result<String> {
        let template = self
            .env
            .get_template("chat")
            .map_err(|e| RunnerError::ChatTemplate(e.to_string()))?;
        template
            .render(context! {
                messages => messages.iter().map(Message::value).collect::<Vec<Value>>(),
                add_generation_prompt => true,
                bos_token => self.bos.as_str(),
                eos_token => self.eos.as_str(),
            })
            .map_err(|e| RunnerError::ChatTemplate(e.to_string()))
    }
}
