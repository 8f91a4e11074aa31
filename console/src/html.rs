//! Pages as text: every value goes through [`escape`] (what agents wrote is
//! untrusted and is shown as text, never markup), and every page shares
//! one frame ([`page`]) that loads the console's own stylesheet and script
//! and nothing inline, as the Content-Security-Policy requires.

use std::fmt::Write as _;

use crate::session::Session;

/// `text` safe inside HTML text and quoted attribute values.
pub(crate) fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for character in text.chars() {
        match character {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            _ => escaped.push(character),
        }
    }
    escaped
}

/// JSON for a `<script type="application/json">` block: nothing in it can
/// close the element or open a comment.
pub(crate) fn json_block(id: &str, value: &serde_json::Value) -> String {
    let text = value.to_string().replace('<', "\\u003c").replace('>', "\\u003e").replace('&', "\\u0026");
    format!("<script type=\"application/json\" id=\"{}\">{text}</script>", escape(id))
}

/// The pages of the navigation, by path and title.
const NAVIGATION: [(&str, &str); 4] =
    [("/executions", "Executions"), ("/editor", "Process editor"), ("/roster", "Roster"), ("/team", "Team")];

/// A whole page: `title`, the navigation with `current` marked, who is
/// signed in (with the sign-out form), and `body`.
pub(crate) fn page(title: &str, current: &str, session: Option<&Session>, body: &str) -> String {
    let mut html = String::with_capacity(body.len() + 2048);
    let _ = write!(
        html,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · muster</title><link rel=\"icon\" href=\"data:,\"><link rel=\"stylesheet\" href=\"/assets/console.css\">\
         <script src=\"/assets/console.js\" defer></script></head><body>\
         <a class=\"skip\" href=\"#main\">Skip to content</a><header><span class=\"brand\">muster</span>",
        escape(title)
    );
    if let Some(session) = session {
        html.push_str("<nav aria-label=\"Pages\"><ul>");
        for (path, name) in NAVIGATION {
            let marked = if path == current { " aria-current=\"page\"" } else { "" };
            let _ = write!(html, "<li><a href=\"{path}\"{marked}>{name}</a></li>");
        }
        let _ = write!(
            html,
            "</ul></nav><form class=\"signout\" method=\"post\" action=\"/signout\">{}\
             <span class=\"who\">Signed in as {}</span> <button type=\"submit\">Sign out</button></form>",
            csrf_field(session),
            escape(&session.who())
        );
    }
    let _ = write!(html, "</header><main id=\"main\"><h1>{}</h1>{body}</main></body></html>", escape(title));
    html
}

/// The hidden field that carries the session's CSRF token in a form.
pub(crate) fn csrf_field(session: &Session) -> String {
    format!("<input type=\"hidden\" name=\"csrf\" value=\"{}\">", escape(&session.csrf))
}

/// A notice at the top of a page: `kind` is `error` or `info`.
pub(crate) fn notice(kind: &str, text: &str) -> String {
    let role = if kind == "error" { "alert" } else { "status" };
    format!("<p class=\"notice {kind}\" role=\"{role}\">{}</p>", escape(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_values_is_text() {
        assert_eq!(
            escape("<script>alert('x')</script> & \""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;"
        );
        let block = json_block("data", &serde_json::json!({"output": "</script><script>alert(1)</script>"}));
        assert_eq!(block.matches("</script>").count(), 1, "{block}");
    }
}
