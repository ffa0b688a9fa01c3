//! A small `strftime` for the `strftime_now(format)` function of chat templates (Llama 3.x
//! prints "Today Date: 26 Jul 2024" with `strftime_now("%d %b %Y")`).
//!
//! Time is UTC (a server's local time zone is rarely what a prompt wants, and UTC keeps
//! renders reproducible across machines). Supported: `%Y %y %m %d %e %j %H %I %M %S %p %a %A
//! %b %B %h %F %T %D %R %%`; any other `%x` is copied through unchanged, as glibc does.

/// Formats `secs` (seconds since 1970-01-01T00:00:00Z, may be negative) with `format`.
pub fn strftime(format: &str, secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400); // seconds of the day
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (sod / 3600, sod % 3600 / 60, sod % 60);
    let weekday = (days + 4).rem_euclid(7) as usize; // 1970-01-01 was a Thursday; 0 = Sunday
    let yday = days - days_from_civil(year, 1, 1) + 1;

    const DAYS: [&str; 7] = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month_name = MONTHS[(month - 1) as usize];
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(spec) = chars.next() else {
            out.push('%');
            break;
        };
        let piece = match spec {
            'Y' => year.to_string(),
            'y' => format!("{:02}", year.rem_euclid(100)),
            'm' => format!("{month:02}"),
            'd' => format!("{day:02}"),
            'e' => format!("{day:2}"),
            'j' => format!("{yday:03}"),
            'H' => format!("{hour:02}"),
            'I' => format!("{hour12:02}"),
            'M' => format!("{minute:02}"),
            'S' => format!("{second:02}"),
            'p' => (if hour < 12 { "AM" } else { "PM" }).to_owned(),
            'a' => DAYS[weekday][..3].to_owned(),
            'A' => DAYS[weekday].to_owned(),
            'b' | 'h' => month_name[..3].to_owned(),
            'B' => month_name.to_owned(),
            'F' => format!("{year}-{month:02}-{day:02}"),
            'T' => format!("{hour:02}:{minute:02}:{second:02}"),
            'R' => format!("{hour:02}:{minute:02}"),
            'D' => format!("{month:02}/{day:02}/{:02}", year.rem_euclid(100)),
            '%' => "%".to_owned(),
            other => format!("%{other}"),
        };
        out.push_str(&piece);
    }
    out
}

/// Seconds since the Unix epoch now (0 if the clock is before 1970).
pub fn now_secs() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// (year, month 1..=12, day 1..=31) of a day count since 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March-based
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Day count since 1970-01-01 of a civil date (inverse of `civil_from_days`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        // 2024-07-26T13:05:09Z, a Friday, day 208 of a leap year.
        let t = 1_721_999_109;
        assert_eq!(strftime("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(strftime("%A %B %e %j", t), "Friday July 26 208");
        assert_eq!(strftime("%F %T %I%p %y %%%q", t), "2024-07-26 13:05:09 01PM 24 %%q");
        assert_eq!(strftime("%F %a", 0), "1970-01-01 Thu");
        assert_eq!(strftime("%F %T", -1), "1969-12-31 23:59:59");
        assert_eq!(strftime("%F", 951_782_400), "2000-02-29");
    }

    #[test]
    fn civil_round_trip() {
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert!((1..=12).contains(&m) && (1..=31).contains(&d));
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }
}
