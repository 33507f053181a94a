//! Text from outside (scenario names and checks, server errors, labels) made
//! safe for where it is written: one function per medium, used by every
//! writer of that medium.
//!
//! - `terminal`: control characters (ANSI escape sequences, carriage
//!   returns, C1 controls) shown as `\x1b`-style escapes; line breaks kept
//!   or, with `terminal_line`, shown too.
//! - `markdown`: text in a Markdown paragraph or table cell stays text: no
//!   HTML, link, image, emphasis or code, no table split, one line.
//! - `xml`: text or an attribute value in XML (JUnit, SVG) and HTML: the
//!   five markup characters as entities, and characters XML 1.0 forbids
//!   (most controls) as U+FFFD, so the document stays well-formed.
//!
//! Prometheus label values are escaped by the `prometheus` crate itself.

use std::borrow::Cow;
use std::fmt::Write;

/// A control character a terminal would act on.
fn is_terminal_control(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

/// `text` for a terminal: every control character but line breaks and
/// tabs written as `\xNN` / `\u{NNNN}`, so no escape sequence from a
/// server error or a submitted name reaches the terminal.
pub fn terminal(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_terminal_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if is_terminal_control(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `text` for one line of a terminal: `terminal`, with line breaks and
/// tabs shown as `\n` and `\t` too.
pub fn terminal_line(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => push_escaped(&mut out, c),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn push_escaped(out: &mut String, c: char) {
    let n = c as u32;
    if n <= 0xff {
        let _ = write!(out, "\\x{n:02x}");
    } else {
        let _ = write!(out, "\\u{{{n:04x}}}");
    }
}

/// `text` as plain text in Markdown (a paragraph or a table cell): one
/// line (breaks become spaces), control characters dropped, and every
/// character Markdown or its HTML acts on escaped (`\` before the ASCII
/// punctuation CommonMark lets be escaped; `<`, `>` and `&` as entities,
/// so no raw HTML, link, image or autolink survives: `:` and `.` are
/// escaped for GitHub's bare `http://` and `www.` links), `|` escaped so a
/// table keeps its columns.
pub fn markdown(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' | '\r' | '\t' => out.push(' '),
            c if c.is_control() => {}
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\\' | '`' | '*' | '_' | '{' | '}' | '[' | ']' | '(' | ')' | '#' | '+' | '-' | '.'
            | '!' | '|' | '~' | ':' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// Whether XML 1.0 allows `c` in a document.
fn xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

/// `text` in XML or HTML, as element text or a quoted attribute value.
pub fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if !xml_char(c) => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTILE: &str = "a\u{1b}[2J\u{1b}]0;pwned\u{7}b\rc\u{9b}31m\u{0}d\ne";

    #[test]
    fn terminals_see_no_control_sequence() {
        let t = terminal(HOSTILE);
        assert!(!t.chars().any(|c| c.is_control() && c != '\n'), "{t:?}");
        assert_eq!(t, "a\\x1b[2J\\x1b]0;pwned\\x07b\\x0dc\\x9b31m\\x00d\ne");
        let l = terminal_line(HOSTILE);
        assert!(!l.chars().any(char::is_control), "{l:?}");
        assert!(l.ends_with("d\\ne"));
        assert!(matches!(terminal("plain"), Cow::Borrowed(_)));
    }

    #[test]
    fn markdown_text_stays_text_on_one_line() {
        let m = markdown("<img src=x onerror=alert(1)> [a](http://x) ![i](y) *b* `c` a|b\nnext");
        assert!(!m.contains('<') && !m.contains('\n'), "{m}");
        assert!(m.contains("\\[a\\]\\(http\\://x\\)"), "{m}");
        assert!(m.contains("\\!\\[i\\]"), "{m}");
        assert!(m.contains("a\\|b next"), "{m}");
        assert!(!markdown(HOSTILE).chars().any(char::is_control));
    }

    #[test]
    fn xml_stays_well_formed() {
        let x = xml("<a href=\"x\">'&'</a>\u{0}\u{1b}\u{FFFE}ok\tz");
        assert_eq!(
            x,
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;\u{FFFD}\u{FFFD}\u{FFFD}ok\tz"
        );
    }
}
