//! Schedules as people write them: a role's `## Schedule` in plain English
//! ("9am and 5pm, weekdays", "every 30 minutes") read into a five-field cron
//! expression, and the time zone a line `time_zone: Europe/Paris` names.
//!
//! The reader is strict on purpose: every word must be understood, or the
//! schedule is refused naming the phrase, where it is, and why. (General
//! English-to-cron crates pick the words they know out of the text and drop
//! the rest, so "weekdays" reads as "days" and "twice a day" as midnight:
//! a schedule that fires at the wrong times without a word.) What it reads:
//!
//! - times: `9am`, `9:30 pm`, `17:00`, `noon`, `midnight`, lists of them
//!   (`9am, 1pm and 5pm`), all at the same minute of the hour;
//! - intervals: `every 30 minutes`, `every minute`, `every 2 hours`,
//!   `hourly`, optionally within hours (`from 9am to 5pm`, `between 9am
//!   and 5pm`), the interval dividing the hour (or the day) evenly;
//! - days: `weekdays`, `weekends`, `daily`, `every day`, day names and
//!   their plurals (`mondays`), lists and ranges (`monday to friday`,
//!   `mon-fri`), and days of the month (`on the 1st and 15th`, `monthly`).
//!
//! Filler words (`at`, `on`, `and`, `every`, `each`, `the`, `of`, `run`)
//! are skipped where they are filler.

use std::collections::BTreeSet;

/// A role's schedule as muster fires it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleSchedule {
    /// A cron expression: the one written, or the one the English reads as.
    pub cron: String,
    /// The IANA time zone a `time_zone:` line names; empty for UTC.
    pub time_zone: String,
}

/// Why a schedule cannot be read: the phrase, where it starts in the text
/// (line and column, both from 0, in characters), and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// The words that cannot be read, as written (lowercased).
    pub phrase: String,
    /// The line of the text the phrase is on.
    pub line: usize,
    /// The column (in characters) of the line where the phrase starts.
    pub column: usize,
    /// Why it cannot be read.
    pub reason: String,
}

/// A word of the schedule, lowercased, with where it starts.
#[derive(Debug, Clone)]
struct Word {
    text: String,
    line: usize,
    column: usize,
}

/// The schedule a role's text holds: `None` when it holds none (empty).
/// A cron expression (the whole text, or a span in backticks) is taken as
/// written; anything else is read as English. A line `time_zone: NAME`
/// (or `timezone:`, `time zone:`) names the time zone, whichever form the
/// schedule has; the zone's name is checked by the cron parser's caller.
pub fn role_schedule(text: &str) -> Result<Option<RoleSchedule>, Unreadable> {
    let mut time_zone = String::new();
    let mut lines: Vec<(usize, usize, &str)> = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            continue;
        }
        let indent = line[..line.len() - line.trim_start().len()].chars().count();
        if let Some(zone) = time_zone_line(trimmed) {
            time_zone = zone.to_owned();
            continue;
        }
        lines.push((number, indent, trimmed));
    }
    let Some(&(first_line, first_indent, first_text)) = lines.first() else { return Ok(None) };
    let joined = lines.iter().map(|(_, _, text)| *text).collect::<Vec<_>>().join(" ");
    if let Some(cron) = cron_as_written(&joined) {
        return Ok(Some(RoleSchedule { cron: cron.to_owned(), time_zone }));
    }
    let mut words = Vec::new();
    for (number, indent, line) in &lines {
        words.extend(split_words(line, *number, *indent));
    }
    let cron = Reader::new(words).read().map_err(|mut unreadable| {
        if unreadable.phrase.is_empty() {
            (unreadable.phrase, unreadable.line, unreadable.column) = (first_text.to_owned(), first_line, first_indent);
        }
        unreadable
    })?;
    Ok(Some(RoleSchedule { cron, time_zone }))
}

/// The zone a line `time_zone: NAME` names.
fn time_zone_line(line: &str) -> Option<&str> {
    let (key, value) = line.split_once(':')?;
    let key = key.trim().to_ascii_lowercase();
    ["time_zone", "timezone", "time zone", "time-zone"].contains(&key.as_str()).then(|| value.trim())
}

/// The cron expression of a text that is one (or holds one in backticks).
fn cron_as_written(text: &str) -> Option<&str> {
    let trimmed = text.trim();
    let code_span = trimmed.split('`').nth(1).filter(|_| trimmed.matches('`').count() >= 2);
    let looks_like_cron = trimmed.starts_with('@')
        || (!trimmed.is_empty()
            && trimmed.chars().all(|character| character.is_ascii_digit() || " */,-?".contains(character)));
    code_span.or(looks_like_cron.then_some(trimmed)).map(str::trim)
}

/// The words of a line: split at spaces and commas, a final period dropped,
/// `x-y` and `x–y` as `x to y`.
fn split_words(line: &str, number: usize, indent: usize) -> Vec<Word> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut start = 0;
    let chars: Vec<char> = line.chars().collect();
    let flush = |current: &mut String, start: usize, words: &mut Vec<Word>| {
        let text = current.trim_end_matches('.').to_lowercase();
        if !text.is_empty() {
            words.push(Word { text, line: number, column: indent + start });
        }
        current.clear();
    };
    for (index, character) in chars.iter().enumerate() {
        match character {
            ' ' | '\t' | ',' | ';' => flush(&mut current, start, &mut words),
            '-' | '–' if !current.is_empty() => {
                flush(&mut current, start, &mut words);
                words.push(Word { text: "to".to_owned(), line: number, column: indent + index });
            }
            _ => {
                if current.is_empty() {
                    start = index;
                }
                current.push(*character);
            }
        }
    }
    flush(&mut current, start, &mut words);
    words
}

/// An interval's unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Minute,
    Hour,
}

/// What the words said so far.
#[derive(Default)]
struct Reader {
    words: Vec<Word>,
    next: usize,
    /// (hour, minute) times of the day, with the word that said each.
    times: Vec<(u32, u32, usize)>,
    interval: Option<(u32, Unit, usize)>,
    /// From (inclusive) and to (exclusive) hours of an interval.
    window: Option<(u32, u32, usize)>,
    days_of_week: BTreeSet<u32>,
    days_of_month: BTreeSet<u32>,
    monthly: bool,
}

const DAY_NAMES: [[&str; 2]; 7] = [
    ["sunday", "sun"],
    ["monday", "mon"],
    ["tuesday", "tue"],
    ["wednesday", "wed"],
    ["thursday", "thu"],
    ["friday", "fri"],
    ["saturday", "sat"],
];

/// The day of the week (0 Sunday) a word names: `monday`, `mondays`, `mon`,
/// `tues`, `thurs`.
fn day_of_week(word: &str) -> Option<u32> {
    let word = word.strip_suffix('s').filter(|stem| stem.ends_with("day")).unwrap_or(word);
    let word = match word {
        "tues" => "tue",
        "thur" | "thurs" => "thu",
        other => other,
    };
    DAY_NAMES.iter().position(|names| names.contains(&word)).map(|day| day as u32)
}

/// A time of day as (hour, minute), or why the words are not one.
type TimeRead = Result<(u32, u32), String>;

/// A time of day a word names (`9am`, `9:30pm`, `17:00`, `noon`,
/// `midnight`), or the word and the next (`9 am`, `9:30 pm`): the time
/// (`Err` when out of range) and how many words it took.
fn time_of_day(word: &str, next: Option<&str>) -> Option<(TimeRead, usize)> {
    match word {
        "noon" | "midday" => return Some((Ok((12, 0)), 1)),
        "midnight" => return Some((Ok((0, 0)), 1)),
        _ => {}
    }
    let meridiem = |text: &str| -> Option<bool> {
        match text {
            "am" | "a.m" => Some(false),
            "pm" | "p.m" => Some(true),
            _ => None,
        }
    };
    let split = ["am", "a.m", "pm", "p.m"].iter().find_map(|suffix| {
        let clock = word.strip_suffix(suffix)?;
        Some((clock, meridiem(suffix)))
    });
    let (clock, afternoon, taken) = match split {
        Some((clock, afternoon)) => (clock, afternoon, 1),
        None => match next.and_then(meridiem) {
            Some(afternoon) => (word, Some(afternoon), 2),
            None => (word, None, 1),
        },
    };
    let (hour_text, minute_text) = match clock.split_once([':', '.']) {
        Some((hour, minute)) if minute.len() == 2 => (hour, minute),
        None if afternoon.is_some() => (clock, "00"),
        _ => return None,
    };
    let digits = |text: &str, most: usize| {
        (!text.is_empty() && text.len() <= most && text.chars().all(|character| character.is_ascii_digit()))
            .then(|| text.parse::<u32>().ok())
            .flatten()
    };
    let (written_hour, minute) = (digits(hour_text, 2)?, digits(minute_text, 2)?);
    let hour = match afternoon {
        Some(_) if !(1..=12).contains(&written_hour) => {
            return Some((Err(format!("{written_hour} is not an hour of a 12-hour clock")), taken));
        }
        Some(false) => written_hour % 12,
        Some(true) => written_hour % 12 + 12,
        None => written_hour,
    };
    if hour > 23 || minute > 59 {
        return Some((Err("it is not a time of day".to_owned()), taken));
    }
    Some((Ok((hour, minute)), taken))
}

/// A day of the month a word names: `1st`, `15th`, `22nd`, `3rd`.
fn day_of_month(word: &str) -> Option<u32> {
    let number = ["st", "nd", "rd", "th"].iter().find_map(|suffix| word.strip_suffix(suffix))?;
    number.parse().ok().filter(|day| (1..=31).contains(day))
}

impl Reader {
    fn new(words: Vec<Word>) -> Self {
        Self { words, ..Self::default() }
    }

    fn peek(&self, ahead: usize) -> Option<&str> {
        self.words.get(self.next + ahead).map(|word| word.text.as_str())
    }

    /// A refusal naming the words `from..to` (word indexes).
    fn refuse(&self, from: usize, to: usize, reason: impl Into<String>) -> Unreadable {
        let first = from.min(self.words.len().saturating_sub(1));
        let Some(word) = self.words.get(first) else {
            return Unreadable { phrase: String::new(), line: 0, column: 0, reason: reason.into() };
        };
        let phrase = self.words[first..to.min(self.words.len()).max(first + 1)]
            .iter()
            .map(|word| word.text.as_str())
            .collect::<Vec<_>>()
            .join(" ");
        Unreadable { phrase, line: word.line, column: word.column, reason: reason.into() }
    }

    /// The time the next words say, taking them; `None` (taking nothing)
    /// when they say none.
    fn take_time(&mut self) -> Result<Option<(u32, u32)>, Unreadable> {
        let Some(word) = self.peek(0) else { return Ok(None) };
        let Some((read, taken)) = time_of_day(word, self.peek(1)) else { return Ok(None) };
        let start = self.next;
        self.next += taken;
        read.map(Some).map_err(|reason| self.refuse(start, self.next, reason))
    }

    /// Reads every word; the cron expression they say.
    fn read(mut self) -> Result<String, Unreadable> {
        while let Some(word) = self.peek(0).map(str::to_owned) {
            let start = self.next;
            if ["at", "on", "and", "the", "of", "run", "runs", "in", "only", "also", "month"].contains(&word.as_str()) {
                self.next += 1;
                continue;
            }
            if let Some(time) = self.take_time()? {
                self.times.push((time.0, time.1, start));
                continue;
            }
            if word == "every" || word == "each" {
                self.next += 1;
                self.read_every(start)?;
                continue;
            }
            if word == "from" || word == "between" {
                self.next += 1;
                self.read_window(start)?;
                continue;
            }
            if let Some(day) = day_of_week(&word) {
                self.next += 1;
                self.read_days(day, start)?;
                continue;
            }
            if let Some(day) = day_of_month(&word) {
                self.next += 1;
                self.days_of_month.insert(day);
                continue;
            }
            self.next += 1;
            match word.as_str() {
                "weekdays" | "weekday" => self.days_of_week.extend(1..=5),
                "weekends" | "weekend" => self.days_of_week.extend([0, 6]),
                // Every day is what a schedule without days does.
                "daily" => {}
                "hourly" => self.set_interval(1, Unit::Hour, start)?,
                "monthly" => self.monthly = true,
                _ => {
                    return Err(self.refuse(
                        start,
                        start + 1,
                        "it is not a time (9am, 17:30), a day (weekdays, monday to friday) or an interval \
                         (every 30 minutes)",
                    ));
                }
            }
        }
        self.cron()
    }

    /// After `every`/`each`: `30 minutes`, `minute`, `2 hours`, `day`,
    /// `weekday`, `monday`, `month`.
    fn read_every(&mut self, start: usize) -> Result<(), Unreadable> {
        let (count, unit_at) = match self.peek(0).map(str::parse::<u32>) {
            Some(Ok(count)) => (Some(count), 1),
            _ => match self.peek(0) {
                Some("other") => return Err(self.refuse(start, self.next + 2, "cron cannot say every other day")),
                _ => (None, 0),
            },
        };
        let Some(unit) = self.peek(unit_at).map(str::to_owned) else {
            return Err(self.refuse(start, self.next + unit_at, "every what? (every 30 minutes, every day)"));
        };
        self.next += unit_at + 1;
        let count_or_one = count.unwrap_or(1);
        match unit.as_str() {
            "minute" | "minutes" | "min" | "mins" => self.set_interval(count_or_one, Unit::Minute, start),
            "hour" | "hours" | "hr" | "hrs" => self.set_interval(count_or_one, Unit::Hour, start),
            "day" | "days" if count_or_one == 1 => Ok(()),
            "month" if count.is_none() => {
                self.monthly = true;
                Ok(())
            }
            "weekday" | "weekdays" if count.is_none() => {
                self.days_of_week.extend(1..=5);
                Ok(())
            }
            other if count.is_none() && day_of_week(other).is_some() => {
                self.read_days(day_of_week(other).unwrap_or_default(), start)
            }
            _ => Err(self.refuse(
                start,
                self.next,
                "cron repeats by minutes or hours that divide the hour or the day, or daily on given days",
            )),
        }
    }

    fn set_interval(&mut self, count: u32, unit: Unit, start: usize) -> Result<(), Unreadable> {
        if self.interval.is_some() {
            return Err(self.refuse(start, self.next, "a schedule has one interval"));
        }
        let (whole, name) = match unit {
            Unit::Minute => (60, "hour"),
            Unit::Hour => (24, "day"),
        };
        if count == 0 || whole % count != 0 {
            return Err(self.refuse(
                start,
                self.next,
                format!("cron can only repeat at intervals that divide the {name} evenly ({count} does not)"),
            ));
        }
        self.interval = Some((count, unit, start));
        Ok(())
    }

    /// After `from`/`between`: a time, `to`/`and`/`until`, a time: the
    /// hours an interval runs in.
    fn read_window(&mut self, start: usize) -> Result<(), Unreadable> {
        let from = self.take_time()?;
        if from.is_some() && matches!(self.peek(0), Some("to" | "and" | "until" | "till")) {
            self.next += 1;
        }
        let to = self.take_time()?;
        let (Some(from), Some(to)) = (from, to) else {
            return Err(self.refuse(start, self.next + 1, "from when to when? (from 9am to 5pm)"));
        };
        if from.1 != 0 || to.1 != 0 || to.0 <= from.0 {
            return Err(self.refuse(
                start,
                self.next,
                "hours for an interval go from one whole hour to a later one (from 9am to 5pm)",
            ));
        }
        self.window = Some((from.0, to.0, start));
        Ok(())
    }

    /// A day of the week, then perhaps `to`/`through` another (a range).
    fn read_days(&mut self, first: u32, start: usize) -> Result<(), Unreadable> {
        if matches!(self.peek(0), Some("to" | "through" | "thru" | "until" | "till"))
            && let Some(last) = self.peek(1).and_then(day_of_week)
        {
            self.next += 2;
            if last < first {
                return Err(self.refuse(start, self.next, "a range of days goes from sunday towards saturday"));
            }
            self.days_of_week.extend(first..=last);
        } else {
            self.days_of_week.insert(first);
        }
        Ok(())
    }

    /// The five-field expression of what was read.
    fn cron(self) -> Result<String, Unreadable> {
        let all = self.words.len();
        if let (Some(&(_, _, at)), Some((_, _, interval_at))) = (self.times.first(), self.interval) {
            return Err(self.refuse(at.min(interval_at), all, "say times of day or an interval, not both"));
        }
        let days_of_week = if self.days_of_week.is_empty() || self.days_of_week.len() == 7 {
            "*".to_owned()
        } else {
            ranges(&self.days_of_week)
        };
        let mut days_of_month = ranges(&self.days_of_month);
        if days_of_month.is_empty() {
            days_of_month = if self.monthly { "1" } else { "*" }.to_owned();
        }
        if let Some((_, _, at)) = self.window
            && self.interval.is_none()
        {
            return Err(self.refuse(at, all, "hours from..to go with an interval (every 30 minutes from 9am to 5pm)"));
        }
        let (minute, hour) = match self.interval {
            Some((count, Unit::Minute, _)) => {
                let minute = if count == 1 { "*".to_owned() } else { format!("*/{count}") };
                let hour = self.window.map_or("*".to_owned(), |(from, to, _)| range(from, to - 1));
                (minute, hour)
            }
            Some((count, Unit::Hour, _)) => {
                let every = if count == 1 { String::new() } else { format!("/{count}") };
                let hour = match self.window {
                    Some((from, to, _)) => format!("{from}-{to}{every}"),
                    None if count == 1 => "*".to_owned(),
                    None => format!("*{every}"),
                };
                ("0".to_owned(), hour)
            }
            None => {
                let Some(&(_, minute, _)) = self.times.first() else {
                    return Err(Unreadable {
                        phrase: String::new(),
                        line: 0,
                        column: 0,
                        reason: "it says which days but not when: add a time (9am) or an interval \
                                 (every 30 minutes)"
                            .to_owned(),
                    });
                };
                if let Some(&(_, _, at)) = self.times.iter().find(|time| time.1 != minute) {
                    return Err(self.refuse(
                        at,
                        at + 1,
                        "one cron expression fires at one minute of the hour: give every time the same minutes",
                    ));
                }
                let hours: BTreeSet<u32> = self.times.iter().map(|time| time.0).collect();
                (minute.to_string(), hours.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
            }
        };
        Ok(format!("{minute} {hour} {days_of_month} * {days_of_week}"))
    }
}

fn range(from: u32, to: u32) -> String {
    if from == to { from.to_string() } else { format!("{from}-{to}") }
}

/// A set of numbers as cron writes it: runs of three or more as ranges.
fn ranges(numbers: &BTreeSet<u32>) -> String {
    let sorted: Vec<u32> = numbers.iter().copied().collect();
    let mut parts = Vec::new();
    let mut index = 0;
    while index < sorted.len() {
        let mut end = index;
        while end + 1 < sorted.len() && sorted[end + 1] == sorted[end] + 1 {
            end += 1;
        }
        if end >= index + 2 {
            parts.push(range(sorted[index], sorted[end]));
        } else {
            parts.extend(sorted[index..=end].iter().map(u32::to_string));
        }
        index = end + 1;
    }
    parts.join(",")
}
