//! Cron schedules. One parser (croner) both checks a schedule and computes
//! when it fires, in its time zone (jiff, with its own copy of the time zone
//! database), so that what the validator accepts is exactly what the
//! execution service fires.

use croner::{
    Cron,
    parser::{CronParser, Seconds, Year},
};
use jiff::{Timestamp, tz::TimeZone};

/// What a scheduler does with the times a schedule was due while no
/// scheduler ran (more than the latest due time passed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissedRuns {
    /// Fire none of them; wait for the next due time.
    #[default]
    Skip,
    /// Fire once for all of them, at once.
    RunOnce,
}

impl MissedRuns {
    /// The name in a process: `skip` or `run_once`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Skip => "skip",
            Self::RunOnce => "run_once",
        }
    }

    /// The policy a process names.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "skip" => Some(Self::Skip),
            "run_once" => Some(Self::RunOnce),
            _ => None,
        }
    }
}

/// A checked cron schedule in a time zone.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    time_zone: TimeZone,
}

/// An instant (milliseconds since the epoch) in RFC 3339, in UTC.
pub fn rfc3339(millis: i64) -> String {
    Timestamp::from_millisecond(millis).map_or_else(|_| millis.to_string(), |instant| instant.to_string())
}

/// The time zone an IANA name (empty or `UTC`: UTC) names; why not, when
/// it names none.
pub(crate) fn check_time_zone(name: &str) -> Result<TimeZone, String> {
    if name.is_empty() || name == "UTC" {
        return Ok(TimeZone::UTC);
    }
    TimeZone::get(name).map_err(|_| format!("unknown time zone '{name}': use an IANA name such as Europe/Paris"))
}

/// The first field of a five- or six-field expression that the parser
/// refuses on its own (every other field `*`), with its name.
fn wrong_field<'a>(parser: &CronParser, expression: &'a str) -> Option<(&'static str, &'a str)> {
    let fields: Vec<&str> = expression.split_whitespace().collect();
    let names: &[&'static str] = match fields.len() {
        5 => &["minute", "hour", "day-of-month", "month", "day-of-week"],
        6 => &["second", "minute", "hour", "day-of-month", "month", "day-of-week"],
        _ => return None,
    };
    (0..fields.len()).find_map(|wrong| {
        let alone: Vec<&str> =
            (0..fields.len()).map(|index| if index == wrong { fields[index] } else { "*" }).collect();
        parser.parse(&alone.join(" ")).is_err().then(|| (names[wrong], fields[wrong]))
    })
}

impl Schedule {
    /// Parses `expression` — five fields (minute hour day-of-month month
    /// day-of-week), six with seconds first, or a macro such as `@daily` —
    /// in the IANA time zone `time_zone` (empty: UTC). A schedule that
    /// never fires (`0 0 30 2 *`) is refused.
    pub fn parse(expression: &str, time_zone: &str) -> Result<Self, String> {
        let time_zone = check_time_zone(time_zone)?;
        let expression = expression.trim();
        if expression.eq_ignore_ascii_case("@reboot") {
            return Err("@reboot is not supported: schedules fire by the clock".to_owned());
        }
        let parser = CronParser::builder().seconds(Seconds::Optional).year(Year::Disallowed).build();
        let cron = parser.parse(expression).map_err(|error| {
            let reason = error.to_string();
            let reason = reason.trim_start_matches("Component error: ").trim_end_matches('.').to_lowercase();
            match wrong_field(&parser, expression) {
                Some((name, field)) => format!("cron field {name} '{field}' of '{expression}': {reason}"),
                None => format!("'{expression}' is not a cron expression: {reason}"),
            }
        })?;
        let schedule = Self { cron, time_zone };
        if schedule.next_after(Timestamp::now().as_millisecond()).is_none() {
            return Err(format!("'{expression}' never fires"));
        }
        Ok(schedule)
    }

    /// When it fires first strictly after `after` (milliseconds since the
    /// epoch), on a whole second; `None` when it never does.
    pub fn next_after(&self, after: i64) -> Option<i64> {
        let zoned = Timestamp::from_millisecond(after).ok()?.to_zoned(self.time_zone.clone());
        let next = self.cron.find_next_occurrence(&zoned, false).ok()?;
        Some(next.timestamp().as_millisecond())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-03-28T12:00:00Z, a Saturday, the day before Europe's clocks go forward.
    const SATURDAY_NOON: i64 = 1_774_699_200_000;
    const HOUR: i64 = 3_600_000;

    #[test]
    fn schedules_fire_in_their_time_zone() {
        let utc = Schedule::parse("0 9 * * 1-5", "").unwrap();
        // Monday 09:00 UTC.
        assert_eq!(utc.next_after(SATURDAY_NOON), Some(SATURDAY_NOON + 45 * HOUR));
        // Europe/Paris moves to summer time on Sunday: Monday 09:00 there is 07:00 UTC.
        let paris = Schedule::parse("0 9 * * 1-5", "Europe/Paris").unwrap();
        assert_eq!(paris.next_after(SATURDAY_NOON), Some(SATURDAY_NOON + 43 * HOUR));
        // Seconds first, and macros.
        assert_eq!(Schedule::parse("*/2 * * * * *", "").unwrap().next_after(SATURDAY_NOON), Some(SATURDAY_NOON + 2000));
        assert_eq!(Schedule::parse("@daily", "").unwrap().next_after(SATURDAY_NOON), Some(SATURDAY_NOON + 12 * HOUR));
        // Strictly after.
        assert_eq!(
            Schedule::parse("0 12 * * *", "").unwrap().next_after(SATURDAY_NOON),
            Some(SATURDAY_NOON + 24 * HOUR)
        );
        assert_eq!(rfc3339(SATURDAY_NOON + 500), "2026-03-28T12:00:00.5Z");
    }

    #[test]
    fn bad_schedules_say_why() {
        assert_eq!(
            Schedule::parse("0 24 * * *", "").unwrap_err(),
            "cron field hour '24' of '0 24 * * *': number out of bounds"
        );
        assert!(Schedule::parse("0 9 * * 1-9", "").unwrap_err().starts_with("cron field day-of-week '1-9'"));
        assert!(Schedule::parse("0 9 * *", "").is_err());
        assert!(Schedule::parse("0 0 1 1 * 2030", "").is_err(), "no year field");
        assert_eq!(Schedule::parse("0 0 30 2 *", "").unwrap_err(), "'0 0 30 2 *' never fires");
        assert!(Schedule::parse("@reboot", "").unwrap_err().contains("not supported"));
        assert_eq!(
            Schedule::parse("@daily", "Mars/Olympus").unwrap_err(),
            "unknown time zone 'Mars/Olympus': use an IANA name such as Europe/Paris"
        );
    }
}
