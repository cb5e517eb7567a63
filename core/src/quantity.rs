//! Exact parsing of Kubernetes quantity strings ("4096", "4Gi", "1.5k", "1e3") into integers.
//!
//! The grammar is the one of `k8s.io/apimachinery/pkg/api/resource.Quantity`:
//!
//! ```text
//! <quantity>        ::= <signedNumber><suffix>
//! <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
//! <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
//! <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
//! <decimalSI>       ::= m | "" | k | M | G | T | P | E
//! <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>
//! ```
//!
//! Every vGPU resource is a whole number (a count, MiB, or a percentage), so the value is computed
//! exactly as a rational and refused when it is not an integer: "500m" is half a GPU, which no card can
//! be split into through the resource count. Nothing is rounded.

use thiserror::Error;

/// Why a quantity string is not a non-negative integer.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum QuantityError {
    /// The string is empty.
    #[error("empty quantity")]
    Empty,
    /// The string does not follow the Kubernetes quantity grammar.
    #[error("{0:?} is not a Kubernetes quantity")]
    Syntax(String),
    /// The value has a fractional part ("500m", "1.5").
    #[error("{0:?} is not a whole number")]
    NotInteger(String),
    /// The value is below zero.
    #[error("{0:?} is negative")]
    Negative(String),
    /// The value does not fit in 64 bits.
    #[error("{0:?} is too large")]
    TooLarge(String),
}

/// Parses a quantity that must denote a non-negative whole number.
///
/// ```
/// use vgpu_core::quantity::parse_integer;
/// assert_eq!(parse_integer("4Gi"), Ok(4 << 30));
/// assert_eq!(parse_integer("1.5k"), Ok(1500));
/// assert_eq!(parse_integer("1e3"), Ok(1000));
/// assert!(parse_integer("500m").is_err());
/// ```
pub fn parse_integer(input: &str) -> Result<u64, QuantityError> {
    let Some(q) = Parts::parse(input)? else {
        return Ok(0);
    };
    q.value(input, 0, false)
}

/// Parses a non-negative quantity in units of `10^-scale`, rounded up, as `Quantity.ScaledValue`
/// rounds (`k8s.io/apimachinery/pkg/api/resource/quantity.go`): scale 3 is `MilliValue` ("500m"
/// -> 500, "0.1" -> 100, "0.0001" -> 1), scale 0 is `Value` ("1.5" -> 2). What kube-scheduler
/// counts a CPU (milli) or memory (bytes) request as.
///
/// ```
/// use vgpu_core::quantity::parse_ceil;
/// assert_eq!(parse_ceil("500m", 3), Ok(500));
/// assert_eq!(parse_ceil("2", 3), Ok(2000));
/// assert_eq!(parse_ceil("1Gi", 0), Ok(1 << 30));
/// assert_eq!(parse_ceil("0.5", 0), Ok(1));
/// ```
pub fn parse_ceil(input: &str, scale: u32) -> Result<u64, QuantityError> {
    let Some(q) = Parts::parse(input)? else {
        return Ok(0);
    };
    q.value(input, i64::from(scale), true)
}

/// A quantity as `mantissa x 10^dec_exp x 2^bin_exp`, non-zero and non-negative.
struct Parts {
    mantissa: u128,
    dec_exp: i64,
    bin_exp: u32,
}

impl Parts {
    /// `None` for zero (whatever its sign).
    fn parse(input: &str) -> Result<Option<Parts>, QuantityError> {
        if input.is_empty() {
            return Err(QuantityError::Empty);
        }
        let syntax = || QuantityError::Syntax(input.to_string());
        let too_large = || QuantityError::TooLarge(input.to_string());

        let (negative, rest) = match input.as_bytes()[0] {
            b'+' => (false, &input[1..]),
            b'-' => (true, &input[1..]),
            _ => (false, input),
        };
        // Split the number from the suffix: the number is digits with at most one dot.
        let number_len = rest
            .bytes()
            .position(|b| !(b.is_ascii_digit() || b == b'.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_len);
        let (int_part, frac_part) = match number.split_once('.') {
            Some((i, f)) => (i, f),
            None => (number, ""),
        };
        if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
            return Err(syntax());
        }

        let mut mantissa: u128 = 0;
        for b in int_part.bytes().chain(frac_part.bytes()) {
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(u128::from(b - b'0')))
                .ok_or_else(too_large)?;
        }
        let mut dec_exp: i64 = -(frac_part.len() as i64);
        let mut bin_exp: u32 = 0;
        match suffix {
            "" => {}
            "m" => dec_exp -= 3,
            "k" => dec_exp += 3,
            "M" => dec_exp += 6,
            "G" => dec_exp += 9,
            "T" => dec_exp += 12,
            "P" => dec_exp += 15,
            "E" => dec_exp += 18,
            "Ki" => bin_exp = 10,
            "Mi" => bin_exp = 20,
            "Gi" => bin_exp = 30,
            "Ti" => bin_exp = 40,
            "Pi" => bin_exp = 50,
            "Ei" => bin_exp = 60,
            s if s.starts_with(['e', 'E']) => {
                let exp = &s[1..];
                let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
                if digits.is_empty()
                    || !digits.bytes().all(|b| b.is_ascii_digit())
                    || digits.len() > 4
                {
                    return Err(syntax());
                }
                let exp: i64 = exp.parse().map_err(|_| syntax())?;
                dec_exp += exp;
            }
            _ => return Err(syntax()),
        }

        if mantissa == 0 {
            return Ok(None);
        }
        if negative {
            return Err(QuantityError::Negative(input.to_string()));
        }
        Ok(Some(Parts {
            mantissa,
            dec_exp,
            bin_exp,
        }))
    }

    /// The value in units of `10^-scale`: exact (a fraction fails) or rounded up.
    fn value(&self, input: &str, scale: i64, round_up: bool) -> Result<u64, QuantityError> {
        let syntax = || QuantityError::Syntax(input.to_string());
        let too_large = || QuantityError::TooLarge(input.to_string());
        let dec_exp = self.dec_exp + scale;
        // Binary multiple first, so "1.5Gi" (15 x 2^30 / 10) stays exact.
        let mut value = self
            .mantissa
            .checked_shl(self.bin_exp)
            .filter(|v| v >> self.bin_exp == self.mantissa)
            .ok_or_else(too_large)?;
        if dec_exp < 0 {
            let divisor = 10u128.checked_pow(u32::try_from(-dec_exp).map_err(|_| syntax())?);
            value = match divisor {
                Some(d) if value % d == 0 => value / d,
                Some(d) if round_up => value / d + 1,
                // A divisor beyond u128 means the value is far below one unit.
                None if round_up => 1,
                _ => return Err(QuantityError::NotInteger(input.to_string())),
            };
        } else if dec_exp > 0 {
            let factor = 10u128
                .checked_pow(u32::try_from(dec_exp).map_err(|_| too_large())?)
                .ok_or_else(too_large)?;
            value = value.checked_mul(factor).ok_or_else(too_large)?;
        }
        u64::try_from(value).map_err(|_| too_large())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_every_suffix_exactly() {
        let cases: &[(&str, u64)] = &[
            ("0", 0),
            ("4096", 4096),
            ("+7", 7),
            ("4k", 4000),
            ("4M", 4_000_000),
            ("2G", 2_000_000_000),
            ("1T", 1_000_000_000_000),
            ("1P", 1_000_000_000_000_000),
            ("1E", 1_000_000_000_000_000_000),
            ("4Ki", 4096),
            ("4Mi", 4 << 20),
            ("4Gi", 4 << 30),
            ("1Ti", 1 << 40),
            ("1Pi", 1 << 50),
            ("1Ei", 1 << 60),
            ("1e3", 1000),
            ("1E3", 1000),
            ("1e+3", 1000),
            ("1200e-2", 12),
            ("1.5k", 1500),
            ("1.5Gi", 3 << 29),
            ("5000m", 5),
            ("1.", 1),
            (".5k", 500),
            ("-0", 0),
        ];
        for (input, want) in cases {
            assert_eq!(parse_integer(input), Ok(*want), "{input}");
        }
    }

    #[test]
    fn rounds_up_in_the_asked_unit() {
        let cases: &[(&str, u32, u64)] = &[
            ("500m", 3, 500),
            ("0.1", 3, 100),
            ("0.0001", 3, 1),
            ("1e-9", 3, 1),
            ("1e-300", 3, 1),
            ("2", 3, 2000),
            ("1.5", 0, 2),
            ("1Gi", 0, 1 << 30),
            ("1000000", 0, 1_000_000),
            ("0", 3, 0),
            ("-0", 0, 0),
        ];
        for &(input, scale, want) in cases {
            assert_eq!(parse_ceil(input, scale), Ok(want), "{input} at 10^-{scale}");
        }
        assert!(matches!(
            parse_ceil("-1", 3),
            Err(QuantityError::Negative(_))
        ));
        assert!(matches!(
            parse_ceil("1 m", 3),
            Err(QuantityError::Syntax(_))
        ));
        assert!(matches!(
            parse_ceil("16Ei", 3),
            Err(QuantityError::TooLarge(_))
        ));
    }

    #[test]
    fn refuses_fractions_negatives_and_junk() {
        use QuantityError::*;
        assert_eq!(parse_integer(""), Err(Empty));
        assert_eq!(parse_integer("500m"), Err(NotInteger("500m".into())));
        assert_eq!(parse_integer("1.5"), Err(NotInteger("1.5".into())));
        assert_eq!(parse_integer("1e-1"), Err(NotInteger("1e-1".into())));
        assert_eq!(parse_integer("-1"), Err(Negative("-1".into())));
        for junk in [
            "abc", "4 Gi", "4gi", "4KiB", ".", "1.2.3", "e3", "1e", "1e+", "0x10", "4Gi ", "++1",
            "1e99999",
        ] {
            assert!(
                matches!(parse_integer(junk), Err(Syntax(_))),
                "{junk}: {:?}",
                parse_integer(junk)
            );
        }
        assert!(matches!(parse_integer("16Ei"), Err(TooLarge(_))));
        assert!(matches!(
            parse_integer("99999999999999999999"),
            Err(TooLarge(_))
        ));
        assert!(matches!(parse_integer("1e40"), Err(TooLarge(_))));
    }

    proptest! {
        #[test]
        fn never_panics(s in "\\PC{0,24}") {
            let _ = parse_integer(&s);
        }

        #[test]
        fn plain_integers_round_trip(n in any::<u64>()) {
            prop_assert_eq!(parse_integer(&n.to_string()), Ok(n));
        }

        #[test]
        fn binary_suffixes_multiply(n in 0u64..(1 << 20)) {
            prop_assert_eq!(parse_integer(&format!("{n}Mi")), Ok(n << 20));
            prop_assert_eq!(parse_integer(&format!("{n}k")), Ok(n * 1000));
        }
    }
}
