//! Strings read from a request body without copying them.
//!
//! The webhook and the scheduler extender read a few fields of large JSON bodies (a pod inside an
//! AdmissionReview or ExtenderArgs). [`Name`] borrows each string from the body and copies only
//! the ones JSON escapes forced serde_json to rewrite.

use serde::de::{Deserialize, Deserializer, Error, Visitor};
use std::borrow::Cow;
use std::fmt;

/// A string from a request body: borrowed from the body unless it had escapes.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Name<'a>(pub Cow<'a, str>);

impl<'a> Name<'a> {
    /// A name borrowed from `s`.
    pub fn borrowed(s: &'a str) -> Self {
        Name(Cow::Borrowed(s))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Name<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Name<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Name(Cow::Borrowed(v)))
            }
            fn visit_str<E: Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Name(Cow::Owned(v.to_string())))
            }
            fn visit_string<E: Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Name(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn borrows_plain_strings_and_copies_escaped_ones() {
        let body = r#"["plain", "esc\u0061ped"]"#;
        let names: Vec<Name<'_>> = serde_json::from_str(body).unwrap();
        assert!(matches!(names[0].0, Cow::Borrowed("plain")));
        assert!(matches!(&names[1].0, Cow::Owned(s) if s == "escaped"));
        assert!(serde_json::from_str::<Name<'_>>("7").is_err());
        assert_eq!(Name::borrowed("x").as_str(), "x");
    }
}
