//! A statement's fingerprint from its text: what tells executions of "the same
//! statement" apart when PostgreSQL computed no query identifier for it.
//!
//! Query identifiers cost PostgreSQL a walk of every statement's parse tree at parse
//! analysis (`JumbleQuery`): about 2,400 instructions for a primary-key SELECT sent as
//! text, more than everything else pg_stride adds to it. Where pg_stride needs to
//! recognise a statement it has seen (a plan estimated tiny that ran long,
//! `cpu::tiny`), the text serves, read only when needed: numeric and string constants
//! are left out, so that the same statement with other values has the same
//! fingerprint, as with a query identifier; comments (`--`, `/* */`) and runs of
//! whitespace count as one space, and at the start as none, so that a comment a client
//! adds to each statement (a request id, a changing tag) does not make a new statement
//! of it, which would escape what its fingerprint's long runs taught (`long_runs`).
//! Identifiers that contain digits (`t1`, `$1`) are kept whole. Two statements that
//! differ only in their constants' values share a fingerprint even where PostgreSQL
//! would tell them apart (a constant's type), and so do two that differ only after a
//! quote or a comment's start the scan takes for one (in a quoted identifier or a
//! dollar-quoted string, or an escaped quote in an `E'…'` string); the callers use it to
//! schedule, never to decide what a statement may do.
//!
//! Text is bytes in the server encoding; every byte looked at is ASCII, which no byte of
//! a multibyte character in a server encoding is.

use crate::group_tag::block_comment_len;

/// The fingerprint of `text`, never 0 (0 marks an empty entry in the callers' tables).
pub fn of_text(text: &[u8]) -> u64 {
    let mut hash = Fnv::new();
    let mut i = 0;
    // Whether the byte before the current one belongs to an identifier or a keyword, so
    // that a digit continues it rather than starting a number.
    let mut in_word = false;
    let mut pending_space = false;
    while i < text.len() {
        let b = text[i];
        let comment = match (b, text.get(i + 1)) {
            (b'-', Some(b'-')) => Some(line_end(text, i + 2)),
            (b'/', Some(b'*')) => Some(i + block_comment_len(&text[i..])),
            _ => None,
        };
        if b.is_ascii_whitespace() || comment.is_some() {
            pending_space = hash.started;
            in_word = false;
            i = comment.unwrap_or(i + 1);
            continue;
        }
        if pending_space {
            hash.byte(b' ');
            pending_space = false;
        }
        if b == b'\'' {
            i = string_end(text, i + 1);
            hash.byte(b'?');
            in_word = false;
        } else if b.is_ascii_digit() && !in_word {
            i = number_end(text, i);
            hash.byte(b'?');
        } else {
            hash.byte(b);
            in_word = b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80;
            i += 1;
        }
    }
    hash.finish()
}

/// Where the line holding `i` ends: the byte after its newline, or the text's end.
fn line_end(text: &[u8], i: usize) -> usize {
    text[i.min(text.len())..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(text.len(), |n| i + n + 1)
}

/// Where the string constant whose first byte after the opening quote is at `i` ends:
/// the byte after its closing quote (a doubled quote stays inside), or the text's end.
fn string_end(text: &[u8], mut i: usize) -> usize {
    while i < text.len() {
        if text[i] == b'\'' {
            if text.get(i + 1) == Some(&b'\'') {
                i += 2;
                continue;
            }
            return i + 1;
        }
        i += 1;
    }
    text.len()
}

/// Where the numeric constant starting at `i` ends: digits, a decimal point and an
/// exponent (`1.5e-3`).
fn number_end(text: &[u8], mut i: usize) -> usize {
    while i < text.len() && (text[i].is_ascii_digit() || text[i] == b'.') {
        i += 1;
    }
    if i < text.len() && (text[i] == b'e' || text[i] == b'E') {
        let mut j = i + 1;
        if j < text.len() && (text[j] == b'+' || text[j] == b'-') {
            j += 1;
        }
        if j < text.len() && text[j].is_ascii_digit() {
            i = j;
            while i < text.len() && text[i].is_ascii_digit() {
                i += 1;
            }
        }
    }
    i
}

/// 64-bit FNV-1a: a few instructions per byte, and spread well enough for a table of
/// eight entries.
struct Fnv {
    state: u64,
    started: bool,
}

impl Fnv {
    fn new() -> Self {
        Fnv {
            state: 0xcbf2_9ce4_8422_2325,
            started: false,
        }
    }

    fn byte(&mut self, b: u8) {
        self.state = (self.state ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        self.started = true;
    }

    fn finish(self) -> u64 {
        self.state.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::of_text;

    #[test]
    fn comments_do_not_count() {
        let plain = of_text(b"SELECT count(*) FROM stale WHERE v = 1");
        for text in [
            &b"SELECT count(*) FROM stale WHERE v = 1 /* request 17 */"[..],
            b"/* app: billing */ SELECT count(*) FROM stale WHERE v = 1",
            b"SELECT count(*) -- n\nFROM stale WHERE v = 1 -- z",
            b"SELECT count(*) /* a /* nested */ b */ FROM stale WHERE v = 1",
            b"SELECT count(*)/**/FROM stale WHERE v = 1",
        ] {
            assert_eq!(of_text(text), plain, "{}", String::from_utf8_lossy(text));
        }
        // A comment's markers inside a string are the string's; the text still differs
        // from the plain statement only by the string's value.
        assert_eq!(
            of_text(b"SELECT count(*) FROM stale WHERE v = '/* x'"),
            of_text(b"SELECT count(*) FROM stale WHERE v = 'y'")
        );
        // What follows an unclosed comment is in it.
        assert_eq!(of_text(b"SELECT 1 /* FROM t"), of_text(b"SELECT 1"));
        assert_ne!(of_text(b"SELECT a - -b"), of_text(b"SELECT a"));
    }

    #[test]
    fn constants_do_not_count() {
        assert_eq!(
            of_text(b"SELECT abalance FROM pgbench_accounts WHERE aid = 123"),
            of_text(b"SELECT abalance FROM pgbench_accounts WHERE aid = 98765")
        );
        assert_eq!(
            of_text(b"SELECT * FROM t WHERE name = 'ab''c' AND x < 1.5e-3"),
            of_text(b"SELECT * FROM t WHERE name = '' AND x < 42")
        );
    }

    #[test]
    fn whitespace_counts_as_one_space() {
        assert_eq!(
            of_text(b"  SELECT count(*)\n  FROM few()"),
            of_text(b"SELECT count(*) FROM few()")
        );
        assert_ne!(of_text(b"SELECT a FROM t"), of_text(b"SELECT aFROM t"));
    }

    #[test]
    fn identifiers_with_digits_and_parameters_are_kept() {
        assert_ne!(
            of_text(b"SELECT * FROM t1 WHERE id = 5"),
            of_text(b"SELECT * FROM t2 WHERE id = 5")
        );
        assert_ne!(
            of_text(b"SELECT * FROM t WHERE a = $1 AND b = $2"),
            of_text(b"SELECT * FROM t WHERE a = $2 AND b = $1")
        );
    }

    #[test]
    fn different_statements_differ() {
        assert_ne!(of_text(b"SELECT f()"), of_text(b"SELECT g()"));
        assert_ne!(
            of_text(b"SELECT a FROM t WHERE b = 1"),
            of_text(b"SELECT a FROM t WHERE c = 1")
        );
    }

    #[test]
    fn unterminated_constants_and_empty_text_are_fingerprinted() {
        assert_ne!(of_text(b""), 0);
        assert_eq!(of_text(b"SELECT 'abc"), of_text(b"SELECT 'x"));
        assert_eq!(of_text(b"SELECT 1e"), of_text(b"SELECT 2e"));
    }
}
