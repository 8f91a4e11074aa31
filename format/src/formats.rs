//! Small well-formedness checks shared by the rules: identifiers, RFC 3339
//! times and "did you mean" suggestions.

/// Longest identifier (process name, step id, inbox name).
pub(crate) const MAX_IDENTIFIER_LENGTH: usize = 64;

/// `[a-z0-9][a-z0-9_-]*`, up to 64 characters.
pub fn is_identifier(text: &str) -> bool {
    let mut bytes = text.bytes();
    text.len() <= MAX_IDENTIFIER_LENGTH
        && bytes.next().is_some_and(|first| first.is_ascii_lowercase() || first.is_ascii_digit())
        && bytes.all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_' || byte == b'-')
}

/// The closest candidate to `word`, when it is close enough to be a typo.
pub(crate) fn did_you_mean<'c>(word: &str, candidates: &[&'c str]) -> Option<&'c str> {
    let length = word.chars().count();
    if length > MAX_IDENTIFIER_LENGTH {
        return None;
    }
    let threshold = (length / 3).max(1);
    candidates
        .iter()
        .filter(|candidate| candidate.len().abs_diff(word.len()) <= threshold * 4)
        .map(|candidate| (edit_distance(word, candidate), *candidate))
        .filter(|(distance, _)| *distance <= threshold)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// ` (did you mean 'x'?)` or nothing.
pub(crate) fn suggestion(word: &str, candidates: &[&str]) -> String {
    did_you_mean(word, candidates).map(|close| format!(" (did you mean '{close}'?)")).unwrap_or_default()
}

/// Suggestions against long, document-sized candidate lists (step ids,
/// agents), with a budget of comparisons per document so that many unknown
/// references cannot make validation quadratic.
pub(crate) struct Suggester {
    comparisons_left: usize,
}

impl Suggester {
    pub(crate) fn new() -> Self {
        Self { comparisons_left: 200_000 }
    }

    pub(crate) fn suggest(&mut self, word: &str, candidates: &[&str]) -> String {
        if candidates.len() > self.comparisons_left {
            self.comparisons_left = 0;
            return String::new();
        }
        self.comparisons_left -= candidates.len();
        suggestion(word, candidates)
    }
}

/// Optimal string alignment distance: edits plus adjacent transpositions.
fn edit_distance(left: &str, right: &str) -> usize {
    let left: Vec<char> = left.chars().collect();
    let right: Vec<char> = right.chars().collect();
    let width = right.len() + 1;
    let mut table = vec![0usize; (left.len() + 1) * width];
    for (row, cell) in table.iter_mut().step_by(width).enumerate() {
        *cell = row;
    }
    for (column, cell) in table.iter_mut().take(width).enumerate() {
        *cell = column;
    }
    for row in 1..=left.len() {
        for column in 1..=right.len() {
            let cost = usize::from(left[row - 1] != right[column - 1]);
            let mut best = (table[(row - 1) * width + column] + 1)
                .min(table[row * width + column - 1] + 1)
                .min(table[(row - 1) * width + column - 1] + cost);
            if row > 1 && column > 1 && left[row - 1] == right[column - 2] && left[row - 2] == right[column - 1] {
                best = best.min(table[(row - 2) * width + column - 2] + 1);
            }
            table[row * width + column] = best;
        }
    }
    table[left.len() * width + right.len()]
}

/// Checks an RFC 3339 date-time such as `2026-12-01T09:00:00Z`.
pub(crate) fn check_rfc3339(text: &str) -> Result<(), String> {
    rfc3339_millis(text).map(drop)
}

/// Days from 1970-01-01 to the given proleptic Gregorian date.
fn days_from_epoch(year: i64, month: i64, day: i64) -> i64 {
    // Howard Hinnant's days_from_civil.
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// An RFC 3339 date-time as milliseconds since the Unix epoch, or why it is not one.
pub fn rfc3339_millis(text: &str) -> Result<i64, String> {
    let bytes = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Option<u32> {
        let slice = bytes.get(range)?;
        slice
            .iter()
            .all(u8::is_ascii_digit)
            .then(|| slice.iter().fold(0, |sum, digit| sum * 10 + u32::from(digit - b'0')))
    };
    let shape = "expected an RFC 3339 time such as 2026-12-01T09:00:00Z";
    let (Some(year), Some(month), Some(day), Some(hour), Some(minute), Some(second)) =
        (digits(0..4), digits(5..7), digits(8..10), digits(11..13), digits(14..16), digits(17..19))
    else {
        return Err(shape.to_owned());
    };
    if bytes.get(4) != Some(&b'-')
        || bytes.get(7) != Some(&b'-')
        || !matches!(bytes.get(10), Some(b'T' | b't' | b' '))
        || bytes.get(13) != Some(&b':')
        || bytes.get(16) != Some(&b':')
    {
        return Err(shape.to_owned());
    }
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return Err(format!("month {month} does not exist")),
    };
    if day == 0 || day > days_in_month {
        return Err(format!("day {day} does not exist in month {month} of {year}"));
    }
    if hour > 23 || minute > 59 || second > 60 {
        return Err(format!("time {hour:02}:{minute:02}:{second:02} does not exist"));
    }
    let mut rest = &text[19..];
    let mut millis = 0_i64;
    if let Some(fraction) = rest.strip_prefix('.') {
        let length = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if length == 0 {
            return Err(shape.to_owned());
        }
        millis = fraction[..length]
            .bytes()
            .chain(std::iter::repeat(b'0'))
            .take(3)
            .fold(0, |sum, digit| sum * 10 + i64::from(digit - b'0'));
        rest = &fraction[length..];
    }
    let offset_minutes = match rest {
        "Z" | "z" => Some(0),
        offset if offset.len() == 6 && (offset.starts_with('+') || offset.starts_with('-')) => {
            let sign = if offset.starts_with('-') { -1 } else { 1 };
            let offset = offset.as_bytes();
            let well_formed = offset[3] == b':'
                && offset[1..3].iter().chain(&offset[4..6]).all(u8::is_ascii_digit)
                && (offset[1] - b'0') * 10 + (offset[2] - b'0') < 24
                && (offset[4] - b'0') * 10 + (offset[5] - b'0') < 60;
            well_formed.then(|| {
                sign * (i64::from((offset[1] - b'0') * 10 + (offset[2] - b'0')) * 60
                    + i64::from((offset[4] - b'0') * 10 + (offset[5] - b'0')))
            })
        }
        _ => None,
    };
    let Some(offset_minutes) = offset_minutes else {
        return Err(format!("{shape} (with a time zone: Z or +HH:MM)"));
    };
    let seconds = days_from_epoch(i64::from(year), i64::from(month), i64::from(day)) * 86_400
        + i64::from(hour) * 3600
        + i64::from(minute) * 60
        + i64::from(second.min(59))
        - offset_minutes * 60;
    Ok(seconds * 1000 + millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        assert!(is_identifier("research-2_a"));
        assert!(!is_identifier("Research"));
        assert!(!is_identifier("-x"));
        assert!(!is_identifier(""));
        assert!(!is_identifier(&"a".repeat(65)));
    }

    #[test]
    fn rfc3339_instants() {
        assert_eq!(rfc3339_millis("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(rfc3339_millis("2026-12-01T09:00:00.5Z"), Ok(1_796_115_600_500));
        assert_eq!(rfc3339_millis("2026-12-01T11:00:00+02:00"), rfc3339_millis("2026-12-01T09:00:00Z"));
        assert_eq!(rfc3339_millis("2000-03-01T00:00:00Z"), Ok(951_868_800_000));
    }

    #[test]
    fn rfc3339_times() {
        assert_eq!(check_rfc3339("2026-12-01T00:00:00Z"), Ok(()));
        assert_eq!(check_rfc3339("2024-02-29T23:59:59.123+02:00"), Ok(()));
        assert!(check_rfc3339("2026-02-29T00:00:00Z").is_err());
        assert!(check_rfc3339("2026-12-01").is_err());
        assert!(check_rfc3339("2026-12-01T00:00:00").is_err());
        assert!(check_rfc3339("2026-13-01T00:00:00Z").is_err());
        assert!(check_rfc3339("2026-12-01T00:00:00+2:00").is_err());
    }

    #[test]
    fn suggestions() {
        assert_eq!(did_you_mean("depend_on", &["depends_on", "description"]), Some("depends_on"));
        assert_eq!(did_you_mean("zzzzzz", &["depends_on"]), None);
    }
}
