//! `#[test]` with a deadline of its own, for the integration tests (`tests/it`): a test that
//! hangs fails within minutes, naming itself, instead of holding CI until its limit.
//!
//! The attribute replaces `#[tokio::test]` and `#[test]` on the test functions and takes
//! the same `flavor` and `worker_threads` as `tokio::test`, plus `deadline_secs` for a test
//! that is slow by design. It only rewrites the function: its body runs through
//! `crate::common::deadline` (in `tests/common/deadline.rs`), which owns the runtime, the
//! watchdog and the messages. Written on `proc_macro` alone, so the workspace builds no
//! parser for it.

use proc_macro::{Delimiter, Group, Ident, Literal, Punct, Spacing, Span, TokenStream, TokenTree};

/// Runs the test function under a deadline: `#[edge_test_deadline::test]`,
/// `#[…::test(flavor = "multi_thread", worker_threads = 2)]`, `#[…::test(deadline_secs = 600)]`.
#[proc_macro_attribute]
pub fn test(args: TokenStream, item: TokenStream) -> TokenStream {
    match Options::parse(args).and_then(|options| expand(&options, item)) {
        Ok(tokens) => tokens,
        Err(message) => compile_error(&message),
    }
}

/// What the attribute's arguments ask for.
#[derive(Default)]
struct Options {
    /// `worker_threads` of a `multi_thread` runtime; `None` for tokio's default
    /// single-threaded runtime.
    workers: Option<String>,
    multi_thread: bool,
    deadline_secs: Option<String>,
}

impl Options {
    fn parse(args: TokenStream) -> Result<Self, String> {
        let mut options = Self::default();
        for pair in split_on_commas(args) {
            let [TokenTree::Ident(key), TokenTree::Punct(eq), value] = pair.as_slice() else {
                return Err(format!("expected `key = value`, got `{}`", stream(&pair)));
            };
            if eq.as_char() != '=' {
                return Err(format!("expected `=` after `{key}`"));
            }
            let value = value.to_string();
            match key.to_string().as_str() {
                "flavor" if value == "\"multi_thread\"" => options.multi_thread = true,
                "flavor" if value == "\"current_thread\"" => options.multi_thread = false,
                "worker_threads" => options.workers = Some(value),
                "deadline_secs" => options.deadline_secs = Some(value),
                other => return Err(format!("unknown argument `{other} = {value}`")),
            }
        }
        Ok(options)
    }

    /// The `crate::common::deadline::Flavor` expression.
    fn flavor(&self) -> String {
        if self.multi_thread {
            let workers = self.workers.as_deref().unwrap_or("2");
            format!("crate::common::deadline::Flavor::MultiThread({workers})")
        } else {
            "crate::common::deadline::Flavor::CurrentThread".to_owned()
        }
    }

    /// The `Option<u64>` expression of the deadline.
    fn deadline(&self) -> String {
        self.deadline_secs
            .as_ref()
            .map_or_else(|| "None".to_owned(), |secs| format!("Some({secs})"))
    }
}

/// The function again, marked `#[test]`, its body handed to `crate::common::deadline`.
fn expand(options: &Options, item: TokenStream) -> Result<TokenStream, String> {
    let mut tokens: Vec<TokenTree> = item.into_iter().collect();
    let Some(TokenTree::Group(body)) = tokens.pop() else {
        return Err("expected a function with a body".to_owned());
    };
    if body.delimiter() != Delimiter::Brace {
        return Err("expected a function body in braces".to_owned());
    }
    let position = |word: &str| {
        tokens
            .iter()
            .position(|t| matches!(t, TokenTree::Ident(i) if i.to_string() == word))
    };
    let name = position("fn")
        .and_then(|at| tokens.get(at + 1))
        .map(ToString::to_string)
        .ok_or("expected `fn name`")?;
    let is_async = position("async").inspect(|&at| {
        tokens.remove(at);
    });
    let test_name = format!("::core::concat!(::core::module_path!(), \"::{name}\")");
    let call = if is_async.is_some() {
        format!(
            "crate::common::deadline::run({test_name}, {}, {}, async move BODY)",
            options.flavor(),
            options.deadline()
        )
    } else {
        format!(
            "crate::common::deadline::run_blocking({test_name}, {}, move || BODY)",
            options.deadline()
        )
    };
    let call = with_body(&call, &body)?;
    let mut out: TokenStream = "#[::core::prelude::v1::test]"
        .parse()
        .map_err(|e| format!("{e}"))?;
    out.extend(tokens);
    out.extend([TokenTree::Group(Group::new(Delimiter::Brace, call))]);
    Ok(out)
}

/// `template` parsed, with the ident `BODY` replaced by the function's own body.
fn with_body(template: &str, body: &Group) -> Result<TokenStream, String> {
    let parsed: TokenStream = template.parse().map_err(|e| format!("{e}"))?;
    Ok(replace_body(parsed, body))
}

fn replace_body(tokens: TokenStream, body: &Group) -> TokenStream {
    tokens
        .into_iter()
        .map(|token| match token {
            TokenTree::Ident(ident) if ident.to_string() == "BODY" => {
                TokenTree::Group(body.clone())
            }
            TokenTree::Group(group) => {
                let inner = replace_body(group.stream(), body);
                let mut replaced = Group::new(group.delimiter(), inner);
                replaced.set_span(group.span());
                TokenTree::Group(replaced)
            }
            other => other,
        })
        .collect()
}

fn split_on_commas(args: TokenStream) -> Vec<Vec<TokenTree>> {
    let mut pairs = vec![Vec::new()];
    for token in args {
        match &token {
            TokenTree::Punct(p) if p.as_char() == ',' => pairs.push(Vec::new()),
            _ => pairs.last_mut().expect("one pair at least").push(token),
        }
    }
    pairs.retain(|pair| !pair.is_empty());
    pairs
}

fn stream(tokens: &[TokenTree]) -> String {
    tokens.iter().cloned().collect::<TokenStream>().to_string()
}

/// `compile_error!("message")` at the attribute.
fn compile_error(message: &str) -> TokenStream {
    let span = Span::call_site();
    let mut bang = Punct::new('!', Spacing::Alone);
    bang.set_span(span);
    let message = TokenTree::Literal(Literal::string(&format!("edge_test_deadline: {message}")));
    let args = Group::new(Delimiter::Parenthesis, message.into());
    let semi = Punct::new(';', Spacing::Alone);
    [
        TokenTree::Ident(Ident::new("compile_error", span)),
        TokenTree::Punct(bang),
        TokenTree::Group(args),
        TokenTree::Punct(semi),
    ]
    .into_iter()
    .collect()
}
