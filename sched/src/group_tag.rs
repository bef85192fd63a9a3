//! The resource group a statement names in a comment of its own: a tag such as
//! `/* pg_stride.resource_group=interactive */ SELECT …`, which gives that one statement
//! a group without a `SET` (and its round trip) before it.
//!
//! Where the tag may stand: in a block comment before the statement's first word, with
//! only whitespace and other block comments between the two. A line comment (`--`)
//! between them, a comment inside the statement, or one that nests another comment is
//! not read. The rule is the same whether the parser's statement location includes the
//! comments before the first word (PostgreSQL up to 17: it starts after the previous
//! statement's semicolon) or not (PostgreSQL 18: it starts at the first word), because
//! the tag is looked for backwards from the first word.
//!
//! The tag's syntax: `pg_stride.resource_group`, `=` (or `:`), and the group's name,
//! either quoted (`'…'` or `"…"`, taken as it is) or a bare word (lower-cased, as a `SET`
//! of an unquoted name is). Other text in the comment is left alone, so the tag can
//! share it with other key-value tags (`/* app='web', pg_stride.resource_group='x' */`).
//!
//! Text is bytes: PostgreSQL's query string is in the server encoding, and every byte
//! the scan looks for is ASCII, which no byte of a multibyte character in a server
//! encoding is.

/// The tag's key, the name of the parameter a `SET` would change.
pub const KEY: &[u8] = b"pg_stride.resource_group";

/// The group named by the tag of the statement at byte `location` of `source` (the
/// query string), or `None` if it carries none. A location past the end reads nothing.
pub fn statement_group(source: &[u8], location: usize) -> Option<Vec<u8>> {
    let start = location.min(source.len());
    let first_word = start + skip_comments(&source[start..]);
    tag_before(&source[..first_word])
}

/// Bytes of whitespace and comments (block comments nest, as in PostgreSQL) at the start
/// of `text`. An unterminated comment runs to the end.
fn skip_comments(text: &[u8]) -> usize {
    let mut i = 0;
    loop {
        while i < text.len() && is_space(text[i]) {
            i += 1;
        }
        let rest = &text[i..];
        if rest.starts_with(b"--") {
            i += rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
        } else if rest.starts_with(b"/*") {
            i += block_comment_len(rest);
        } else {
            return i;
        }
    }
}

/// Length of the block comment `text` starts with, nested comments included (all of
/// `text` for one not closed).
pub(crate) fn block_comment_len(text: &[u8]) -> usize {
    let mut depth = 0usize;
    let mut i = 0;
    while i + 1 < text.len() {
        match &text[i..i + 2] {
            b"/*" => {
                depth += 1;
                i += 2;
            }
            b"*/" => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return i;
                }
            }
            _ => i += 1,
        }
    }
    text.len()
}

/// The group of the nearest tag in the block comments that end `before`, walking back
/// over whitespace and comments that nest none.
fn tag_before(before: &[u8]) -> Option<Vec<u8>> {
    let mut end = before.len();
    loop {
        while end > 0 && is_space(before[end - 1]) {
            end -= 1;
        }
        let text = &before[..end];
        if !text.ends_with(b"*/") {
            return None;
        }
        let body_end = end - 2;
        let open = find_last(&text[..body_end], b"/*")?;
        let body = &text[open + 2..body_end];
        if find_last(body, b"*/").is_some() {
            // A nested comment: its opening cannot be told from the end.
            return None;
        }
        if let Some(group) = tag_in(body) {
            return Some(group);
        }
        end = open;
    }
}

/// The group a comment's text names, if it holds the tag.
fn tag_in(body: &[u8]) -> Option<Vec<u8>> {
    let mut from = 0;
    while let Some(at) = find_first(&body[from..], KEY).map(|i| from + i) {
        from = at + KEY.len();
        // The key must be a word of its own, not the tail of a longer name.
        if at > 0 && (is_word(body[at - 1]) || body[at - 1] == b'.') {
            continue;
        }
        let mut i = from;
        while i < body.len() && is_space(body[i]) {
            i += 1;
        }
        if i == body.len() || !matches!(body[i], b'=' | b':') {
            continue;
        }
        i += 1;
        while i < body.len() && is_space(body[i]) {
            i += 1;
        }
        return Some(value(&body[i..]));
    }
    None
}

/// A tag's value at the start of `text`: a quoted name up to its closing quote (or the
/// end), or a bare word lower-cased.
fn value(text: &[u8]) -> Vec<u8> {
    match text.first() {
        Some(&quote @ (b'\'' | b'"')) => {
            let rest = &text[1..];
            let len = rest.iter().position(|&b| b == quote).unwrap_or(rest.len());
            rest[..len].to_vec()
        }
        _ => {
            let len = text.iter().position(|&b| !is_word(b)).unwrap_or(text.len());
            text[..len].to_ascii_lowercase()
        }
    }
}

/// PostgreSQL's scanner's whitespace.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// A byte of an unquoted identifier: letters, digits, `_`, `$`, and every byte of a
/// multibyte character.
fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

fn find_first(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn find_last(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).rposition(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(source: &str, location: usize) -> Option<String> {
        statement_group(source.as_bytes(), location).map(|g| String::from_utf8(g).unwrap())
    }

    fn first(source: &str) -> Option<String> {
        group(source, 0)
    }

    #[test]
    fn a_leading_block_comment_names_the_group() {
        let g = Some("interactive".to_string());
        assert_eq!(
            first("/* pg_stride.resource_group=interactive */ SELECT 1"),
            g
        );
        assert_eq!(
            first("/*pg_stride.resource_group = 'interactive'*/SELECT 1"),
            g
        );
        assert_eq!(
            first("  \n/* pg_stride.resource_group: \"interactive\" */\tSELECT 1"),
            g
        );
        assert_eq!(
            first("/* app='web', pg_stride.resource_group='interactive' */ SELECT 1"),
            g
        );
        assert_eq!(
            first("/* pg_stride.resource_group=Interactive */ SELECT 1"),
            g
        );
        assert_eq!(
            first("/* pg_stride.resource_group='Mixed Case' */ SELECT 1"),
            Some("Mixed Case".to_string())
        );
    }

    #[test]
    fn only_comments_directly_before_the_first_word_count() {
        // Another block comment between the tag and the statement is passed over.
        assert_eq!(
            first("/* pg_stride.resource_group=a */ /* note */ SELECT 1"),
            Some("a".to_string())
        );
        // The nearest tag wins.
        assert_eq!(
            first("/* pg_stride.resource_group=a */ /* pg_stride.resource_group=b */ SELECT 1"),
            Some("b".to_string())
        );
        // A line comment in between hides it; one before it does not.
        assert_eq!(
            first("/* pg_stride.resource_group=a */\n-- note\nSELECT 1"),
            None
        );
        assert_eq!(
            first("-- note\n/* pg_stride.resource_group=a */\nSELECT 1"),
            Some("a".to_string())
        );
        // Inside or after the statement, in a line comment, or in a string: not a tag.
        assert_eq!(first("SELECT /* pg_stride.resource_group=a */ 1"), None);
        assert_eq!(first("SELECT 1 /* pg_stride.resource_group=a */"), None);
        assert_eq!(first("-- pg_stride.resource_group=a\nSELECT 1"), None);
        assert_eq!(first("SELECT '/* pg_stride.resource_group=a */'"), None);
    }

    #[test]
    fn near_misses_are_not_tags() {
        assert_eq!(first("/* my_pg_stride.resource_group=a */ SELECT 1"), None);
        assert_eq!(first("/* x.pg_stride.resource_group=a */ SELECT 1"), None);
        assert_eq!(first("/* pg_stride.resource_groups=a */ SELECT 1"), None);
        assert_eq!(first("/* pg_stride.resource_group a */ SELECT 1"), None);
        assert_eq!(first("/* pg_stride.resource_group */ SELECT 1"), None);
        // A nested comment is not read, but does not hide the statement's own tag.
        assert_eq!(
            first("/* /* pg_stride.resource_group=a */ */ SELECT 1"),
            None
        );
        assert_eq!(
            first("/* /* note */ */ /* pg_stride.resource_group=b */ SELECT 1"),
            Some("b".to_string())
        );
        // A key that misses is followed by one that is a tag.
        assert_eq!(
            first("/* pg_stride.resource_groups=a pg_stride.resource_group=b */ SELECT 1"),
            Some("b".to_string())
        );
    }

    #[test]
    fn each_statement_of_a_query_string_has_its_own_tag() {
        let source = "/* pg_stride.resource_group=a */ SELECT 1; \
                      /* pg_stride.resource_group=b */ SELECT 2; SELECT 3";
        // PostgreSQL up to 17: a later statement starts after the previous semicolon.
        let second = source.find("; ").unwrap() + 1;
        let third = source.rfind("; ").unwrap() + 1;
        assert_eq!(group(source, 0), Some("a".to_string()));
        assert_eq!(group(source, second), Some("b".to_string()));
        assert_eq!(group(source, third), None);
        // PostgreSQL 18: every statement starts at its first word.
        let at = |word| source.find(word).unwrap();
        assert_eq!(group(source, at("SELECT 1")), Some("a".to_string()));
        assert_eq!(group(source, at("SELECT 2")), Some("b".to_string()));
        assert_eq!(group(source, at("SELECT 3")), None);
    }

    #[test]
    fn odd_input_reads_nothing_or_a_plain_value() {
        assert_eq!(first(""), None);
        assert_eq!(group("SELECT 1", 100), None);
        assert_eq!(first("/* pg_stride.resource_group=a"), None);
        assert_eq!(first("*/ SELECT 1"), None);
        assert_eq!(
            first("/* pg_stride.resource_group='a */ SELECT 1"),
            Some("a ".to_string())
        );
        assert_eq!(
            first("/* pg_stride.resource_group= */ SELECT 1"),
            Some(String::new())
        );
        assert_eq!(
            statement_group(
                "/* pg_stride.resource_group=gr\u{fc}ppe */ SELECT 1".as_bytes(),
                0
            ),
            Some("gr\u{fc}ppe".as_bytes().to_vec())
        );
    }

    proptest::proptest! {
        /// Whatever the query string and location, the scan ends without panicking, and
        /// what it finds came from a comment that holds the key.
        #[test]
        fn any_input_is_read_without_panicking(
            source in proptest::collection::vec(
                proptest::sample::select(b"/*-'\" \n=:;apg_stride.resource_groupX".to_vec()),
                0..80,
            ),
            location in 0usize..100,
        ) {
            if statement_group(&source, location).is_some() {
                proptest::prop_assert!(find_first(&source, KEY).is_some());
            }
        }
    }
}
