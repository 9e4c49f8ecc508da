//! Where a tree path (`descriptors[1].rate_limit.unit_multiplier`) is in a file's text, so that
//! an error found after parsing is shown at the line of the field that is wrong.
//!
//! serde_yaml keeps no positions in the values it builds, but its errors carry the position of
//! the node being read when they are raised. So the text is read again along the path only, and
//! an error is raised on reaching the field's key (or list item): its position is the field's.
//! A field that is not there is located at the deepest part of its path that is.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// The 1-based line and column of `path` in the `document`-th YAML document of `text` (0 for
/// the first): of its last key or list item; for a path not all in the text (a missing
/// field), of the deepest part that is; `None` for an empty path, or one that meets a node of
/// another kind (a scalar where the path goes on).
pub(super) fn locate(text: &str, document: usize, path: &str) -> Option<(usize, usize)> {
    let steps = steps(path)?;
    match walk(text, document, &steps)? {
        Reached::All(at) => Some(at),
        // Read again to the part that is there: its key is consumed by the time the next
        // part turns out to be missing.
        Reached::Part(0) => None,
        Reached::Part(n) => match walk(text, document, &steps[..n])? {
            Reached::All(at) => Some(at),
            Reached::Part(_) => None,
        },
    }
}

/// How far a walk along a path got.
enum Reached {
    /// To its end, at this line and column.
    All((usize, usize)),
    /// To this many steps: the next one is not in the text.
    Part(usize),
}

fn walk(text: &str, document: usize, steps: &[Step<'_>]) -> Option<Reached> {
    let deserializer = serde_yaml::Deserializer::from_str(text).nth(document)?;
    let error = Walk { steps, depth: 0 }.deserialize(deserializer).err()?;
    // The message is prefixed with the path where it was raised.
    let message = error.to_string();
    if message.contains(FOUND) {
        let at = error.location()?;
        return Some(Reached::All((at.line(), at.column())));
    }
    let (_, depth) = message.split_once(MISSING)?;
    Some(Reached::Part(
        depth.split_whitespace().next()?.parse().ok()?,
    ))
}

/// The most errors of one load located: each is one more read of its file, so a file with
/// many thousands of errors shows only the first ones at their lines.
pub(super) const MAX_LOCATED: usize = 256;

/// [`locate`] while `budget` lasts (each call spends one).
pub(super) fn within(
    budget: &mut usize,
    text: &str,
    document: usize,
    path: &str,
) -> Option<(usize, usize)> {
    if path.is_empty() {
        return None;
    }
    *budget = budget.checked_sub(1)?;
    locate(text, document, path)
}

/// One step of a path: a mapping's key, or a list's item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step<'p> {
    Key(&'p str),
    Item(usize),
}

/// `a.b[2][0].c` → `a`, `b`, `[2]`, `[0]`, `c`; `None` for an empty or malformed path.
fn steps(path: &str) -> Option<Vec<Step<'_>>> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (key, mut items) = part
            .split_once('[')
            .map_or((part, ""), |(k, rest)| (k, rest));
        if key.is_empty() {
            return None;
        }
        out.push(Step::Key(key));
        while !items.is_empty() {
            let (index, rest) = items.split_once(']')?;
            out.push(Step::Item(index.parse().ok()?));
            items = rest.strip_prefix('[').unwrap_or(rest);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The error raised on reaching the path's end, recognized by its text.
const FOUND: &str = "sluice-locate: found";

/// The error raised where the path's next step is missing, followed by the steps reached.
const MISSING: &str = "sluice-locate: missing after ";

/// Reads a node along `steps` (`depth` of the path's steps already taken): the error
/// [`FOUND`] when the last step is reached, [`MISSING`] when the next one is not there.
struct Walk<'s, 'p> {
    steps: &'s [Step<'p>],
    depth: usize,
}

impl Walk<'_, '_> {
    fn missing<E: de::Error>(&self) -> E {
        E::custom(format!("{MISSING}{}", self.depth))
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        match self.steps.first() {
            Some(Step::Key(_)) => deserializer.deserialize_map(self),
            Some(Step::Item(_)) => deserializer.deserialize_seq(self),
            // A list item ends the path: raised while the item is read, so that the error
            // carries the item's position, not its list's.
            None => deserializer.deserialize_any(Found),
        }
    }
}

impl<'de> Visitor<'de> for Walk<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping or a list")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some((&Step::Key(wanted), rest)) = self.steps.split_first() else {
            return Ok(());
        };
        let key = Key {
            wanted,
            last: rest.is_empty(),
        };
        while let Some(found) = map.next_key_seed(key)? {
            if found {
                return map.next_value_seed(Walk {
                    steps: rest,
                    depth: self.depth + 1,
                });
            }
            map.next_value::<IgnoredAny>()?;
        }
        Err(self.missing())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Some((&Step::Item(wanted), rest)) = self.steps.split_first() else {
            return Ok(());
        };
        for _ in 0..wanted {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Err(self.missing());
            }
        }
        let next = Walk {
            steps: rest,
            depth: self.depth + 1,
        };
        match seq.next_element_seed(next)? {
            Some(()) => Ok(()),
            None => Err(self.missing()),
        }
    }
}

/// A mapping's key: whether it is the wanted one, or [`FOUND`], raised while the key is read
/// (so that the error carries the key's position), when it is and it ends the path.
#[derive(Clone, Copy)]
struct Key<'p> {
    wanted: &'p str,
    last: bool,
}

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
        match key == self.wanted {
            true if self.last => Err(E::custom(FOUND)),
            found => Ok(found),
        }
    }

    // Keys of other types are never wanted.
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(false)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(false)
    }
}

/// Raises [`FOUND`] on whatever node it reads.
struct Found;

impl<'de> Visitor<'de> for Found {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("anything")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(FOUND))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(FOUND))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
domain: d
descriptors:
  - key: ok
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: k
    rate_limit: {unit: second, unit_multiplier: 0, requests_per_unit: 5}
    descriptors:
      - key: inner
        rate_limit:
          unit: foo
";

    #[test]
    fn a_path_is_found_at_its_key_and_a_missing_field_at_its_parent() {
        assert_eq!(locate(TEXT, 0, "domain"), Some((1, 1)));
        assert_eq!(
            locate(TEXT, 0, "descriptors[1].rate_limit.unit_multiplier"),
            Some((6, 32))
        );
        assert_eq!(
            locate(TEXT, 0, "descriptors[1].descriptors[0].rate_limit.unit"),
            Some((10, 11))
        );
        assert_eq!(locate(TEXT, 0, "descriptors[1]"), Some((5, 5)));
        // Not in the text: the deepest part that is.
        assert_eq!(
            locate(TEXT, 0, "descriptors[0].rate_limit.burst"),
            Some((4, 5))
        );
        assert_eq!(
            locate(TEXT, 0, "descriptors[1].descriptors[0].rate_limit.burst"),
            Some((9, 9))
        );
        assert_eq!(locate(TEXT, 0, "descriptors[7].key"), Some((2, 1)));
        assert_eq!(locate(TEXT, 0, "nothing"), None);
        // A scalar where the path goes on, and no path at all.
        assert_eq!(locate(TEXT, 0, "domain.x"), None);
        assert_eq!(locate(TEXT, 0, ""), None);
        assert_eq!(locate(TEXT, 1, "domain"), None);
    }

    #[test]
    fn a_later_document_is_located_in_the_whole_text() {
        let text = "domain: a\n---\ndomain: b\ndescriptors:\n  - key: k\n";
        assert_eq!(locate(text, 1, "descriptors[0].key"), Some((5, 5)));
    }
}
