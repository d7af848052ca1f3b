//! window: the default policy's drain, but a maintenance starts only inside
//! a weekly maintenance window.
//!
//! The window opens at `start` on each of `days` and closes at `end` (the
//! same day, or the next when `end` is not after `start`: `22:00`-`06:00`
//! runs overnight), in the time zone `utc-offset` names (`+02:00`, `-05:00`,
//! `UTC`). A NodeMaintenance can name its own zone with the annotation
//! `nmo.medik8s.io/utc-offset` (a node in another region), and an emergency
//! can skip the window with `nmo.medik8s.io/ignore-window: "true"`. Outside
//! the window the maintenance waits, touching nothing, and is asked again
//! when the window opens. A maintenance that started inside the window is
//! not stopped when it closes.
//!
//! Offsets are fixed: a zone with daylight saving time needs its offset
//! changed twice a year (a policy carries no time zone database).
//!
//! Settings (`policies.yaml`): `days` (`Sat,Sun`, `Mon-Fri`; default every
//! day), `start` and `end` (`HH:MM`, required), `utc-offset` (default UTC).

use nmo_policy_sdk::*;

/// The maintenance annotation that names its time zone.
pub const OFFSET_ANNOTATION: &str = "nmo.medik8s.io/utc-offset";
/// The maintenance annotation that skips the window.
pub const IGNORE_ANNOTATION: &str = "nmo.medik8s.io/ignore-window";

const DAY_NAMES: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
const MINUTE_MS: i64 = 60_000;
const DAY_MIN: i64 = 24 * 60;

struct Window;

/// A weekly window: days (0 = Sunday), start and end in minutes of the
/// day, and the zone's offset in minutes east of UTC.
#[derive(Debug, Clone, PartialEq)]
pub struct Rules {
    pub days: [bool; 7],
    pub start: i64,
    pub end: i64,
    pub offset: i64,
}

fn day(name: &str) -> Result<usize, String> {
    DAY_NAMES
        .iter()
        .position(|d| d.eq_ignore_ascii_case(name.trim().get(..3).unwrap_or("")))
        .filter(|_| name.trim().len() >= 3)
        .ok_or_else(|| format!("setting days: {name:?} is not a day (Mon, Tue, ... Sun)"))
}

/// `Sat,Sun`, `Mon-Fri`, `Fri-Mon` (wrapping), or empty for every day.
pub fn parse_days(text: &str) -> Result<[bool; 7], String> {
    let mut days = [false; 7];
    if text.trim().is_empty() {
        return Ok([true; 7]);
    }
    for part in text.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (day(a)?, day(b)?);
                let mut d = a;
                loop {
                    days[d] = true;
                    if d == b {
                        break;
                    }
                    d = (d + 1) % 7;
                }
            }
            None => days[day(part)?] = true,
        }
    }
    Ok(days)
}

/// `HH:MM` in minutes; `24:00` is the end of the day.
pub fn parse_time(key: &str, text: &str) -> Result<i64, String> {
    let bad = || format!("setting {key}: {text:?} is not a time of day (HH:MM, e.g. 22:00)");
    let (h, m) = text.trim().split_once(':').ok_or_else(bad)?;
    let (h, m): (i64, i64) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if !(0..=24).contains(&h) || !(0..60).contains(&m) || (h == 24 && m != 0) {
        return Err(bad());
    }
    Ok(h * 60 + m)
}

/// `+02:00`, `-05:30`, `UTC` or `Z`, in minutes east of UTC.
pub fn parse_offset(text: &str) -> Result<i64, String> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("utc") || t == "Z" {
        return Ok(0);
    }
    let bad = || format!("utc-offset: {text:?} is not an offset (+02:00, -05:00, UTC)");
    let sign = match t.chars().next() {
        Some('+') => 1,
        Some('-') => -1,
        _ => return Err(bad()),
    };
    let minutes = parse_time("utc-offset", &t[1..]).map_err(|_| bad())?;
    if minutes > 14 * 60 {
        return Err(bad());
    }
    Ok(sign * minutes)
}

fn show_offset(offset: i64) -> String {
    if offset == 0 {
        return "UTC".into();
    }
    let sign = if offset < 0 { '-' } else { '+' };
    format!("UTC{sign}{:02}:{:02}", offset.abs() / 60, offset.abs() % 60)
}

fn show_time(minutes: i64) -> String {
    format!("{:02}:{:02}", minutes / 60, minutes % 60)
}

impl Rules {
    pub fn from_settings(s: &Settings) -> Result<Rules, String> {
        let required = |key: &str| {
            s.get(key)
                .ok_or_else(|| format!("setting {key} is required (HH:MM, e.g. 22:00)"))
        };
        Ok(Rules {
            days: parse_days(s.get("days").unwrap_or(""))?,
            start: parse_time("start", required("start")?)?,
            end: parse_time("end", required("end")?)?,
            offset: parse_offset(s.get("utc-offset").unwrap_or("UTC"))
                .map_err(|e| format!("setting {e}"))?,
        })
    }

    fn length(&self) -> i64 {
        if self.end > self.start {
            self.end - self.start
        } else {
            self.end + DAY_MIN - self.start
        }
    }

    /// Whether local minute `t` (minutes since the epoch, local time) is
    /// inside a window; else the local minute the next one opens.
    pub fn check(&self, t: i64) -> Result<(), i64> {
        let today = t.div_euclid(DAY_MIN);
        for d in [today - 1, today] {
            let weekday = (d + 4).rem_euclid(7) as usize;
            let open = d * DAY_MIN + self.start;
            if self.days[weekday] && t >= open && t < open + self.length() {
                return Ok(());
            }
        }
        (0..=7)
            .map(|i| today + i)
            .filter(|d| self.days[(d + 4).rem_euclid(7) as usize])
            .map(|d| d * DAY_MIN + self.start)
            .find(|open| *open > t)
            .map_or(Err(t + 7 * DAY_MIN), Err)
    }

    fn describe(&self) -> String {
        let days: Vec<&str> = (0..7)
            .filter(|d| self.days[*d])
            .map(|d| DAY_NAMES[d])
            .collect();
        let days = if days.len() == 7 {
            "daily".to_owned()
        } else {
            days.join(",")
        };
        format!(
            "{days} {}-{} {}",
            show_time(self.start),
            show_time(self.end),
            show_offset(self.offset)
        )
    }
}

/// The answer at `now_ms` for a maintenance whose zone is `offset`.
pub fn admit_at(rules: &Rules, now_ms: u64) -> Admission {
    let t = (now_ms as i64).div_euclid(MINUTE_MS) + rules.offset;
    match rules.check(t) {
        Ok(()) => Admission::Admit,
        Err(opens) => {
            let wait_ms = ((opens - t) * MINUTE_MS - (now_ms as i64).rem_euclid(MINUTE_MS)).max(1);
            let weekday = DAY_NAMES[(opens.div_euclid(DAY_MIN) + 4).rem_euclid(7) as usize];
            // No countdown in the text: it stays the same for the whole
            // wait, so the wait is one event and one status write, not
            // one a minute.
            Admission::wait(
                format!(
                    "outside the maintenance window ({}); it opens {weekday} {}",
                    rules.describe(),
                    show_time(opens.rem_euclid(DAY_MIN)),
                ),
                Some((wait_ms as u64).min(24 * 3_600_000)),
            )
        }
    }
}

impl Policy for Window {
    // The drain and the failures: the default policy's (the trait's
    // defaults).

    fn admit(m: Maintenance, node: Node, fleet: Fleet) -> Admission {
        defaults::admit_with(&m, &node, &fleet, || in_window(&m))
    }

    fn validate_settings(settings: Settings) -> Result<(), String> {
        settings.allow_only(&["days", "start", "end", "utc-offset"])?;
        let rules = Rules::from_settings(&settings)?;
        if rules.start == rules.end {
            return Err("settings start and end are equal: the window would never open".into());
        }
        Ok(())
    }
}

/// Admit inside the window (the maintenance's zone, or the settings'), or
/// when the maintenance skips it.
fn in_window(m: &Maintenance) -> Admission {
    if m.annotation(IGNORE_ANNOTATION) == Some("true") {
        log(
            Level::Info,
            "the maintenance skips the window (ignore-window)",
        );
        return Admission::Admit;
    }
    let Ok(mut rules) = Rules::from_settings(&Settings::current()) else {
        return Admission::Deny("window: the policy's settings cannot be read".into());
    };
    if let Some(zone) = m.annotation(OFFSET_ANNOTATION) {
        match parse_offset(zone) {
            Ok(offset) => rules.offset = offset,
            Err(e) => return Admission::Deny(format!("annotation {OFFSET_ANNOTATION}: {e}")),
        }
    }
    admit_at(&rules, m.now_ms)
}

export_policy!(Window);

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(days: &str, start: &str, end: &str, offset: &str) -> Rules {
        Rules {
            days: parse_days(days).unwrap(),
            start: parse_time("start", start).unwrap(),
            end: parse_time("end", end).unwrap(),
            offset: parse_offset(offset).unwrap(),
        }
    }

    // 2026-01-05T10:00:00Z is a Monday.
    const MONDAY_10_UTC: u64 = 1_767_607_200_000;
    const HOUR: u64 = 3_600_000;

    #[test]
    fn inside_and_outside_an_overnight_window_in_another_zone() {
        let r = rules("Mon-Fri", "22:00", "06:00", "+02:00");
        // Monday 10:00 UTC is 12:00 local: closed until 22:00 local (10 h).
        match admit_at(&r, MONDAY_10_UTC) {
            Admission::Wait(w) => {
                assert_eq!(w.recheck_after_ms, Some(10 * HOUR));
                assert!(w.reason.contains("opens Mon 22:00"), "{}", w.reason);
            }
            other => panic!("{other:?}"),
        }
        // Monday 21:00 UTC is 23:00 local: open; Tuesday 03:30 UTC too.
        assert!(matches!(
            admit_at(&r, MONDAY_10_UTC + 11 * HOUR),
            Admission::Admit
        ));
        assert!(matches!(
            admit_at(&r, MONDAY_10_UTC + 17 * HOUR + HOUR / 2),
            Admission::Admit
        ));
        // Saturday 00:00 local (Friday's window, until 06:00): open.
        assert!(matches!(
            admit_at(&r, MONDAY_10_UTC + 4 * 24 * HOUR + 12 * HOUR),
            Admission::Admit
        ));
        // Saturday 12:00 local: closed until Monday 22:00.
        match admit_at(&r, MONDAY_10_UTC + 5 * 24 * HOUR) {
            Admission::Wait(w) => assert!(w.reason.contains("opens Mon 22:00"), "{}", w.reason),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_settings_say_what_is_wrong() {
        assert!(parse_days("Mon-Fri").unwrap()[1..=5].iter().all(|d| *d));
        assert_eq!(
            parse_days("Fri-Mon").unwrap(),
            [true, true, false, false, false, true, true]
        );
        for bad in ["Funday", "M"] {
            assert!(parse_days(bad).is_err(), "{bad}");
        }
        for bad in ["25:00", "12", "12:60", "noon"] {
            assert!(parse_time("start", bad).is_err(), "{bad}");
        }
        for bad in ["+15:00", "CET", "2"] {
            assert!(parse_offset(bad).is_err(), "{bad}");
        }
    }
}
