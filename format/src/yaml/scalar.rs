//! Scalar resolution under the YAML 1.2 core schema.

use super::ScalarValue;

/// Resolves a plain scalar under the YAML 1.2 core schema.
pub(crate) fn resolve_plain(text: &str) -> ScalarValue {
    // Most plain scalars are words: only these first characters can begin
    // a null, a boolean or a number.
    match text.as_bytes().first() {
        None | Some(b'~' | b'n' | b'N' | b't' | b'T' | b'f' | b'F' | b'.' | b'+' | b'-' | b'0'..=b'9') => {}
        Some(_) => return ScalarValue::String,
    }
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return ScalarValue::Null,
        "true" | "True" | "TRUE" => return ScalarValue::Bool(true),
        "false" | "False" | "FALSE" => return ScalarValue::Bool(false),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => return ScalarValue::Float(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => return ScalarValue::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return ScalarValue::Float(f64::NAN),
        _ => {}
    }
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    if !digits.is_empty() && digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return text.parse::<i64>().map_or_else(|_| float_or_string(text), ScalarValue::Int);
    }
    if let Some(octal) = text.strip_prefix("0o")
        && let Ok(number) = i64::from_str_radix(octal, 8)
    {
        return ScalarValue::Int(number);
    }
    if let Some(hex) = text.strip_prefix("0x")
        && let Ok(number) = i64::from_str_radix(hex, 16)
    {
        return ScalarValue::Int(number);
    }
    if looks_like_float(digits) {
        return float_or_string(text);
    }
    ScalarValue::String
}

fn float_or_string(text: &str) -> ScalarValue {
    text.parse::<f64>().map_or(ScalarValue::String, ScalarValue::Float)
}

/// `(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?`
fn looks_like_float(text: &str) -> bool {
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(index) => (&text[..index], Some(&text[index + 1..])),
        None => (text, None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some((whole, fraction)) => {
            whole.bytes().all(|byte| byte.is_ascii_digit())
                && fraction.bytes().all(|byte| byte.is_ascii_digit())
                && !(whole.is_empty() && fraction.is_empty())
        }
        None => !mantissa.is_empty() && mantissa.bytes().all(|byte| byte.is_ascii_digit()),
    };
    let exponent_ok = exponent.is_none_or(|exponent| {
        let digits = exponent.strip_prefix(['-', '+']).unwrap_or(exponent);
        !digits.is_empty() && digits.bytes().all(|byte| byte.is_ascii_digit())
    });
    mantissa_ok && exponent_ok
}

#[cfg(test)]
mod tests {
    use super::{ScalarValue, resolve_plain};

    #[test]
    fn resolves_the_core_schema() {
        let cases = [
            ("", ScalarValue::Null),
            ("~", ScalarValue::Null),
            ("Null", ScalarValue::Null),
            ("true", ScalarValue::Bool(true)),
            ("FALSE", ScalarValue::Bool(false)),
            ("42", ScalarValue::Int(42)),
            ("-7", ScalarValue::Int(-7)),
            ("+3", ScalarValue::Int(3)),
            ("0o17", ScalarValue::Int(15)),
            ("0x1f", ScalarValue::Int(31)),
            ("1.5", ScalarValue::Float(1.5)),
            (".5", ScalarValue::Float(0.5)),
            ("1e3", ScalarValue::Float(1000.0)),
            ("-.inf", ScalarValue::Float(f64::NEG_INFINITY)),
            ("step-1", ScalarValue::String),
            ("nothing", ScalarValue::String),
            ("truely", ScalarValue::String),
            ("1.2.3", ScalarValue::String),
            ("-x", ScalarValue::String),
            ("Yes", ScalarValue::String),
            ("é", ScalarValue::String),
        ];
        for (text, expected) in cases {
            assert_eq!(resolve_plain(text), expected, "{text:?}");
        }
        assert!(matches!(resolve_plain(".nan"), ScalarValue::Float(number) if number.is_nan()));
    }
}
