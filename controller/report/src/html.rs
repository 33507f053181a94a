//! report.html: the Markdown report as one self-contained page (inline
//! CSS and SVG plots, no script, nothing fetched), readable on a phone:
//! wide tables scroll sideways inside the page.
//!
//! The Markdown is rendered by pulldown-cmark (tables on). Everything in
//! it that would be raw HTML is rendered as text instead: a report holds
//! text from scenarios, agents and PostgreSQL (cell errors, names,
//! settings), and none of it may become markup. Images naming one of the
//! report's plots become that SVG inline. Each `##` section is a
//! `<section>`; the verdicts (Checks, History checks) are panels that stand
//! out from the figures below them.

use std::collections::BTreeMap;

use pulldown_cmark::{CowStr, Event, HeadingLevel, Options, Parser, Tag, TagEnd, html};

const CSS: &str = r#"
:root { color-scheme: light; }
body { font: 15px/1.45 -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       margin: 0 auto; padding: 12px 16px 48px; max-width: 1100px; color: #1b1f24; background: #fff; }
h1 { font-size: 1.5em; margin: 0.4em 0; word-break: break-word; }
h2 { font-size: 1.2em; margin: 1.6em 0 0.5em; padding-bottom: 0.2em; border-bottom: 1px solid #d8dee4; }
h3 { font-size: 1.05em; }
.scroll { overflow-x: auto; -webkit-overflow-scrolling: touch; margin: 0.6em 0; }
table { border-collapse: collapse; font-size: 0.92em; }
th, td { border: 1px solid #d8dee4; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
tr:nth-child(even) td { background: #fbfcfd; }
code { font: 0.9em ui-monospace, SFMono-Regular, Menlo, monospace; background: #f3f4f6; padding: 0 3px; border-radius: 3px; }
blockquote { margin: 0.6em 0; padding: 0.3em 0.9em; border-left: 4px solid #e3b341; background: #fff8e6; }
svg { max-width: 100%; height: auto; display: block; margin: 0.6em 0; }
section.panel { border: 1px solid #d8dee4; border-radius: 6px; padding: 0 14px 8px; margin: 1.2em 0; background: #f8fafc; }
section.panel h2 { margin-top: 0.7em; }
@media (max-width: 600px) { body { font-size: 14px; padding: 8px; } th, td { padding: 3px 5px; } }
"#;

/// The page for `md`, with `plots` (file name, SVG) inlined where the
/// Markdown shows them.
pub fn render(title: &str, md: &str, plots: &[(String, String)]) -> String {
    let svgs: BTreeMap<&str, &str> = plots
        .iter()
        .map(|(n, s)| (n.as_str(), s.as_str()))
        .collect();
    let mut events = Vec::new();
    let mut in_image: Option<bool> = None;
    let mut in_section = false;
    let parsed: Vec<Event> =
        Parser::new_ext(md, Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH).collect();
    for (i, e) in parsed.iter().cloned().enumerate() {
        match e {
            Event::Start(Tag::Heading {
                level: HeadingLevel::H2,
                ..
            }) => {
                if in_section {
                    events.push(Event::Html(CowStr::from("</section>")));
                }
                let verdicts = matches!(parsed.get(i + 1), Some(Event::Text(t))
                    if t.starts_with("Checks") || t.starts_with("History checks"));
                events.push(Event::Html(CowStr::from(if verdicts {
                    "<section class=\"panel\">"
                } else {
                    "<section>"
                })));
                in_section = true;
                events.push(e);
            }
            Event::Start(Tag::Image { dest_url, .. }) => {
                match svgs.get(dest_url.as_ref()) {
                    Some(svg) => {
                        events.push(Event::Html(CowStr::from(svg.to_string())));
                        in_image = Some(true);
                    }
                    // Not one of the report's plots: its alt text only.
                    None => in_image = Some(false),
                }
            }
            Event::End(TagEnd::Image) => in_image = None,
            Event::Text(t) if in_image == Some(false) => events.push(Event::Text(t)),
            _ if in_image.is_some() => {}
            // Markup in the text is shown, never interpreted; a link (the
            // report makes none: one would come from some text in it) is
            // its text only.
            Event::Html(t) | Event::InlineHtml(t) => events.push(Event::Text(t)),
            Event::Start(Tag::Link { .. }) | Event::End(TagEnd::Link) => {}
            Event::Start(Tag::Table(a)) => {
                events.push(Event::Html(CowStr::from("<div class=\"scroll\">")));
                events.push(Event::Start(Tag::Table(a)));
            }
            Event::End(TagEnd::Table) => {
                events.push(Event::End(TagEnd::Table));
                events.push(Event::Html(CowStr::from("</div>")));
            }
            e => events.push(e),
        }
    }
    if in_section {
        events.push(Event::Html(CowStr::from("</section>")));
    }
    let mut body = String::new();
    html::push_html(&mut body, events.into_iter());
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n\
         <title>{}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}</body>\n</html>\n",
        escape(title)
    )
}

fn escape(s: &str) -> String {
    pgfleet_proto::escape::xml(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_are_inlined_tables_scroll_and_markup_in_text_stays_text() {
        let md = "# pgfleet run r\n\n| a | b |\n|---|---|\n| <script>alert(1)</script> | `x<y` |\n\n\
                  ![tps](tps.svg)\n\n![gone](missing.svg)\n\n<img src=http://example.com/x.png>\n\n\
                  see [here](http://example.com/x) or <http://example.com/y>\n";
        let svg = "<svg xmlns=\"http://www.w3.org/2000/svg\"><text>TPS</text></svg>";
        let page = render("run <r>", md, &[("tps.svg".into(), svg.into())]);
        assert!(page.starts_with("<!DOCTYPE html>"));
        assert!(page.contains("<title>run &lt;r&gt;</title>"));
        assert!(page.contains(svg), "{page}");
        assert!(page.contains("<div class=\"scroll\"><table>"), "{page}");
        assert!(!page.contains("<script"), "{page}");
        assert!(
            page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{page}"
        );
        assert!(!page.contains("<img"), "{page}");
        assert!(
            page.contains("gone"),
            "an unknown image keeps its alt text: {page}"
        );
        assert!(!page.contains("missing.svg"), "{page}");
        assert!(
            page.contains("see here or http://example.com/y") && !page.contains("<a "),
            "{page}"
        );
        // Sections; the verdicts stand out as panels.
        let sections = render(
            "r",
            "# run\n\n## Checks: 1 failed\n\nx\n\n## History checks\n\ny\n\n## Environment\n\nz\n",
            &[],
        );
        assert_eq!(
            sections.matches("<section class=\"panel\">").count(),
            2,
            "{sections}"
        );
        assert_eq!(sections.matches("<section>").count(), 1, "{sections}");
        assert_eq!(sections.matches("</section>").count(), 3, "{sections}");
        // Nothing is fetched: no src or href leaves the page.
        for needle in ["<img", " src=\"", " href=\"http", "@import", "url("] {
            assert!(!page.contains(needle), "{needle}: {page}");
        }
    }
}
