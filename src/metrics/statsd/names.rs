//! Stats keys as the reference writes them.

/// A stats key as the reference writes it: `:` and `|` (the protocol's separators) as `_`,
/// and the dots of an IPv4 address as `_` (so that an address is one name component).
/// Control characters, which would end a line, become `_` too.
pub fn sanitize(key: &str) -> String {
    let mut out: Vec<u8> = key
        .bytes()
        .map(|b| match b {
            b':' | b'|' => b'_',
            b if b.is_ascii_control() => b'_',
            b => b,
        })
        .collect();
    // Dotted quads: four runs of 1-3 digits joined by dots, not inside a longer number.
    let mut i = 0;
    while i < out.len() {
        let starts = out[i].is_ascii_digit() && (i == 0 || !out[i - 1].is_ascii_digit());
        if let Some(end) = starts.then(|| dotted_quad(&out[i..])).flatten() {
            for b in &mut out[i..i + end] {
                if *b == b'.' {
                    *b = b'_';
                }
            }
            i += end;
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or_default()
}

/// The length of the IPv4 address at the start of `bytes`, if there is one.
fn dotted_quad(bytes: &[u8]) -> Option<usize> {
    let mut at = 0;
    for part in 0..4 {
        if part > 0 {
            if bytes.get(at) != Some(&b'.') {
                return None;
            }
            at += 1;
        }
        let digits = bytes[at..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if !(1..=3).contains(&digits) {
            return None;
        }
        at += digits;
    }
    Some(at)
}
