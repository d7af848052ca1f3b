//! Making text from outside (a policy's reasons, messages, panics and log
//! lines) safe to put into a NodeMaintenance's status, an event, a log line
//! or a terminal.
//!
//! [`clean`] escapes every character that could change how the text looks
//! where it lands: C0 and C1 control characters (NUL, ESC, CR, LF, TAB,
//! DEL...), the bidirectional overrides and isolates (which reorder what a
//! reader sees), zero-width characters, and the line and paragraph
//! separators. Each becomes a visible escape (`\n`, `\u{1b}`), so nothing is
//! hidden and no line can be forged in `kubectl describe`. The result is
//! then cut to a byte length on a character boundary, marked with `…`.

/// Whether `c` must not reach a status, an event or a terminal as is.
fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            // bidi marks, embeddings, overrides and isolates
            '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
            // zero-width characters and the byte-order mark
            | '\u{200B}'..='\u{200D}' | '\u{2060}' | '\u{FEFF}'
            // line and paragraph separators
            | '\u{2028}' | '\u{2029}'
        )
}

/// The escape written in place of an unsafe character.
fn escape(c: char, out: &mut String) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        other => out.push_str(&format!("\\u{{{:x}}}", other as u32)),
    }
}

/// `text` with every unsafe character escaped, at most `max_bytes` long
/// (cut on a character boundary; a cut is marked with `…`).
pub fn clean(text: &str, max_bytes: usize) -> String {
    const MARK: &str = "…";
    let mut out = String::with_capacity(text.len().min(max_bytes));
    for c in text.chars() {
        let before = out.len();
        if is_unsafe(c) {
            escape(c, &mut out);
        } else {
            out.push(c);
        }
        if out.len() > max_bytes {
            out.truncate(before);
            // Make room for the mark, on a character boundary.
            let mut end = max_bytes.saturating_sub(MARK.len()).min(out.len());
            while !out.is_char_boundary(end) {
                end -= 1;
            }
            out.truncate(end);
            if max_bytes >= MARK.len() {
                out.push_str(MARK);
            }
            break;
        }
    }
    out
}

/// A duration as a person writes it: `500ms`, `5s`, `1m30s`.
pub fn duration(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}

/// Whether `clean` would leave `text` as it is (no unsafe character, short
/// enough).
pub fn is_clean(text: &str, max_bytes: usize) -> bool {
    text.len() <= max_bytes && !text.chars().any(is_unsafe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_unchanged() {
        assert_eq!(
            clean("pod db-0 holds quorum (é, 日本)", 100),
            "pod db-0 holds quorum (é, 日本)"
        );
        assert!(is_clean("ok", 2));
    }

    #[test]
    fn every_class_of_unsafe_character_is_escaped() {
        let cases = [
            ("a\nPhase: Succeeded", "a\\nPhase: Succeeded"),
            ("cr\rover", "cr\\rover"),
            ("tab\tx", "tab\\tx"),
            ("nul\0x", "nul\\u{0}x"),
            ("esc\u{1b}[31mred", "esc\\u{1b}[31mred"),
            ("del\u{7f}", "del\\u{7f}"),
            ("c1\u{9b}31m", "c1\\u{9b}31m"),
            ("bidi\u{202e}txt.exe", "bidi\\u{202e}txt.exe"),
            ("iso\u{2066}x\u{2069}", "iso\\u{2066}x\\u{2069}"),
            ("zw\u{200b}j", "zw\\u{200b}j"),
            ("bom\u{feff}", "bom\\u{feff}"),
            ("ls\u{2028}ps\u{2029}", "ls\\u{2028}ps\\u{2029}"),
        ];
        for (raw, want) in cases {
            assert_eq!(clean(raw, 200), want, "{raw:?}");
            assert!(!is_clean(raw, 200));
            assert!(!clean(raw, 200).chars().any(is_unsafe));
        }
    }

    #[test]
    fn long_text_is_cut_on_a_character_boundary_with_a_mark() {
        let s = "é".repeat(100);
        let c = clean(&s, 11);
        assert!(c.len() <= 11, "{c}");
        assert!(c.ends_with('…'));
        // An escape is never cut in half into something unsafe.
        let c = clean(&"\u{1b}".repeat(50), 20);
        assert!(c.len() <= 20);
        assert!(!c.chars().any(is_unsafe));
    }
}
