//! Time units of `rate_limit.unit`, and their window lengths.

use std::fmt;
use std::str::FromStr;

use crate::algorithm::{Micros, SECOND};

/// The unit of a rate limit; windows are aligned to the Unix epoch, UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unit {
    /// 1 second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3,600 seconds.
    Hour,
    /// 86,400 seconds.
    Day,
    /// 604,800 seconds.
    Week,
    /// 30 days, as the reference service counts a month.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// Length of the unit in seconds.
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }

    /// Length of the unit in microseconds.
    pub fn window(self) -> Micros {
        self.seconds() * SECOND
    }

    /// The upper-case name used by the proto enum (`SECOND`, `MINUTE`, ...).
    pub fn proto_name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }
}

impl FromStr for Unit {
    type Err = ();

    /// Parses a unit case-insensitively, as the reference service does.
    fn from_str(s: &str) -> Result<Self, ()> {
        Unit::ALL
            .into_iter()
            .find(|u| u.proto_name().eq_ignore_ascii_case(s))
            .ok_or(())
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.proto_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_parse_case_insensitively() {
        assert_eq!("minute".parse(), Ok(Unit::Minute));
        assert_eq!("HoUr".parse(), Ok(Unit::Hour));
        assert_eq!("unknown".parse::<Unit>(), Err(()));
        assert_eq!("".parse::<Unit>(), Err(()));
    }

    #[test]
    fn month_is_thirty_days_and_year_365() {
        assert_eq!(Unit::Month.seconds(), 30 * 86_400);
        assert_eq!(Unit::Year.seconds(), 365 * 86_400);
    }
}
