//! Small string helpers shared by the verifiers, written to match the Python of the reference implementations:
//! `str.isspace`/`str.strip` and `re.findall(r"<tag>(.*?)</tag>", s, re.DOTALL)[-1]`.
//!
//! Tag search is a linear scan with `str::find` instead of a regex: with literal delimiters a
//! non-greedy match starts at the first `<tag>` after the previous match and ends at the first
//! `</tag>` after it, and once an opening tag has no closing tag after it no later one can have one
//! either. A regex reference implementation checks this in the tests.

/// Python's `str.isspace()` for one character: Unicode `White_Space` plus the four ASCII
/// information separators U+001C..U+001F, which Python also counts as whitespace.
pub fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `s.strip()`.
pub fn py_strip(s: &str) -> &str {
    s.trim_matches(py_isspace)
}

/// Python's `s.rstrip()`.
pub fn py_rstrip(s: &str) -> &str {
    s.trim_end_matches(py_isspace)
}

/// Byte offset of the first occurrence of `pat` in `s` at or after `from`: `memchr` for the
/// first byte, then a direct comparison (the patterns are short tags and the texts a few hundred
/// bytes, where `str::find`'s two-way searcher costs more to set up than the search itself).
#[inline]
pub fn find_at(s: &str, from: usize, pat: &str) -> Option<usize> {
    let (h, p) = (s.as_bytes(), pat.as_bytes());
    let (&first, rest) = p.split_first()?;
    if h.len() < p.len() {
        return None;
    }
    let last_start = h.len() - p.len();
    let mut i = from;
    while i <= last_start {
        let at = i + memchr::memchr(first, &h[i..=last_start])?;
        if h[at + 1..at + p.len()]
            .iter()
            .zip(rest)
            .all(|(a, b)| a == b)
        {
            return Some(at);
        }
        i = at + 1;
    }
    None
}

/// Byte ranges `(start, end)` of the contents of every non-overlapping, non-greedy
/// `open(.*?)close` match, left to right (DOTALL).
pub fn tag_matches(s: &str, open: &str, close: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(i) = find_at(s, pos, open) {
        let cstart = i + open.len();
        match find_at(s, cstart, close) {
            Some(j) => {
                out.push((cstart, j));
                pos = j + close.len();
            }
            None => break,
        }
    }
    out
}

/// Contents of the last non-greedy `open(.*?)close` match (DOTALL), unstripped; `None` if none.
pub fn last_tag<'a>(s: &'a str, open: &str, close: &str) -> Option<&'a str> {
    // The last match is found scanning left to right (matches cannot be found from the right:
    // `<a>x<a>y</a>` has the single match `x<a>y`), but without collecting them.
    let mut pos = 0;
    let mut last = None;
    while let Some(i) = find_at(s, pos, open) {
        let cstart = i + open.len();
        match find_at(s, cstart, close) {
            Some(j) => {
                last = Some((cstart, j));
                pos = j + close.len();
            }
            None => break,
        }
    }
    last.map(|(a, b)| &s[a..b])
}

/// Contents of the last `<answer>…</answer>` (DOTALL), stripped as Python strips.
pub fn last_answer(s: &str) -> Option<&str> {
    last_tag(s, "<answer>", "</answer>").map(py_strip)
}

/// Byte offset in `inner` (the text after an opening `{`) of the `}` that closes it, braces
/// balanced; `None` when it is never closed.
pub fn closing_brace(inner: &str) -> Option<usize> {
    let mut depth = 1usize;
    for (k, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}

/// Contents of the last `\boxed{…}` (brace-balanced; `\boxed 5` and `\fbox{}` too), if any.
pub fn last_boxed(s: &str) -> Option<&str> {
    let mut best: Option<&str> = None;
    let mut pos = 0;
    while pos < s.len() {
        let rest = &s[pos..];
        let (i, name_len) = match (rest.find("\\boxed"), rest.find("\\fbox")) {
            (Some(a), Some(b)) if b < a => (b, 5),
            (Some(a), _) => (a, 6),
            (None, Some(b)) => (b, 5),
            (None, None) => break,
        };
        let after = pos + i + name_len;
        let tail = &s[after..];
        if let Some(inner) = tail.strip_prefix('{') {
            match closing_brace(inner) {
                Some(k) => {
                    best = Some(&inner[..k]);
                    pos = after + 1 + k + 1;
                }
                None => break,
            }
        } else if let Some(sp) = tail.strip_prefix(' ') {
            // `\boxed 5`: up to the next whitespace or `$`
            let end = sp
                .find(|c: char| c.is_whitespace() || c == '$')
                .unwrap_or(sp.len());
            if end > 0 {
                best = Some(&sp[..end]);
            }
            pos = after + 1 + end;
        } else {
            pos = after;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn strip_like_python() {
        // Python: " \x1c1\x1c ".strip() == "1"; "\u00a0x\u2028".strip() == "x"
        assert_eq!(py_strip(" \x1c1\x1c "), "1");
        assert_eq!(py_strip("\u{a0}x\u{2028}"), "x");
        assert_eq!(py_strip("\u{200b}x"), "\u{200b}x"); // zero-width space is not whitespace
    }

    #[test]
    fn last_tag_cases() {
        assert_eq!(last_tag("<a>1</a> <a>2</a>", "<a>", "</a>"), Some("2"));
        assert_eq!(last_tag("<a>x<a>y</a>", "<a>", "</a>"), Some("x<a>y"));
        assert_eq!(last_tag("<a>1</a><a>open", "<a>", "</a>"), Some("1"));
        assert_eq!(last_tag("<a>\n1\n</a>", "<a>", "</a>"), Some("\n1\n"));
        assert_eq!(last_tag("none", "<a>", "</a>"), None);
        assert_eq!(last_answer("<answer> 3*7+2 </answer>"), Some("3*7+2"));
    }

    #[test]
    fn boxed() {
        assert_eq!(
            last_boxed("\\boxed{1} and \\boxed{\\frac{1}{2}}"),
            Some("\\frac{1}{2}")
        );
        assert_eq!(last_boxed("so \\boxed 5$"), Some("5"));
        assert_eq!(last_boxed("\\boxed{unclosed"), None);
        assert_eq!(last_boxed("\\fbox{7}"), Some("7"));
    }

    proptest! {
        #[test]
        fn find_at_equals_str_find(s in "[ab<>/]{0,20}", pat in "[ab<>/]{1,4}", from in 0usize..22) {
            let from = from.min(s.len());
            prop_assert_eq!(find_at(&s, from, &pat), s[from..].find(pat.as_str()).map(|i| i + from));
        }

        // The scan equals Python's `re.findall(r"<a>(.*?)</a>", s, re.DOTALL)`.
        #[test]
        fn scan_equals_regex(s in "(<a>|</a>|x|\n|<|a|>){0,24}") {
            let re = regex::Regex::new(r"(?s)<a>(.*?)</a>").unwrap();
            let want: Vec<(usize, usize)> = re
                .captures_iter(&s)
                .map(|c| { let m = c.get(1).unwrap(); (m.start(), m.end()) })
                .collect();
            prop_assert_eq!(tag_matches(&s, "<a>", "</a>"), want.clone());
            prop_assert_eq!(last_tag(&s, "<a>", "</a>"), want.last().map(|&(a, b)| &s[a..b]));
        }
    }
}
