//! Redis's `SCAN MATCH` glob, byte for byte.

/// Redis's glob (`stringmatchlen`, case-sensitive): `*` any run, `?` any one
/// byte, `[abc]`, `[^a]`, `[a-z]` classes, `\` escapes the next byte.
pub fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    while p < pattern.len() {
        match pattern[p] {
            b'*' => {
                while pattern.get(p + 1) == Some(&b'*') {
                    p += 1;
                }
                if p + 1 == pattern.len() {
                    return true;
                }
                // As Redis: the rest is tried against every non-empty suffix.
                return (t..text.len()).any(|start| glob_match(&pattern[p + 1..], &text[start..]));
            }
            b'?' => {
                if t >= text.len() {
                    return false;
                }
                t += 1;
            }
            b'[' => {
                let Some(&c) = text.get(t) else {
                    return false;
                };
                p += 1;
                let negate = pattern.get(p) == Some(&b'^');
                if negate {
                    p += 1;
                }
                let mut matched = false;
                // An unterminated class ends with the pattern, as in Redis.
                while let Some(&class) = pattern.get(p) {
                    if class == b']' {
                        break;
                    }
                    if class == b'\\' && p + 1 < pattern.len() {
                        p += 1;
                        matched |= pattern[p] == c;
                    } else if pattern.get(p + 1) == Some(&b'-') && p + 2 < pattern.len() {
                        let (low, high) = (class.min(pattern[p + 2]), class.max(pattern[p + 2]));
                        p += 2;
                        matched |= (low..=high).contains(&c);
                    } else {
                        matched |= class == c;
                    }
                    p += 1;
                }
                if matched == negate {
                    return false;
                }
                t += 1;
            }
            b'\\' if p + 1 < pattern.len() => {
                p += 1;
                if text.get(t) != Some(&pattern[p]) {
                    return false;
                }
                t += 1;
            }
            literal => {
                if text.get(t) != Some(&literal) {
                    return false;
                }
                t += 1;
            }
        }
        p += 1;
    }
    t == text.len()
}
