//! Schedules as people write them: the phrases read into cron, and the
//! ones refused, naming the phrase and where it is.

use crate::{RoleSchedule, Schedule, Unreadable, role_schedule};

/// The cron expression `text` reads as (checked by the cron parser too).
fn cron(text: &str) -> String {
    let schedule = role_schedule(text).unwrap_or_else(|unreadable| panic!("{text:?}: {unreadable:?}")).unwrap();
    Schedule::parse(&schedule.cron, &schedule.time_zone).unwrap_or_else(|reason| panic!("{text:?}: {reason}"));
    schedule.cron
}

/// Why `text` cannot be read: (phrase, line, column, reason).
fn refused(text: &str) -> (String, usize, usize, String) {
    let Unreadable { phrase, line, column, reason } = role_schedule(text).expect_err(text);
    (phrase, line, column, reason)
}

#[test]
fn the_design_documents_phrases() {
    assert_eq!(cron("9am and 5pm, weekdays"), "0 9,17 * * 1-5");
    assert_eq!(cron("every 30 minutes"), "*/30 * * * *");
    assert_eq!(cron("Every 30 Minutes."), "*/30 * * * *");
}

#[test]
fn times_of_day() {
    assert_eq!(cron("9am"), "0 9 * * *");
    assert_eq!(cron("at 9:30 pm"), "30 21 * * *");
    assert_eq!(cron("9 am and 5 pm"), "0 9,17 * * *");
    assert_eq!(cron("9am, 1pm and 5pm"), "0 9,13,17 * * *");
    assert_eq!(cron("17:00"), "0 17 * * *");
    assert_eq!(cron("at 08:15"), "15 8 * * *");
    assert_eq!(cron("daily at noon"), "0 12 * * *");
    assert_eq!(cron("every day at midnight"), "0 0 * * *");
    assert_eq!(cron("12am"), "0 0 * * *");
    assert_eq!(cron("12pm"), "0 12 * * *");
}

#[test]
fn days() {
    assert_eq!(cron("weekdays at 9am"), "0 9 * * 1-5");
    assert_eq!(cron("9am on weekends"), "0 9 * * 0,6");
    assert_eq!(cron("every monday at 9am"), "0 9 * * 1");
    assert_eq!(cron("mondays and thursdays at 8:30am"), "30 8 * * 1,4");
    assert_eq!(cron("Monday to Friday, 6pm"), "0 18 * * 1-5");
    assert_eq!(cron("mon-wed 7am"), "0 7 * * 1-3");
    assert_eq!(cron("tuesday through thursday at 10am"), "0 10 * * 2-4");
    assert_eq!(cron("every weekday at 9am"), "0 9 * * 1-5");
    assert_eq!(cron("at midnight on the 1st and 15th"), "0 0 1,15 * *");
    assert_eq!(cron("monthly at 9am"), "0 9 1 * *");
    assert_eq!(cron("on the 1st of the month at 9am"), "0 9 1 * *");
    assert_eq!(cron("sundays, noon"), "0 12 * * 0");
}

#[test]
fn intervals() {
    assert_eq!(cron("every minute"), "* * * * *");
    assert_eq!(cron("every 15 minutes on weekdays"), "*/15 * * * 1-5");
    assert_eq!(cron("hourly"), "0 * * * *");
    assert_eq!(cron("every hour"), "0 * * * *");
    assert_eq!(cron("every 2 hours"), "0 */2 * * *");
    assert_eq!(cron("every 30 minutes from 9am to 5pm, weekdays"), "*/30 9-16 * * 1-5");
    assert_eq!(cron("every hour between 9am and 5pm"), "0 9-17 * * *");
    assert_eq!(cron("every 2 hours from 8am to 6pm"), "0 8-18/2 * * *");
}

#[test]
fn cron_and_time_zones_as_written() {
    let paris = role_schedule("9am and 5pm, weekdays\ntime_zone: Europe/Paris").unwrap().unwrap();
    assert_eq!(paris, RoleSchedule { cron: "0 9,17 * * 1-5".into(), time_zone: "Europe/Paris".into() });
    assert_eq!(role_schedule("Time zone: America/New_York\nhourly").unwrap().unwrap().time_zone, "America/New_York");
    assert_eq!(cron("*/30 * * * *"), "*/30 * * * *");
    assert_eq!(cron("@daily"), "@daily");
    assert_eq!(cron("9am and 5pm: `0 9,17 * * 1-5`"), "0 9,17 * * 1-5");
    assert_eq!(role_schedule("  \n"), Ok(None));
}

#[test]
fn refusals_name_the_phrase_and_where_it_is() {
    assert_eq!(refused("9am and 5pm, weekdys").0, "weekdys");
    let (_, line, column, _) = refused("9am and 5pm, weekdys");
    assert_eq!((line, column), (0, 13));
    let (phrase, line, column, reason) = refused("time_zone: Europe/Paris\n  twice a day");
    assert_eq!((phrase.as_str(), line, column), ("twice", 1, 2));
    assert!(reason.contains("not a time"), "{reason}");
    assert_eq!(refused("every 45 minutes").0, "every 45 minutes");
    assert!(refused("every 45 minutes").3.contains("divide the hour"));
    assert!(refused("every 5 hours").3.contains("divide the day"));
    assert_eq!(refused("every other day").0, "every other day");
    assert_eq!(refused("every 2 days").0, "every 2 days");
    let (phrase, _, _, reason) = refused("9am and 5:30pm");
    assert_eq!(phrase, "5:30pm");
    assert!(reason.contains("same minutes"), "{reason}");
    assert_eq!(refused("13pm").3, "13 is not an hour of a 12-hour clock");
    assert_eq!(refused("25:00").0, "25:00");
    let (phrase, _, _, reason) = refused("every monday");
    assert_eq!(phrase, "every monday");
    assert!(reason.contains("not when"), "{reason}");
    assert!(refused("9am every 30 minutes").3.contains("not both"));
    assert!(refused("from 9am to 5pm").3.contains("with an interval"));
    assert!(refused("every 30 minutes from 5pm to 9am").3.contains("later one"));
    assert!(refused("friday to monday at 9am").3.contains("towards saturday"));
    // Words a looser reader would pick out of others: refused, not misread.
    assert_eq!(refused("9am on weekdays except holidays").0, "except");
    assert_eq!(refused("at 9").0, "9");
}
