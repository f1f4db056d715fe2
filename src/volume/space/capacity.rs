//! Choosing a volume's size from a CSI CapacityRange.

use crate::error::{Error, Result};

/// Size of a volume when the request names none (like an emptyDir without sizeLimit, but a
/// block file needs some size).
pub const DEFAULT_CAPACITY: i64 = 1 << 30;

/// Sizes are whole 4 KiB pages: loop devices need 512-byte multiples and filesystems allocate pages.
pub const ALIGNMENT: i64 = 4096;

/// The capacity for `required`/`limit` bytes (0 = unset), per the CSI rules:
/// negative → INVALID_ARGUMENT, nothing satisfiable → OUT_OF_RANGE.
pub fn choose(required: i64, limit: i64) -> Result<i64> {
    if required < 0 || limit < 0 {
        return Err(Error::InvalidArgument(format!(
            "capacity_range must not be negative (required_bytes {required}, limit_bytes {limit})"
        )));
    }
    if limit > 0 && required > limit {
        return Err(Error::OutOfRange(format!(
            "required_bytes {required} exceeds limit_bytes {limit}"
        )));
    }
    let wanted = match (required, limit) {
        (0, 0) => DEFAULT_CAPACITY,
        (0, limit) => DEFAULT_CAPACITY.min(limit),
        (required, _) => required,
    };
    let mut capacity = round_up(wanted)
        .ok_or_else(|| Error::OutOfRange(format!("required_bytes {required} is too large")))?;
    if limit > 0 && capacity > limit {
        capacity = limit - limit % ALIGNMENT;
    }
    if capacity < required || capacity == 0 {
        return Err(Error::OutOfRange(format!(
            "no multiple of {ALIGNMENT} bytes lies between required_bytes {required} and limit_bytes {limit}"
        )));
    }
    Ok(capacity)
}

/// `capacity` raised to `minimum` (what a filesystem `what` needs at least), unless that
/// passes `limit` (0 = unset): then OUT_OF_RANGE.
pub fn at_least(capacity: i64, minimum: i64, limit: i64, what: &str) -> Result<i64> {
    if capacity >= minimum {
        return Ok(capacity);
    }
    if limit > 0 && limit < minimum {
        return Err(Error::OutOfRange(format!(
            "a {what} filesystem needs at least {minimum} bytes, more than limit_bytes {limit}"
        )));
    }
    Ok(minimum)
}

/// Whether an existing volume of `capacity` satisfies a new range (idempotent CreateVolume).
pub fn satisfies(capacity: i64, required: i64, limit: i64) -> bool {
    capacity >= required && (limit == 0 || capacity <= limit)
}

fn round_up(bytes: i64) -> Option<i64> {
    bytes.checked_add(ALIGNMENT - 1).map(|b| b - b % ALIGNMENT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tonic::Code;

    #[test]
    fn follows_the_csi_rules() {
        assert_eq!(choose(0, 0).unwrap(), DEFAULT_CAPACITY);
        assert_eq!(choose(0, 8192).unwrap(), 8192);
        assert_eq!(choose(1, 0).unwrap(), 4096);
        assert_eq!(choose(4097, 0).unwrap(), 8192);
        assert_eq!(choose(4097, 6000).unwrap_err().code(), Code::OutOfRange);
        assert_eq!(choose(4096, 6000).unwrap(), 4096);
        assert_eq!(choose(10, 5).unwrap_err().code(), Code::OutOfRange);
        assert_eq!(choose(-1, 0).unwrap_err().code(), Code::InvalidArgument);
        assert_eq!(choose(i64::MAX, 0).unwrap_err().code(), Code::OutOfRange);
        assert_eq!(choose(0, 100).unwrap_err().code(), Code::OutOfRange);
    }

    proptest! {
        #[test]
        fn chosen_capacity_is_aligned_and_within_range(required in 0i64..1 << 40, limit in 0i64..1 << 40) {
            if let Ok(capacity) = choose(required, limit) {
                prop_assert_eq!(capacity % ALIGNMENT, 0);
                prop_assert!(satisfies(capacity, required, limit));
            }
        }
    }
}
