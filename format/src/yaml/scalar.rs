//! Scalar resolution under the YAML 1.2 core schema.

use super::ScalarValue;

/// Resolves a plain scalar under the YAML 1.2 core schema.
pub(crate) fn resolve_plain(text: &str) -> ScalarValue {
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
