//! Reads the values at a few JSON pointers out of a frame in one pass, without
//! building a JSON tree of the frame.
//!
//! The frame is walked with serde_json's streaming deserializer: object members
//! and array elements that no pointer leads into are skipped (validated, never
//! allocated); only the values the pointers end at are materialised, so a frame
//! with a large payload costs one scan and three small values. The result is
//! exactly what `serde_json::Value::pointer` returns on the parsed frame (RFC
//! 6901: `~1` is `/`, `~0` is `~`, array indices without leading zeros, the empty
//! pointer is the whole document, a duplicated key means its last occurrence),
//! and a frame that is not valid JSON fails as `serde_json::from_str` would,
//! with one exception: a number beyond f64's range in a part no pointer reads
//! is passed over (the payload is kept as text, so nothing needs its value).

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// Most pointers one [`Extractor`] evaluates (a bit mask per value).
pub const MAX_POINTERS: usize = 16;

/// A parsed JSON pointer: `None` when the text is not a pointer at all (not
/// empty and not starting with `/`), which never resolves, as in serde_json.
type Tokens = Option<Vec<String>>;

fn parse_pointer(pointer: &str) -> Tokens {
    if pointer.is_empty() {
        return Some(Vec::new());
    }
    if !pointer.starts_with('/') {
        return None;
    }
    Some(
        pointer
            .split('/')
            .skip(1)
            .map(|token| token.replace("~1", "/").replace("~0", "~"))
            .collect(),
    )
}

/// serde_json's array index rule: no sign, no leading zero.
fn parse_index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
        return None;
    }
    token.parse().ok()
}

/// Evaluates a fixed list of JSON pointers against frames.
#[derive(Debug, Clone)]
pub struct Extractor {
    pointers: Vec<Tokens>,
}

impl Extractor {
    /// An extractor for `pointers` (at most [`MAX_POINTERS`]; extra ones never resolve).
    pub fn new<S: AsRef<str>>(pointers: &[S]) -> Self {
        Extractor {
            pointers: pointers
                .iter()
                .take(MAX_POINTERS)
                .map(|p| parse_pointer(p.as_ref()))
                .chain(std::iter::repeat(None))
                .take(pointers.len())
                .collect(),
        }
    }

    /// The value at each pointer, in order (`None`: the pointer does not
    /// resolve). Fails when `text` is not one valid JSON document.
    pub fn extract(&self, text: &str) -> Result<Vec<Option<Value>>, serde_json::Error> {
        let mut out = vec![None; self.pointers.len()];
        let active = self
            .pointers
            .iter()
            .enumerate()
            .filter(|(_, tokens)| tokens.is_some())
            .fold(0u16, |mask, (i, _)| mask | (1 << i));
        let mut deserializer = serde_json::Deserializer::from_str(text);
        Walk {
            pointers: &self.pointers,
            depth: 0,
            active,
            out: &mut out,
        }
        .deserialize(&mut deserializer)?;
        deserializer.end()?;
        Ok(out)
    }
}

/// The tokens of pointer `i` (only called for pointers that parsed).
fn tokens(pointers: &[Tokens], i: usize) -> &[String] {
    pointers[i].as_deref().unwrap_or_default()
}

/// The indices of the set bits, lowest first (only those are visited: this
/// runs for every key of every frame).
fn bits(mut mask: u16) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (mask != 0).then(|| {
            let i = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            i
        })
    })
}

/// One value of the document, with the pointers (`active`) whose first `depth`
/// tokens led here.
struct Walk<'a> {
    pointers: &'a [Tokens],
    depth: usize,
    active: u16,
    out: &'a mut [Option<Value>],
}

impl Walk<'_> {
    /// The pointers among `active` whose next token names `key` (an object
    /// member) or `index` (an array element).
    fn matching(&self, key: Option<&str>, index: Option<usize>) -> u16 {
        bits(self.active)
            .filter(|&i| {
                let token = &tokens(self.pointers, i)[self.depth];
                match (key, index) {
                    (Some(key), _) => token == key,
                    (_, Some(index)) => parse_index(token) == Some(index),
                    _ => false,
                }
            })
            .fold(0, |mask, i| mask | (1 << i))
    }

    /// A later occurrence of a key replaces what an earlier one resolved.
    fn clear(&mut self, mask: u16) {
        for i in bits(mask) {
            self.out[i] = None;
        }
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        let ending = bits(self.active)
            .filter(|&i| tokens(self.pointers, i).len() == self.depth)
            .fold(0u16, |mask, i| mask | (1 << i));
        if ending == 0 {
            return deserializer.deserialize_any(self);
        }
        // Some pointer ends here: this value is wanted whole. Pointers that go
        // deeper (a pointer and its own prefix) are read from it.
        let value = Value::deserialize(deserializer)?;
        // The usual case, one pointer ending here and none deeper, takes the
        // value itself: a copy would allocate a string twice per frame.
        if self.active == ending && ending.count_ones() == 1 {
            self.out[ending.trailing_zeros() as usize] = Some(value);
            return Ok(());
        }
        for i in bits(self.active) {
            let rest = &tokens(self.pointers, i)[self.depth..];
            self.out[i] = rest
                .iter()
                .try_fold(&value, |target, token| match target {
                    Value::Object(map) => map.get(token),
                    Value::Array(list) => parse_index(token).and_then(|x| list.get(x)),
                    _ => None,
                })
                .cloned();
        }
        Ok(())
    }
}

use serde::Deserialize as _;

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        while let Some(mask) = map.next_key_seed(Key { walk: &self })? {
            if mask == 0 {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            self.clear(mask);
            map.next_value_seed(Walk {
                pointers: self.pointers,
                depth: self.depth + 1,
                active: mask,
                out: self.out,
            })?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        let mut index = 0;
        loop {
            let mask = self.matching(None, Some(index));
            let more = if mask == 0 {
                seq.next_element::<IgnoredAny>()?.is_some()
            } else {
                self.clear(mask);
                seq.next_element_seed(Walk {
                    pointers: self.pointers,
                    depth: self.depth + 1,
                    active: mask,
                    out: self.out,
                })?
                .is_some()
            };
            if !more {
                return Ok(());
            }
            index += 1;
        }
    }

    // Scalars: no pointer leads through them.
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_i128<E>(self, _: i128) -> Result<(), E> {
        Ok(())
    }
    fn visit_u128<E>(self, _: u128) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// An object key, answered with the pointers whose next token it is.
struct Key<'w, 'a> {
    walk: &'w Walk<'a>,
}

impl<'de> DeserializeSeed<'de> for Key<'_, '_> {
    type Value = u16;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<u16, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_, '_> {
    type Value = u16;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, key: &str) -> Result<u16, E> {
        Ok(self.walk.matching(Some(key), None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOCS: &[&str] = &[
        r#"{"stream_id":"s","seq":7,"event_id":"s:7","ts_ms":1700000000000,"payload":{"price":1.5,"qty":2}}"#,
        r#"{"seq":"42","event_id":17,"ts_ms":1.5e3}"#,
        r#"{"a/b":1,"m~n":2,"~1":3,"":4,"arr":[10,[20,21],{"x":"y"}],"nested":{"deep":{"seq":9}}}"#,
        r#"{"seq":1,"seq":2,"event_id":{"x":1},"event_id":"last"}"#,
        r#"{"seq":{"inner":1},"seq":5}"#,
        r#"{"event_id":"x","seq":1}"#,
        r#"[1,2,{"seq":3}]"#,
        r#"{"seq":null,"event_id":"","ts_ms":"12"}"#,
        r#"{"seq":-1,"event_id":"é\"\\\u00e9","ts_ms":-5}"#,
        r#"{"k\u002fe":1,"ke\u007e":2,"arr":[]}"#,
        r#""just a string""#,
        r#"12"#,
        r#"{"seq":18446744073709551615,"big":1e300}"#,
        r#"{"error":"no","code":"retention_exceeded","earliest_seq":5}"#,
        r#"{"payload":{"seq":1,"list":[{"id":"a"},{"id":"b"}]},"seq":3}"#,
    ];

    const POINTERS: &[&str] = &[
        "",
        "/",
        "/seq",
        "/event_id",
        "/ts_ms",
        "/a~1b",
        "/m~0n",
        "/~01",
        "/",
        "/arr/0",
        "/arr/1/1",
        "/arr/2/x",
        "/arr/01",
        "/arr/-",
        "/arr/+1",
        "/arr/3",
        "/nested/deep/seq",
        "/nested",
        "/seq/inner",
        "seq",
        "/k~1e",
        "/ke~0",
        "/payload/list/1/id",
        "/payload",
        "/0",
        "/2/seq",
        "/big",
        "/code",
    ];

    /// Every pointer agrees with `Value::pointer` on every document, alone and
    /// in groups (pointers that share prefixes, end inside each other, repeat).
    #[test]
    fn agrees_with_serde_json_pointer() {
        for doc in DOCS {
            let value = serde_json::from_str::<Value>(doc).expect("valid JSON");
            for group in POINTERS.chunks(MAX_POINTERS).chain(
                POINTERS
                    .windows(3)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .map(|w| w as &[&str]),
            ) {
                let got = Extractor::new(group).extract(doc).expect("valid JSON");
                for (pointer, got) in group.iter().zip(got) {
                    assert_eq!(
                        got.as_ref(),
                        value.pointer(pointer),
                        "pointer {pointer:?} in {doc}"
                    );
                }
            }
        }
    }

    #[test]
    fn invalid_json_fails_like_from_str() {
        for text in [
            "",
            "{",
            r#"{"seq":1}x"#,
            r#"{"seq":1,}"#,
            r#"{"a":[1,}"#,
            "not json",
            r#"{"seq":1} {"seq":2}"#,
        ] {
            assert!(serde_json::from_str::<Value>(text).is_err());
            assert!(
                Extractor::new(&["/seq", "/event_id"])
                    .extract(text)
                    .is_err(),
                "{text:?}"
            );
        }
    }

    /// The one difference from a full parse: a number beyond f64's range is
    /// refused where a pointer reads it, and passed over (as payload text) elsewhere.
    #[test]
    fn out_of_range_numbers_fail_only_where_read() {
        let doc = r#"{"seq":1,"event_id":"a","big":1e400}"#;
        assert!(serde_json::from_str::<Value>(doc).is_err());
        let got = Extractor::new(&["/seq", "/event_id"])
            .extract(doc)
            .expect("unread");
        assert_eq!(got, vec![Some(Value::from(1)), Some(Value::from("a"))]);
        assert!(Extractor::new(&["/big"]).extract(doc).is_err());
    }

    #[test]
    fn more_pointers_than_the_mask_holds_never_resolve() {
        let pointers: Vec<String> = (0..MAX_POINTERS + 2).map(|_| "/seq".to_owned()).collect();
        let got = Extractor::new(&pointers)
            .extract(r#"{"seq":1}"#)
            .expect("valid");
        assert_eq!(got.len(), MAX_POINTERS + 2);
        assert!(
            got[..MAX_POINTERS]
                .iter()
                .all(|v| v == &Some(Value::from(1)))
        );
        assert!(got[MAX_POINTERS..].iter().all(Option::is_none));
    }
}
