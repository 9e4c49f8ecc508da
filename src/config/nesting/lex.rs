//! The byte-level reads of the nesting scan: where plain and quoted scalars end, anchors,
//! tags and blanks, document markers, and lines as libyaml breaks them.

pub(super) enum Plain {
    /// The scalar is a mapping key; the offset of its `:`.
    Key(usize),
    /// A comment ends it.
    Comment,
    /// It reaches the end of the line (and may go on).
    Line,
}

/// Where a plain scalar in block context that starts at `i` ends.
pub(super) fn plain_end(l: &[u8], mut i: usize) -> Plain {
    while i < l.len() {
        match l[i] {
            b':' if blank_or_end(l, i + 1) => return Plain::Key(i),
            b'#' if i > 0 && is_blank(l[i - 1]) => return Plain::Comment,
            _ => i += 1,
        }
    }
    Plain::Line
}

/// The offset just past the quote that closes a scalar whose text starts at `i`, if it
/// closes on this line.
pub(super) fn quoted_end(l: &[u8], mut i: usize, quote: u8) -> Option<usize> {
    while i < l.len() {
        match l[i] {
            b'\\' if quote == b'"' => i += 2,
            b'\'' if quote == b'\'' && l.get(i + 1) == Some(&b'\'') => i += 2,
            b if b == quote => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// Past an anchor or alias name (libyaml: letters, digits, `-`, `_`).
pub(super) fn skip_anchor(l: &[u8], mut i: usize) -> usize {
    while i < l.len() && (l[i].is_ascii_alphanumeric() || l[i] == b'-' || l[i] == b'_') {
        i += 1;
    }
    i
}

/// Past a tag at `i`. libyaml requires a blank (or in flow context a `,`) after a tag, so
/// skipping to one skips what it skips, or the parser fails there.
pub(super) fn skip_tag(l: &[u8], i: usize, flow: bool) -> usize {
    if l.get(i + 1) == Some(&b'<') {
        return l[i..]
            .iter()
            .position(|&b| b == b'>')
            .map_or(l.len(), |p| i + p + 1);
    }
    let mut i = i + 1;
    while i < l.len() && !is_blank(l[i]) && !(flow && l[i] == b',') {
        i += 1;
    }
    i
}

pub(super) fn skip_blanks(l: &[u8], mut i: usize) -> usize {
    while i < l.len() && is_blank(l[i]) {
        i += 1;
    }
    i
}

pub(super) fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

pub(super) fn blank_or_end(l: &[u8], i: usize) -> bool {
    l.get(i).is_none_or(|&b| is_blank(b))
}

/// `---` or `...` at the start of a line, alone or followed by a blank.
pub(super) fn document_marker(l: &[u8]) -> bool {
    (l.starts_with(b"---") || l.starts_with(b"...")) && blank_or_end(l, 3)
}

/// The lines of `text` split at every line break libyaml knows: LF, CRLF, CR, and the
/// Unicode NEL, LS and PS.
pub(super) fn lines(text: &str) -> impl Iterator<Item = &[u8]> {
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut done = false;
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        let mut i = start;
        while i < bytes.len() {
            let next = |k: usize| bytes.get(i + k).copied();
            let width = match bytes[i] {
                b'\n' => 1,
                b'\r' if next(1) == Some(b'\n') => 2,
                b'\r' => 1,
                0xC2 if next(1) == Some(0x85) => 2,
                0xE2 if next(1) == Some(0x80) && matches!(next(2), Some(0xA8 | 0xA9)) => 3,
                _ => 0,
            };
            if width > 0 {
                let line = &bytes[start..i];
                start = i + width;
                return Some(line);
            }
            i += 1;
        }
        done = true;
        Some(&bytes[start..])
    })
}
